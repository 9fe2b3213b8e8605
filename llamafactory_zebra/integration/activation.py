"""Called by the import hook (``llamafactory_zebra_hook``) each time a watched LLaMA-Factory module loads.

Registration happens exactly when each registry module finishes importing (``seams.install`` applies
that module's records of the seam table), so LLaMA-Factory pays nothing for modules it never imports
and every process — the CLI, torchrun workers, the web UI, the API server — ends up with the same
registrations.
"""

from __future__ import annotations

import os
from types import ModuleType

from llamafactory_zebra_hook import DISABLE_ENV

from .. import __version__
from . import seams
from .loading import ZEBRA_TEMPLATE

_announced = False


def _announce() -> None:
    """One line per process (each torchrun worker says it is active too)."""
    global _announced
    if _announced:
        return
    _announced = True
    from llamafactory.extras import logging

    rank = os.environ.get("RANK", "0")
    logging.get_logger("llamafactory.zebra").info(
        f"llamafactory-zebra {__version__} active in rank {rank}: Zebra models, template "
        f"'{ZEBRA_TEMPLATE}' and recipe datasets registered (set {DISABLE_ENV}=1 to turn off)"
    )


def on_module_loaded(name: str, module: ModuleType) -> None:
    import llamafactory_zebra  # noqa: F401  registers the Auto classes before LLaMA-Factory resolves a config

    seams.install(module)
    if name == "llamafactory.model.loader":
        _announce()
