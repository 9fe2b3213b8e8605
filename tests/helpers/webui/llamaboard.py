"""Runs ``llamafactory-cli webui`` (with the plugin active, as every user gets it) in a subprocess."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

READY = re.compile(r"Running on local URL:\s+(http://\S+)")


@dataclass(frozen=True)
class LlamaBoard:
    url: str
    port: int
    pid: int
    workdir: Path
    log: Path

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def free_localhost_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(port: int) -> dict[str, str]:
    """The user's environment minus GRADIO_SERVER_NAME, so the bind address is the plugin's default."""
    env = dict(os.environ)
    env.pop("GRADIO_SERVER_NAME", None)
    env.pop("GRADIO_SHARE", None)
    env.update(
        GRADIO_SERVER_PORT=str(port),
        GRADIO_ANALYTICS_ENABLED="False",
        BROWSER="true",  # LLaMA-Factory launches with inbrowser=True; `true URL` opens nothing
        HF_HUB_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        # The runner starts `llamafactory-cli train` by name: it must be this interpreter's.
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    return env


@contextmanager
def running_llamaboard(workdir: Path, startup_timeout: float = 180.0) -> Iterator[LlamaBoard]:
    """The web UI started in ``workdir`` (where it keeps ``saves/`` and ``llamaboard_cache/``)."""
    port = free_localhost_port()
    log = workdir / "llamaboard.log"
    cli = Path(sys.executable).parent / "llamafactory-cli"
    with open(log, "w") as log_file:
        process = subprocess.Popen(
            [str(cli), "webui"],
            cwd=workdir,
            env=_environment(port),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: training children are stopped with it
        )
    try:
        deadline = time.monotonic() + startup_timeout
        while (match := READY.search(log.read_text(errors="replace"))) is None:
            if process.poll() is not None:
                raise RuntimeError(f"llamafactory-cli webui exited with {process.returncode}:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"llamafactory-cli webui not ready after {startup_timeout:.0f} s:\n{log.read_text()}"
                )
            time.sleep(0.5)
        yield LlamaBoard(url=match.group(1), port=port, pid=process.pid, workdir=workdir, log=log)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
