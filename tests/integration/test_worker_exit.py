"""A torchrun worker ends with exit 0 and no interpreter teardown once ``run_exp`` returned; a failing run
and a run outside torchrun keep Python's own exit (``integration/worker_exit.py``)."""

import os
import subprocess
import sys
import textwrap

import pytest

from llamafactory_zebra.integration import worker_exit
from llamafactory_zebra.seam import is_wrapped

# A stand-in for llamafactory.train.tuner, wrapped by the real seam handler. Its atexit line is what
# interpreter teardown would run; "after" is what the entry point would do next.
SCRIPT = textwrap.dedent(
    """
    import atexit, sys, types
    from llamafactory_zebra.integration import worker_exit
    from llamafactory_zebra.seam import install

    tuner = types.ModuleType("llamafactory.train.tuner")

    def run_exp(args=None, callbacks=None):
        print("trained", flush=True)
        atexit.register(lambda: print("teardown ran", flush=True))
        print("unflushed line")  # the worker must flush it before leaving
        if args == "fail":
            raise RuntimeError("run failed")

    tuner.run_exp = run_exp
    install(worker_exit.SEAMS, tuner)
    tuner.run_exp(sys.argv[1] if len(sys.argv) > 1 else None)
    print("after", flush=True)
    """
)


def run_script(tmp_path, env_extra, *args):
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != worker_exit.TORCHRUN_ENV}
    return subprocess.run(
        [sys.executable, str(script), *args], env={**env, **env_extra}, capture_output=True, text=True, timeout=120
    )


def test_torchrun_worker_leaves_after_a_successful_run_without_teardown(tmp_path):
    result = run_script(tmp_path, {worker_exit.TORCHRUN_ENV: "run-1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["trained", "unflushed line"]


def test_outside_torchrun_the_process_exits_as_usual(tmp_path):
    result = run_script(tmp_path, {})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["trained", "unflushed line", "after", "teardown ran"]


def test_a_failing_worker_keeps_its_traceback_and_exit_status(tmp_path):
    result = run_script(tmp_path, {worker_exit.TORCHRUN_ENV: "run-1"}, "fail")
    assert result.returncode == 1
    assert "RuntimeError: run failed" in result.stderr
    assert result.stdout.splitlines() == ["trained", "unflushed line", "teardown ran"]


def test_the_seam_is_installed_on_llamafactorys_tuner():
    pytest.importorskip("llamafactory")
    from llamafactory.train import tuner

    assert is_wrapped(tuner, "run_exp")
