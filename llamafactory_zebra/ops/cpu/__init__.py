"""The package's C++ CPU kernels, in one folder as fla keeps one per backend: their sources, their one build
(``build.py``) and one wrapper per kernel.

The convention, the same for every kernel: ``<kernel>.cpp`` holds the C++ (bound in ``bindings.cpp``, sharing
``cpu_values.h``), and ``<kernel>.py`` its wrapper, one function that takes the arguments of its op's PyTorch
path, lays the tensors out as the kernel reads them and calls :func:`cpu_kernels`. An op's implementation
table maps its ``cpp`` entry to that function like any other entry; which entry runs is the kernel
registry's choice (``kernels/registry.py``). Nothing else calls the extension's functions (the vLLM layer
calls :func:`cpu_kernels` as it loads, so the build happens then and not mid-request).
"""

from .build import cpu_kernels
from .cpu_prefill import cpu_prefill_in_slots
from .cpu_step import cpu_step_in_slots
from .gated_rms_norm import cpu_gated_rms_norm

__all__ = ["cpu_gated_rms_norm", "cpu_kernels", "cpu_prefill_in_slots", "cpu_step_in_slots"]
