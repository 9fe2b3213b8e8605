"""Called by the import hook (``llamafactory_zebra_hook``) each time a watched LLaMA-Factory module loads.

Registration happens exactly when each registry module finishes importing, so LLaMA-Factory pays
nothing for modules it never imports and every process — the CLI, torchrun workers, the web UI,
the API server — ends up with the same registrations.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

from llamafactory_zebra_hook import DISABLE_ENV

from .. import __version__
from . import chat_exit, datasets, kernel_choice, launcher, seams, training, webui, worker_exit

_announced = False


HANDLERS: dict[str, tuple[Callable[[ModuleType], None], ...]] = {
    "llamafactory.extras.constants": (seams.register_model_groups,),
    "llamafactory.data.template": (seams.register_template,),
    "llamafactory.data.converter": (datasets.on_converter_module_loaded,),
    "llamafactory.data.parser": (datasets.on_parser_module_loaded,),
    "llamafactory.data.loader": (datasets.on_loader_module_loaded,),
    "llamafactory.model.loader": (seams.patch_loader,),
    "llamafactory.model.patcher": (seams.patch_rope,),
    "llamafactory.hparams.parser": (training.on_parser_loaded, kernel_choice.on_parser_loaded),
    "llamafactory.launcher": (launcher.on_launcher_loaded,),
    "llamafactory.webui.common": (datasets.on_webui_common_loaded,),
    "llamafactory.webui.interface": (webui.on_interface_loaded,),
    "llamafactory.webui.engine": (webui.on_engine_loaded,),
    "llamafactory.webui.runner": (webui.on_runner_loaded,),
    "llamafactory.chat.hf_engine": (chat_exit.on_hf_engine_loaded,),
    "llamafactory.train.tuner": (worker_exit.on_tuner_loaded,),
}


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
        f"'{seams.ZEBRA_TEMPLATE}' and recipe datasets registered (set {DISABLE_ENV}=1 to turn off)"
    )


def on_module_loaded(name: str, module: ModuleType) -> None:
    import llamafactory_zebra  # noqa: F401  registers the Auto classes before LLaMA-Factory resolves a config

    for handler in HANDLERS.get(name, ()):
        handler(module)
    if name == "llamafactory.model.loader":
        _announce()
