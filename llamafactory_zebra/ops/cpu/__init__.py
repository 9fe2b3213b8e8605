"""The package's C++ CPU kernels, in one folder as fla keeps one per backend: their sources, their one build
(``build.py``) and one wrapper per kernel.

The convention, the same for every kernel: ``<kernel>.cpp`` holds the C++ (bound in ``bindings.cpp``, sharing
``cpu_values.h``), and ``<kernel>.py`` its wrapper, one function that takes the arguments of its op's PyTorch
path (the prefill's also ``bf16_operands``, which the op's binding fixes per entry), lays the tensors out as the
kernel reads them and calls :func:`cpu_kernels`. The module that runs the op binds that function to its ``cpp``
entries like any other entry's (``kernels.bind``: ``ops/gated_delta_rule/in_slots.py``,
``ops/gated_rms_norm.py``); which entry runs is the kernel registry's choice (``kernels/registry.py``). Only the
wrappers call the extension's functions; :func:`cpu_kernels` itself is also called by the vLLM layer as it loads
(so the build happens then and not mid-request) and by ``llamafactory-zebra build-kernels``.
"""

from .build import cpu_kernels
from .cpu_prefill import cpu_prefill_in_slots
from .cpu_step import cpu_step_in_slots
from .gated_rms_norm import cpu_gated_rms_norm

__all__ = ["cpu_gated_rms_norm", "cpu_kernels", "cpu_prefill_in_slots", "cpu_step_in_slots"]
