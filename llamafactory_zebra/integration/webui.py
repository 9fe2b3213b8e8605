"""LlamaBoard (``llamafactory-cli webui``) seams: safe bind address, CPU-ready defaults, Zebra's presets.

The activation hook installs :data:`SEAMS` right after each LLaMA-Factory module is imported.
Nothing here imports Gradio; the wrapped functions run inside LLaMA-Factory's own code paths, so the
UI keeps its layout, its locales and its saved-config format.

Seams (module → name, parameters relied on):
- ``webui.interface.run_web_ui()`` / ``run_web_demo()``: they bind ``GRADIO_SERVER_NAME`` or 0.0.0.0.
- ``webui.engine.Engine.resume(self)``: the generator Gradio runs on page load to set initial values;
  its first update is where LLaMA-Factory itself puts defaults that depend on the machine.
- ``webui.runner.Runner._parse_train_args(self, data)``: turns the form into ``llamafactory-cli train``
  arguments, including the DeepSpeed json it picked from the ``ds_stage`` dropdown.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from ..presets import PRESETS
from ..seam import Seam, original

LOCALHOST_IPV4 = "127.0.0.1"
LOCALHOST_IPV6 = "::1"
SERVER_NAME_ENV = "GRADIO_SERVER_NAME"
IPV6_ENV = "GRADIO_IPV6"

CPU_COMPUTE_TYPE = "fp32"
UPSTREAM_DS_STAGES = ("none", "2", "3")
ZEBRA_MAX_CUTOFF_LEN = max(preset["max_position_embeddings"] for preset in PRESETS.values())
"""Zebra's longest context; LlamaBoard's cutoff sliders stop at 131072 (hiyouga/LLaMA-Factory#8148)."""

PRESET_DIR_NAME = "deepspeed_configs"


def default_server_name() -> str:
    """The loopback address matching the address family LLaMA-Factory would have bound."""
    from llamafactory.extras.misc import is_env_enabled

    return LOCALHOST_IPV6 if is_env_enabled(IPV6_ENV) else LOCALHOST_IPV4


def on_loopback(name: str) -> Callable[[ModuleType], Callable[[], None]]:
    """Bind LlamaBoard to loopback unless ``GRADIO_SERVER_NAME`` says otherwise (``interface.<name>``).

    Upstream binds 0.0.0.0 (``[::]`` with ``GRADIO_IPV6``), so anyone on the network can start training
    runs with ``trust_remote_code`` on arbitrary paths and read the server's files through the output
    boxes. Setting ``GRADIO_SERVER_NAME=0.0.0.0`` brings upstream's behaviour back.
    """
    return lambda interface: _on_loopback_by_default(original(interface, name))


def _on_loopback_by_default(launch: Callable[[], None]) -> Callable[[], None]:
    @functools.wraps(launch)
    def launch_on_loopback() -> None:
        os.environ.setdefault(SERVER_NAME_ENV, default_server_name())
        launch()

    return launch_on_loopback


def deepspeed_preset_dirs() -> list[Path]:
    """Where the project's DeepSpeed jsons live: inside the package (wheel) or beside it (source checkout)."""
    package = Path(__file__).resolve().parents[1]
    return [package / PRESET_DIR_NAME, package.parent / PRESET_DIR_NAME]


def deepspeed_presets() -> dict[str, Path]:
    """Preset name (the file stem, e.g. ``ds_z3_bf16_offload_all``) → json path, first directory wins."""
    presets: dict[str, Path] = {}
    for directory in deepspeed_preset_dirs():
        if directory.is_dir():
            for path in sorted(directory.glob("*.json")):
                presets.setdefault(path.stem, path)
    return presets


def initial_values(is_accelerator_available: bool) -> dict[str, dict[str, Any]]:
    """Element id → Gradio properties for the page-load update.

    - ``train.compute_type``: upstream defaults to bf16, which makes every run on a CPU-only machine fail
      in ``TrainingArguments`` ("Your setup doesn't support bf16/gpu"); fp32 is what CPU training needs.
    - ``train.ds_stage``: upstream offers only its generated ZeRO-2/3 jsons; the project's presets are
      added by name (:func:`presets_by_name` maps a name to its json).
    - ``train.cutoff_len`` / ``eval.cutoff_len``: allow Zebra's full context.
    """
    values: dict[str, dict[str, Any]] = {
        "train.ds_stage": {"choices": [*UPSTREAM_DS_STAGES, *deepspeed_presets()]},
        "train.cutoff_len": {"maximum": ZEBRA_MAX_CUTOFF_LEN},
        "eval.cutoff_len": {"maximum": ZEBRA_MAX_CUTOFF_LEN},
    }
    if not is_accelerator_available:
        values["train.compute_type"] = {"value": CPU_COMPUTE_TYPE}
    return values


def zebra_defaults_on_page_load(engine_module: ModuleType) -> Any:
    """Add :func:`initial_values` to the first update of ``Engine.resume`` (the page-load handler).

    Changing values there, rather than editing the components, is how LLaMA-Factory sets its own
    machine-dependent defaults (output dir, language), and Gradio then validates later inputs against
    the updated choices of this browser session.
    """
    from llamafactory.extras.misc import is_accelerator_available

    resume = original(engine_module, "Engine.resume")

    @functools.wraps(resume)
    def resume_with_zebra_defaults(self):
        updates = resume(self)
        first = next(updates)
        if not self.pure_chat:
            first.update(self._update_component(initial_values(is_accelerator_available())))
        yield first
        yield from updates

    return resume_with_zebra_defaults


def presets_by_name(runner_module: ModuleType) -> Any:
    """A ``ds_stage`` that names a project preset trains with that preset's json.

    Upstream builds ``llamaboard_cache/ds_z{ds_stage}_…config.json`` from the dropdown value; for a
    preset name that file does not exist, so the argument is replaced by the preset's absolute path
    (the preset fixes offloading itself; the "offload" checkbox does not apply to it).
    """
    parse_train_args = original(runner_module, "Runner._parse_train_args")

    @functools.wraps(parse_train_args)
    def parse_train_args_with_presets(self, data):
        args = parse_train_args(self, data)
        preset = deepspeed_presets().get(data[self.manager.get_elem_by_id("train.ds_stage")])
        if preset is not None:
            args["deepspeed"] = str(preset)
        return args

    return parse_train_args_with_presets


SEAMS = (
    Seam("llamafactory.webui.interface", "run_web_ui", (), wrapper=on_loopback("run_web_ui")),
    Seam("llamafactory.webui.interface", "run_web_demo", (), wrapper=on_loopback("run_web_demo")),
    Seam("llamafactory.webui.engine", "Engine.resume", ("self",), wrapper=zebra_defaults_on_page_load),
    Seam("llamafactory.webui.runner", "Runner._parse_train_args", ("self", "data"), wrapper=presets_by_name),
)
