"""The environment switches kernel choice reads: the plugin's GDN backend key and Triton's interpreter flag."""

from __future__ import annotations

import os

BACKEND_ENV_VAR = "ZEBRA_GDN_BACKEND"
BACKEND_CHOICES = ("auto", "torch", "fla")
TRITON_INTERPRET_ENV_VAR = "TRITON_INTERPRET"


def requested_backend() -> str:
    """``ZEBRA_GDN_BACKEND``: ``auto`` (default), ``torch`` or ``fla``; anything else is refused."""
    choice = os.environ.get(BACKEND_ENV_VAR, "auto").strip().lower() or "auto"
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"{BACKEND_ENV_VAR}={choice!r} is not valid; use one of {', '.join(BACKEND_CHOICES)}.")
    return choice


def triton_interpreter_enabled() -> bool:
    """Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``, as triton itself parses it)."""
    return os.environ.get(TRITON_INTERPRET_ENV_VAR, "0").strip().lower() in ("1", "true", "on", "yes")
