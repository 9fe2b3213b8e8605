"""``llamafactory-cli train`` in the launching process: the plugin's keys are checked before torchrun starts.

LLaMA-Factory's ``launcher.launch`` re-runs ``train`` under torchrun with ``NNODES x NPROC_PER_NODE``
workers. A ``sequence_parallel_size`` that does not divide that world size is found by every worker
while it parses its arguments, and torchrun then ends the output with its own ``ChildFailedError``
traceback, far below the explanation. The wrapper of ``launch`` reads the arguments the workers will
read (LLaMA-Factory's ``read_args`` on the same command line), parses the plugin's keys
(``hparams.ZebraArguments``) and, when the world cannot hold the size or a key is malformed, exits
before anything starts with one line naming the key, its value and the valid values.
"""

from __future__ import annotations

import functools
import os
import sys
from types import ModuleType
from typing import Any

from ..seam import Seam, original

ONE_NODE, TRAIN = "1", "train"


def launch_world_size(misc: ModuleType) -> int | None:
    """Processes ``launch`` starts for ``train``: ``NNODES x NPROC_PER_NODE`` when it uses torchrun, 1 when it
    trains in-process, ``None`` when Ray places the workers (its own configuration says how many).

    The rule is ``launch``'s own: torchrun with ``FORCE_TORCHRUN`` (or ``USE_MCA``), or with more than one
    device unless Ray or KTransformers run the job; ``NPROC_PER_NODE`` defaults to the device count.
    """
    is_env_enabled, use_ray, use_kt = (original(misc, name) for name in ("is_env_enabled", "use_ray", "use_kt"))
    devices = original(misc, "get_device_count")()
    forced = is_env_enabled("FORCE_TORCHRUN") or is_env_enabled("USE_MCA")
    if forced or (devices > 1 and not use_ray() and not use_kt()):
        return int(os.getenv("NNODES", ONE_NODE)) * int(os.getenv("NPROC_PER_NODE", str(devices)))
    return None if use_ray() else 1


def refusal(argv: list[str], misc: ModuleType) -> str | None:
    """The one-line reason ``llamafactory-cli train`` (``argv`` as the launcher got it) cannot start, or ``None``."""
    from llamafactory.hparams import parser

    from ..hparams import check_sequence_parallel_size, pop_zebra_arguments

    world = launch_world_size(misc)
    saved, sys.argv = sys.argv, [argv[0], *argv[2:]]  # what each worker's read_args sees
    try:
        _, zebra = pop_zebra_arguments(original(parser, "read_args")(None))
        if world is not None:
            check_sequence_parallel_size(zebra.sequence_parallel_size, world)
    except ValueError as error:
        where = (
            f" (NNODES={os.getenv('NNODES', ONE_NODE)} x NPROC_PER_NODE={os.getenv('NPROC_PER_NODE', 'all devices')})"
            if world not in (None, 1)
            else ""
        )
        return f"llamafactory-zebra: {error}{where}"
    finally:
        sys.argv = saved
    return None


def checked_before_torchrun(launcher: ModuleType) -> Any:
    launch = original(launcher, "launch")

    @functools.wraps(launch)
    def zebra_launch():
        if len(sys.argv) > 1 and sys.argv[1] == TRAIN:
            from llamafactory.extras import misc

            reason = refusal(sys.argv, misc)
            if reason is not None:
                raise SystemExit(reason)
        return launch()

    return zebra_launch


SEAMS = (
    Seam("llamafactory.launcher", "launch", (), wrapper=checked_before_torchrun),
    Seam("llamafactory.extras.misc", "is_env_enabled", ("env_var", "default")),
    Seam("llamafactory.extras.misc", "get_device_count", ()),
    Seam("llamafactory.extras.misc", "use_ray", ()),
    Seam("llamafactory.extras.misc", "use_kt", ()),
)
