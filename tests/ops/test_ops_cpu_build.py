"""The build of the package's C++ CPU kernels (``ops/cpu/build.py``) and ``llamafactory-zebra build-kernels``:
announced before it starts, done once across processes that start together, and a build killed half-way
neither leaves the next process waiting nor loading a broken library.

The fast tests stand a recorder in for PyTorch's ``load``; the slow ones compile for real in a build
directory of their own (``TORCH_EXTENSIONS_DIR``): a one-function extension for the kill-and-restart run,
and the package's own build, stopped once it has announced itself and started compiling.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.utils.cpp_extension

from llamafactory_zebra.cli.main import main
from llamafactory_zebra.kernels.stack import FAKE_STACK_ENV_VAR
from llamafactory_zebra.kernels.switches import CPU_KERNELS_ENV_VAR
from llamafactory_zebra.ops.cpu import build

WHAT = "the test kernel"
TINY_SOURCE = """#include <torch/extension.h>
int answer() { return 42; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("answer", &answer); }
"""


@pytest.fixture
def extensions_dir(tmp_path, monkeypatch):
    """A build root of the test's own, so nothing here touches the extension cache the other tests load."""
    root = tmp_path / "torch_extensions"
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(root))
    return root


class RecordingLoad:
    """Stands in for ``torch.utils.cpp_extension.load``: notes the log lines and files present at the call."""

    def __init__(self, caplog, fail: bool = False):
        self.caplog, self.fail, self.calls = caplog, fail, []

    def __call__(self, **kwargs):
        directory = Path(kwargs["build_directory"])
        self.calls.append({"messages": [r.getMessage() for r in self.caplog.records], "baton": (directory / "lock")})
        self.calls[-1]["baton_present"] = self.calls[-1]["baton"].exists()
        if self.fail:
            raise RuntimeError("Error building extension: c++: not found")
        return "the module"


def _load(caplog, monkeypatch, fail=False):
    recorder = RecordingLoad(caplog, fail)
    monkeypatch.setattr(torch.utils.cpp_extension, "load", recorder)
    return recorder


def test_the_notice_comes_before_the_build_and_a_line_after_it(extensions_dir, caplog, monkeypatch):
    recorder = _load(caplog, monkeypatch)
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        assert build.load_extension("zebra_test_notice", [Path("tiny.cpp")], ["-O0"], WHAT) == "the module"
    (notice,) = recorder.calls[0]["messages"]  # logged before ``load`` ran, and only it
    assert notice.startswith(f"llamafactory-zebra: building {WHAT} for this CPU into {extensions_dir}")
    for part in ("CPU inference faster", "once per install", "a few minutes", "llamafactory-zebra build-kernels"):
        assert part in notice
    assert f"{CPU_KERNELS_ENV_VAR}=torch skips it" in notice
    # Warnings: what Python's last-resort handler prints when the command configured no logging.
    assert all(record.levelno == logging.WARNING for record in caplog.records)
    assert caplog.records[-1].getMessage().startswith(f"llamafactory-zebra: built {WHAT} in ")
    assert build.is_built(extensions_dir / "zebra_test_notice")

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        build.load_extension("zebra_test_notice", [Path("tiny.cpp")], ["-O0"], WHAT)
    assert len(recorder.calls) == 2 and not caplog.records  # built before: loaded without a word


def test_a_failed_build_leaves_no_mark_so_the_next_try_announces_again(extensions_dir, caplog, monkeypatch):
    _load(caplog, monkeypatch, fail=True)
    with pytest.raises(RuntimeError, match="c\\+\\+: not found"):
        build.load_extension("zebra_test_failed", [Path("tiny.cpp")], [], WHAT)
    assert not build.is_built(extensions_dir / "zebra_test_failed")
    recorder = _load(caplog, monkeypatch)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        build.load_extension("zebra_test_failed", [Path("tiny.cpp")], [], WHAT)
    assert recorder.calls[0]["messages"][0].startswith(f"llamafactory-zebra: building {WHAT}")


def test_a_baton_left_by_a_killed_build_is_removed_before_loading(extensions_dir, caplog, monkeypatch):
    # torch before 2.14 waits while the file ``lock`` exists; a builder killed mid-build never removes it.
    directory = build.build_directory("zebra_test_baton")
    (directory / "lock").touch()
    recorder = _load(caplog, monkeypatch)
    build.load_extension("zebra_test_baton", [Path("tiny.cpp")], [], WHAT)
    assert recorder.calls[0]["baton_present"] is False


def test_a_second_process_says_it_waits_for_the_first_ones_build(extensions_dir, caplog, monkeypatch):
    directory = build.build_directory("zebra_test_wait")
    recorder = _load(caplog, monkeypatch)
    with open(directory / build.OUR_LOCK, "a") as holder:  # another open file: flock treats it as another process
        fcntl.flock(holder, fcntl.LOCK_EX)
        with caplog.at_level(logging.WARNING, logger=build.__name__):
            waiter = threading.Thread(
                target=build.load_extension, args=("zebra_test_wait", [Path("tiny.cpp")], [], WHAT)
            )
            waiter.start()
            deadline = time.monotonic() + 30
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not recorder.calls  # still waiting for the lock
            fcntl.flock(holder, fcntl.LOCK_UN)
            waiter.join(timeout=30)
    assert not waiter.is_alive() and len(recorder.calls) == 1
    assert caplog.records[0].getMessage() == (
        f"llamafactory-zebra: another process is building {WHAT} in {directory}; waiting for it to finish, then "
        "loading its build."
    )


def test_build_kernels_loads_the_kernels_and_says_whether_it_built_them(capsys):
    built_before = build.is_built(build.package_build_directory())
    assert main(["build-kernels"]) == 0
    said = capsys.readouterr().out
    state = "already built" if built_before else "now built"
    assert f"llamafactory-zebra build-kernels: {build.WHAT} {state} and loaded" in said


def test_build_kernels_says_why_this_machine_cannot_build_them(monkeypatch, capsys):
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, '{"device": "cpu", "versions": {"torch": "2.14.1"}}')  # no compiler
    assert main(["build-kernels"]) == 1
    assert "cannot build the package's C++ CPU kernels" in capsys.readouterr().out
    monkeypatch.setenv(FAKE_STACK_ENV_VAR, '{"device": "cpu", "compiler": "c++", "platform": "darwin"}')
    assert main(["build-kernels"]) == 1
    assert "not Linux (darwin)" in capsys.readouterr().out


def _start(code: str, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A Python process in a session of its own (so the test can kill it and the compilers it started)."""
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def _wait_for(condition, what: str, process: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the process ended before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{log.read_text()}"
        time.sleep(0.1)


def _kill_session(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.slow
def test_a_killed_build_neither_hangs_nor_poisons_the_next_and_two_processes_build_once(tmp_path):
    source = tmp_path / "tiny.cpp"
    source.write_text(TINY_SOURCE)
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), "OMP_NUM_THREADS": "1"}
    code = (
        "from llamafactory_zebra.ops.cpu.build import load_extension\n"
        f"module = load_extension('zebra_test_kill', [{str(source)!r}], ['-O0'], {WHAT!r})\n"
        "print('answer', module.answer())\n"
    )
    directory = tmp_path / "torch_extensions" / "zebra_test_kill"

    first = _start(code, tmp_path / "first.log", env)
    try:
        # Killed once it compiles: torch writes build.ninja just before it runs ninja.
        _wait_for(lambda: (directory / "build.ninja").exists(), "build.ninja", first, tmp_path / "first.log")
        time.sleep(1)
    finally:
        _kill_session(first)
    assert f"llamafactory-zebra: building {WHAT}" in (tmp_path / "first.log").read_text()
    assert not (directory / "zebra_test_kill.so").exists() and not build.is_built(directory)
    (directory / "lock").touch()  # the baton torch before 2.14 leaves behind a killed build

    logs = [tmp_path / "second.log", tmp_path / "third.log"]
    together = [_start(code, log, env) for log in logs]
    try:
        for process, log in zip(together, logs, strict=True):
            try:
                process.wait(timeout=600)
            except subprocess.TimeoutExpired:
                pytest.fail(f"a process after the killed build still runs after 600 s:\n{log.read_text()}")
    finally:
        for process in together:
            if process.poll() is None:
                _kill_session(process)
    outputs = [log.read_text() for log in logs]
    assert [process.returncode for process in together] == [0, 0], outputs
    assert all("answer 42" in output for output in outputs), outputs
    assert sum(f"llamafactory-zebra: building {WHAT}" in output for output in outputs) == 1, outputs  # one built
    assert build.is_built(directory)


@pytest.mark.slow
def test_the_package_build_announces_itself_before_it_compiles(tmp_path):
    # The package's own build in a fresh build root, stopped once it compiles (a whole build takes minutes).
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "torch_extensions"), "OMP_NUM_THREADS": "1"}
    env.pop(CPU_KERNELS_ENV_VAR, None)
    log = tmp_path / "build.log"
    process = _start("from llamafactory_zebra.cli.main import main; main(['build-kernels'])", log, env)
    try:
        _wait_for(
            lambda: any((tmp_path / "torch_extensions").glob("zebra_cpu_kernels_*/build.ninja")),
            "build.ninja", process, log,
        )  # fmt: skip
        announced = log.read_text()
    finally:
        _kill_session(process)
    assert f"llamafactory-zebra: building {build.WHAT} for this CPU into {tmp_path / 'torch_extensions'}" in announced
