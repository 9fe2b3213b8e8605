"""A torchrun worker whose ``run_exp`` returned leaves without Python's interpreter teardown.

Why: on CPU (gloo, DeepSpeed included) the process groups' worker and TCP-loop threads are still
running after LLaMA-Factory's closing ``destroy_process_group()``: a thread listing taken at exit of a
two-rank ZeRO-3 run shows two groups' ``pt_gloo_runloop`` / ``gloo_tcp_loop`` threads alive in every
rank, because other owners (DeepSpeed's group registry) still hold the groups. They are then torn down
by interpreter finalization, and now and then (three times in this project's CI-like runs of two-rank
ZeRO-3 training, each after the run had saved everything) a rank dies there with ``terminate called
without an active exception`` (SIGABRT): torchrun reports the run failed and a script that chains
stages (ILD, then KD) stops. pytorch/pytorch#179291 describes that teardown hazard; torch has no switch
for it, and the groups' owners are not the plugin's to free.

So the worker skips the teardown once there is nothing left to do: the seam wraps
``llamafactory.train.tuner.run_exp`` (the last call of LLaMA-Factory's torchrun entry point,
``llamafactory/launcher.py``); when it returns in a torchrun worker (``TORCHELASTIC_RUN_ID`` set),
logging and the standard streams are flushed and the process ends with ``os._exit(0)``, the status a
normal exit would have had. A run that raises takes Python's usual path (traceback, exit 1), and
``run_exp`` outside torchrun (the CLI's single process, the API, tests) is unchanged.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from types import ModuleType
from typing import Any

from ..seam import Seam, original

TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun in each worker it starts


def leave_without_teardown() -> None:
    """Flush what this process wrote, then exit 0 without interpreter finalization."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0)


def leave_after_run_exp(tuner: ModuleType) -> Any:
    """``llamafactory.train.tuner.run_exp``, after which a torchrun worker ends."""
    run_exp = original(tuner, "run_exp")

    @functools.wraps(run_exp)
    def run_exp_then_leave(*args: Any, **kwargs: Any) -> None:
        run_exp(*args, **kwargs)
        if os.environ.get(TORCHRUN_ENV):
            leave_without_teardown()

    return run_exp_then_leave


SEAMS = (Seam("llamafactory.train.tuner", "run_exp", ("args", "callbacks"), wrapper=leave_after_run_exp),)
