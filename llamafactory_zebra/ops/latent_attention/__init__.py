"""Attention that reads MLA's compressed (latent) cache in place, from vLLM-style pages.

``latent_decode``: absorbed decode, one query per request, returning the softmax-weighted latent (the
caller applies ``W_UV``): PyTorch, one GEMM per request chunk for all heads (``cpu_decode.py``).
``latent_prefill``: queries over their request's cached tokens, expanded by the caller's ``expand`` a key
block at a time with an online softmax, so memory stays bounded at any context (``prefill.py``).
``latent_decode_triton`` (``triton_decode.py``, imported on demand: it needs triton): the GPU decode.
``layout.py`` says what a cache row holds; ``reference.py`` is the plain definition every other path is
tested against.
"""

from ...kernels import Key, Op, bind
from .cpu_decode import latent_decode_cpu
from .prefill import latent_prefill_cpu
from .reference import latent_decode_reference, latent_prefill_reference

latent_decode = latent_decode_cpu
latent_prefill = latent_prefill_cpu


def _latent_decode_triton(*args, **kwargs):
    """``triton_decode.latent_decode_triton``, imported at its first call (``triton`` is a GPU install's)."""
    from .triton_decode import latent_decode_triton

    return latent_decode_triton(*args, **kwargs)


bind(Op.LATENT_DECODE, {Key.TRITON: _latent_decode_triton, Key.TORCH: latent_decode_cpu})

__all__ = [
    "latent_decode",
    "latent_decode_cpu",
    "latent_decode_reference",
    "latent_prefill",
    "latent_prefill_cpu",
    "latent_prefill_reference",
]
