"""AMX tiles for vLLM's CPU attention: the plugin asks Linux for them in every vLLM process.

Linux hands a process the AMX tile registers only after the process asks (``arch_prctl`` with
``ARCH_REQ_XCOMP_PERM`` for ``XFEATURE_XTILEDATA``); the first AMX instruction of a process that did not
ask raises SIGILL. PyTorch asks before oneDNN's first AMX kernel and exposes the request as
``torch.cpu._init_amx()``. vLLM 0.32's CPU attention (``cpu_attention_with_kv_cache``) runs AMX
instructions without asking, so a worker whose first AMX user is that kernel dies with exit code -4: a
Zebra whose first layer is MLA, served in bf16 on a CPU with AMX (Sapphire Rapids and later). A worker
that ran a oneDNN bf16 GEMM first (a GDN first layer, as in the released 7MLA21GDN plan) survives, and so
does an engine core run in the caller's process after other work. ``register()`` (the
``vllm.general_plugins`` entry point, called in every process vLLM starts) calls :func:`request_amx_tiles`
first, which makes every such process safe whatever its first layer.
"""

from __future__ import annotations

import torch

from ...kernels.stack import AMX_TILE, this_machine


def request_amx_tiles() -> bool:
    """Ask Linux for this process's AMX tile state where the CPU has AMX (the machine probe,
    ``kernels/stack.py``: PyTorch's ``torch.cpu._is_amx_tile_supported``); True when granted.

    A CPU without AMX tiles (``amx_tile`` missing from ``lscpu``'s flags) needs nothing and gets False.
    """
    if AMX_TILE not in this_machine().cpu_features:
        return False
    return bool(torch.cpu._init_amx())
