"""The workarounds the plugin applies itself for known issues (``known_issues.py`` names them), and the
switch that widens one. Each is a function of the machine (:class:`~.stack.Stack`) and the environment, so
a test applies it under a faked ROCm stack on a CPU machine.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from .stack import Stack

# Autotuned fla kernels tune at most this many software-pipelining stages: ``2`` caps every autotuned fla
# kernel of the GDN path (``kernels/fla_seams.py``), on any GPU; ``off`` applies no cap, ROCm included.
FLA_MAX_STAGES_ENV_VAR = "ZEBRA_FLA_MAX_STAGES"
ROCM_STAGE_CAP = 2

TRITON_STAGE_CAP = (
    f"on ROCm, fla's state-recurrence kernels (chunk_delta_h.py) autotune at most {ROCM_STAGE_CAP} pipeline "
    "stages (kernels/fla_seams.py; on fla 0.6.0 a guard that changes nothing: their AMD configs already stay "
    f"at or below {ROCM_STAGE_CAP})"
)
TRITON_CACHE_PER_RANK = (
    "on ROCm, each rank of a multi-rank training run gets its own TRITON_CACHE_DIR (<dir>/rank_<LOCAL_RANK>) "
    "before it compiles a kernel"
)


def fla_stage_cap(stack: Stack) -> tuple[int, bool] | None:
    """``(most stages, for every kernel of the table?)`` to apply to fla's autotuned kernels, or None.

    On ROCm: 2, for the state-recurrence kernels (``fla_seams.FLA_SEAMS``' default rows). ``ZEBRA_FLA_MAX_STAGES``
    overrides: a number caps every kernel of the table on any GPU, ``off`` caps none.
    """
    value = os.environ.get(FLA_MAX_STAGES_ENV_VAR, "").strip().lower()
    if value == "off":
        return None
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{FLA_MAX_STAGES_ENV_VAR}={value!r} is not valid; use a number >= 1 or off.")
        return int(value), True
    return (ROCM_STAGE_CAP, False) if stack.device == "rocm" else None


def triton_cache_per_rank(stack: Stack, environ: MutableMapping[str, str] = os.environ) -> str | None:
    """In a rank of a multi-rank run on ROCm (``LOCAL_RANK`` set, more than one rank), point
    ``TRITON_CACHE_DIR`` at a directory of its own under the one it would share (``$TRITON_CACHE_DIR`` or
    Triton's default ``~/.triton/cache``); Triton reads the variable each time it opens its cache, so this
    works until the first kernel compiles. Returns the directory, or None where nothing applies."""
    rank = environ.get("LOCAL_RANK")
    ranks = int(environ.get("LOCAL_WORLD_SIZE") or environ.get("WORLD_SIZE") or 1)
    if stack.device != "rocm" or rank is None or ranks < 2:
        return None
    shared = environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    own = f"rank_{rank}"
    if os.path.basename(os.path.normpath(shared)) != own:
        environ["TRITON_CACHE_DIR"] = os.path.join(shared, own)
    return environ["TRITON_CACHE_DIR"]
