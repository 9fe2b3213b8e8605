"""Activates llamafactory-zebra in every Python process that imports LLaMA-Factory.

LLaMA-Factory v0 has no plugin entry point, and ``llamafactory-cli train`` re-launches itself through
torchrun, so registering from the user's own script is not enough: each worker is a fresh interpreter.
The wheel installs ``llamafactory_zebra.pth`` next to this module; Python runs it at start-up and
:func:`install` puts a post-import hook on ``sys.meta_path``. The hook does nothing until one of
LLaMA-Factory's registry modules is imported, then hands that module to
``llamafactory_zebra.integration.activation``. Processes that never import LLaMA-Factory pay for one
tiny import and a set lookup per new module name.

Set ``LLAMAFACTORY_ZEBRA_DISABLE=1`` to keep LLaMA-Factory stock.
"""

import importlib
import os
import sys

DISABLE_ENV = "LLAMAFACTORY_ZEBRA_DISABLE"

# LLaMA-Factory modules whose import triggers an activation step (see integration/activation.py).
WATCHED_MODULES = frozenset(
    {
        "llamafactory.extras.constants",
        "llamafactory.data.template",
        "llamafactory.data.converter",
        "llamafactory.data.parser",
        "llamafactory.data.loader",
        "llamafactory.model.loader",
        "llamafactory.model.patcher",
        "llamafactory.hparams.parser",
        "llamafactory.webui.common",
        "llamafactory.webui.interface",
        "llamafactory.webui.engine",
        "llamafactory.webui.runner",
        "llamafactory.chat.hf_engine",
    }
)


def is_disabled() -> bool:
    return os.environ.get(DISABLE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


# The finder and loader follow importlib's protocols without subclassing importlib.abc: importing it
# costs ~25 ms (importlib.resources, typing, pathlib) in every Python process.
class _NotifyingLoader:
    """Runs the real loader, then tells the plugin the module is ready."""

    def __init__(self, loader, fullname):
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        activation = importlib.import_module("llamafactory_zebra.integration.activation")
        activation.on_module_loaded(self._fullname, module)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class PostImportFinder:
    def find_spec(self, fullname, path, target=None):
        if fullname not in WATCHED_MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _NotifyingLoader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    if is_disabled() or any(isinstance(f, PostImportFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, PostImportFinder())
