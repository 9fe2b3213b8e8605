"""The LlamaBoard seams on stand-ins for LLaMA-Factory's modules (fast; the browser test covers the real UI)."""

from __future__ import annotations

import os
from types import ModuleType

import pytest
from repo_paths import REPO

from llamafactory_zebra.integration import webui
from llamafactory_zebra.integration.seams import install
from llamafactory_zebra.seam import UpstreamSeamChanged


def _interface_recording_bind_address() -> tuple[ModuleType, list[str | None]]:
    seen: list[str | None] = []
    interface = ModuleType("llamafactory.webui.interface")
    interface.run_web_ui = lambda: seen.append(os.environ.get("GRADIO_SERVER_NAME"))
    interface.run_web_demo = lambda: seen.append(os.environ.get("GRADIO_SERVER_NAME"))
    return interface, seen


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({}, "127.0.0.1"),
        ({"GRADIO_IPV6": "1"}, "::1"),
        ({"GRADIO_SERVER_NAME": "0.0.0.0"}, "0.0.0.0"),
        ({"GRADIO_SERVER_NAME": "192.168.1.7", "GRADIO_IPV6": "1"}, "192.168.1.7"),
    ],
)
def test_web_ui_and_demo_bind_loopback_unless_told_otherwise(monkeypatch, environment, expected):
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_IPV6", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    interface, seen = _interface_recording_bind_address()
    install(interface)
    install(interface)  # a second activation must not wrap twice
    interface.run_web_ui()
    interface.run_web_demo()
    assert seen == [expected, expected]


def test_presets_are_the_project_deepspeed_jsons():
    expected = {path.stem: path.resolve() for path in (REPO / "deepspeed_configs").glob("*.json")}
    assert expected, "deepspeed_configs/ holds no presets"
    assert {name: path.resolve() for name, path in webui.deepspeed_presets().items()} == expected


@pytest.mark.parametrize("accelerator", [False, True])
def test_initial_values(accelerator):
    values = webui.initial_values(is_accelerator_available=accelerator)
    assert values["train.ds_stage"]["choices"] == ["none", "2", "3", *sorted(webui.deepspeed_presets())]
    assert values["train.cutoff_len"] == values["eval.cutoff_len"] == {"maximum": 1_048_576}  # the 1M preset
    if accelerator:
        assert "train.compute_type" not in values  # upstream's bf16 default stays
    else:
        assert values["train.compute_type"] == {"value": "fp32"}


class _Manager:
    def get_elem_by_id(self, elem_id: str) -> str:
        return elem_id


def _engine_module(pure_chat: bool) -> ModuleType:
    class Engine:
        def __init__(self) -> None:
            self.pure_chat = pure_chat

        def _update_component(self, input_dict):
            return {elem_id: ("component", attrs) for elem_id, attrs in input_dict.items()}

        def resume(self):
            yield {"top.lang": ("component", {"value": "en"})}
            yield {"train.resume_btn": ("component", {"value": True})}

    module = ModuleType("llamafactory.webui.engine")
    module.Engine = Engine
    return module


def test_page_load_update_carries_zebra_defaults(monkeypatch):
    monkeypatch.setattr("llamafactory.extras.misc.is_accelerator_available", lambda: False)
    module = _engine_module(pure_chat=False)
    install(module)
    install(module)
    first, second = list(module.Engine().resume())
    expected = {key: ("component", attrs) for key, attrs in webui.initial_values(False).items()}
    assert first == {"top.lang": ("component", {"value": "en"}), **expected}
    assert second == {"train.resume_btn": ("component", {"value": True})}


def test_pure_chat_page_has_no_training_elements_to_update():
    module = _engine_module(pure_chat=True)
    install(module)
    assert list(module.Engine().resume())[0] == {"top.lang": ("component", {"value": "en"})}


def _runner_module() -> ModuleType:
    class Runner:
        def __init__(self) -> None:
            self.manager = _Manager()

        def _parse_train_args(self, data):
            stage = data["train.ds_stage"]
            return {"deepspeed": f"llamaboard_cache/ds_z{stage}_config.json"} if stage != "none" else {}

    module = ModuleType("llamafactory.webui.runner")
    module.Runner = Runner
    return module


@pytest.mark.parametrize(
    ("ds_stage", "expected"),
    [
        ("ds_z3_bf16_offload_all", str(REPO / "deepspeed_configs" / "ds_z3_bf16_offload_all.json")),
        ("3", "llamaboard_cache/ds_z3_config.json"),
        ("none", None),
    ],
)
def test_preset_name_trains_with_the_preset_json(ds_stage, expected):
    module = _runner_module()
    install(module)
    install(module)
    args = module.Runner()._parse_train_args({"train.ds_stage": ds_stage})
    assert args.get("deepspeed") == expected


def test_changed_upstream_signature_is_reported():
    module = _runner_module()
    module.Runner._parse_train_args = lambda self, form: {}
    with pytest.raises(UpstreamSeamChanged, match="_parse_train_args"):
        install(module)
