"""Called by the import hook (``llamafactory_zebra_hook``) each time a watched LLaMA-Factory module loads.

Registration happens exactly when each registry module finishes importing, so LLaMA-Factory pays
nothing for modules it never imports and every process — the CLI, torchrun workers, the web UI,
the API server — ends up with the same registrations.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import ModuleType

from .. import __version__
from . import seams

_announced = False


def _datasets(function_name: str) -> Callable[[ModuleType], None]:
    def call(module: ModuleType) -> None:
        from . import datasets

        getattr(datasets, function_name)(module)

    return call


HANDLERS: dict[str, tuple[Callable[[ModuleType], None], ...]] = {
    "llamafactory.extras.constants": (seams.register_model_groups,),
    "llamafactory.data.template": (seams.register_template,),
    "llamafactory.data.converter": (_datasets("on_converter_module_loaded"),),
    "llamafactory.data.parser": (_datasets("on_parser_module_loaded"),),
    "llamafactory.model.loader": (seams.patch_loader,),
    "llamafactory.model.patcher": (seams.patch_rope,),
    "llamafactory.hparams.parser": (seams.patch_train_args,),
    "llamafactory.webui.common": (_datasets("on_webui_common_loaded"),),
}


def _announce() -> None:
    global _announced
    if _announced:
        return
    _announced = True
    if int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")) or 0) == 0:
        from llamafactory.extras import logging

        logging.get_logger("llamafactory_zebra").info(
            f"llamafactory-zebra {__version__} active: Zebra models, template '{seams.ZEBRA_TEMPLATE}' and recipe "
            "datasets registered (set LLAMAFACTORY_ZEBRA_DISABLE=1 to turn off)"
        )


def on_module_loaded(name: str, module: ModuleType) -> None:
    import llamafactory_zebra  # noqa: F401  registers the Auto classes before LLaMA-Factory resolves a config

    for handler in HANDLERS.get(name, ()):
        handler(module)
    if name == "llamafactory.model.loader":
        _announce()


def activate_already_imported() -> None:
    """For a process that imported LLaMA-Factory before the hook was installed (notebooks)."""
    for name in HANDLERS:
        module = sys.modules.get(name)
        if module is not None:
            on_module_loaded(name, module)
