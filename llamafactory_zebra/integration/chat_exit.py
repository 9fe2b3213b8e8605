"""Streaming chat with a Zebra model ends with the process exiting 0, never with ``std::terminate``.

LLaMA-Factory's Hugging Face engine streams a reply by running ``model.generate`` in a *daemon*
thread that feeds a ``TextIteratorStreamer``. The streamer reports the end of the reply from inside
``generate``, so the caller's loop can end — and ``llamafactory-cli chat`` can read ``exit`` and return —
while that thread is still unwinding out of ``generate``. Python 3.11 stops daemon threads at
interpreter shutdown by ending them where they next take the GIL; inside a torch call that unwind
meets a C++ frame that may not throw, and the C++ runtime aborts the process: ``terminate called
without an active exception``, exit 134, after the reply was printed. It happens with stock
LLaMA-Factory and a stock model too; piped input (the quickstart) hits it, a person typing does not.

The fix uses Python's own rule: a non-daemon thread is joined before shutdown starts. The seam makes the
engine's generation thread non-daemon when the model is a Zebra model, so exit waits for ``generate``
to return (it already produced its last token). Other models keep LLaMA-Factory's behaviour.
"""

from __future__ import annotations

import functools
import threading
from types import ModuleType
from typing import Any

from ..configuration_zebra import is_zebra_config
from ..seam import Seam, original


def _generates_with_zebra(target: Any) -> bool:
    """Whether ``target`` is a Zebra model's bound ``generate`` (the only thread the engine starts)."""
    model = getattr(target, "__self__", None)
    return is_zebra_config(getattr(model, "config", None))


def joined_generation_threads(hf_engine: ModuleType) -> Any:
    """``llamafactory.chat.hf_engine.Thread``, whose Zebra generation threads are joined at exit."""
    thread_class = original(hf_engine, "Thread")

    @functools.wraps(thread_class)
    def generation_thread(*args: Any, **kwargs: Any) -> threading.Thread:
        thread = thread_class(*args, **kwargs)
        if _generates_with_zebra(kwargs.get("target")):
            thread.daemon = False
        return thread

    return generation_thread


SEAMS = (
    Seam("llamafactory.chat.hf_engine", "Thread", ("group", "target", "name", "args", "kwargs"),
         wrapper=joined_generation_threads),
)  # fmt: skip
