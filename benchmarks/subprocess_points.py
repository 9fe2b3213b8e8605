"""Run one benchmark point in a fresh interpreter, so ``ru_maxrss`` (a high-water mark) is its own."""

from __future__ import annotations

import json
import signal
import subprocess
import sys


def run_point(script: str, arguments: list[str]) -> dict | None:
    """The JSON the point printed last, or ``None`` when the kernel killed it (out of memory)."""
    run = subprocess.run([sys.executable, script, *arguments], capture_output=True, text=True)
    if run.returncode == -signal.SIGKILL:
        return None
    if run.returncode != 0:
        raise RuntimeError(f"{script} {' '.join(arguments)} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])
