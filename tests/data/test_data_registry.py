"""Registry names through LLaMA-Factory's real parser and web UI modules (the dataset seams)."""

import json
import types
from pathlib import Path

import llamafactory.data.converter as converter_module
import llamafactory.data.parser as parser_module
import llamafactory.webui.common as webui_common
import pytest
from repo_paths import FIXTURES

from llamafactory_zebra.data.registry import SAMPLES_DIR, registry_dataset_info
from llamafactory_zebra.integration import datasets as seams
from llamafactory_zebra.integration.seams import install
from llamafactory_zebra.seam import UpstreamSeamChanged

DATASETS = FIXTURES / "datasets"

pytestmark = pytest.mark.usefixtures("dataset_seams")

# name -> (hub id, subset, split): the recipe's public datasets, as documented in docs/datasets.md.
EXPECTED_HUB = {
    "sftdatasetv3": ("JunxiongWang/sftdatasetv3", None, "train"),
    "openmathinstruct2": ("nvidia/OpenMathInstruct-2", None, "train"),
    "openmathinstruct2_1m": ("nvidia/OpenMathInstruct-2", None, "train_1M"),
    "openmathinstruct2_2m": ("nvidia/OpenMathInstruct-2", None, "train_2M"),
    "openmathinstruct2_5m": ("nvidia/OpenMathInstruct-2", None, "train_5M"),
    "openthoughts114k_math": ("open-r1/OpenThoughts-114k-math", None, "train"),
    "openthoughts114k": ("open-thoughts/OpenThoughts-114k", "default", "train"),
    "openr1_math_220k": ("open-r1/OpenR1-Math-220k", "default", "train"),
    "openr1_math_220k_extended": ("open-r1/OpenR1-Math-220k", "extended", "train"),
    "openr1_math_220k_all": ("open-r1/OpenR1-Math-220k", "all", "train"),
    "chatqa2_long_sft": ("nvidia/ChatQA2-Long-SFT-data", "long_sft", "train"),
    "chatqa2_narrativeqa_131k": ("nvidia/ChatQA2-Long-SFT-data", "NarrativeQA_131072", "train"),
}


def get_dataset_list(names, dataset_dir):
    return parser_module.get_dataset_list(names, dataset_dir)


def test_recipe_names_resolve_from_a_directory_without_dataset_info(tmp_path):
    names = list(EXPECTED_HUB)
    for name, attr in zip(names, get_dataset_list(names, str(tmp_path)), strict=True):
        hub_id, subset, split = EXPECTED_HUB[name]
        assert (attr.load_from, attr.dataset_name, attr.subset, attr.split) == ("hf_hub", hub_id, subset, split)
        assert attr.formatting in converter_module.DATASET_CONVERTERS
        assert attr.zebra_name == name


def test_column_mappings_match_the_public_schemas(tmp_path):
    openmath, chatqa, openthoughts, openr1, sft = get_dataset_list(
        ["openmathinstruct2", "chatqa2_long_sft", "openthoughts114k", "openr1_math_220k", "sftdatasetv3"],
        str(tmp_path),
    )
    assert (openmath.formatting, openmath.prompt, openmath.query, openmath.response) == (
        "alpaca",
        "problem",
        None,
        "generated_solution",
    )
    assert (chatqa.formatting, chatqa.prompt, chatqa.response) == ("zebra_chatqa2", "question", "answer")
    assert (openthoughts.messages, openthoughts.system, openthoughts.role_tag, openthoughts.content_tag) == (
        "conversations",
        "system",
        "from",
        "value",
    )
    for attr in (openr1, sft):
        assert (attr.messages, attr.role_tag, attr.content_tag, attr.user_tag, attr.assistant_tag) == (
            "messages",
            "role",
            "content",
            "user",
            "assistant",
        )


def test_sample_twins_point_at_shipped_files(tmp_path):
    twins = [name for name in registry_dataset_info() if name.endswith("_sample")]
    assert len(twins) == 7
    for attr in get_dataset_list(twins, str(tmp_path)):
        assert attr.load_from == "file"
        assert Path(attr.dataset_name).parent == SAMPLES_DIR
        assert Path(attr.dataset_name).is_file()


def test_user_entries_win_and_can_extend_registry_entries():
    user_sft, capped, registry_only = get_dataset_list(
        ["sftdatasetv3", "openmath_capped", "openr1_math_220k"], str(DATASETS)
    )
    assert (user_sft.load_from, user_sft.dataset_name) == ("file", "known_lengths.jsonl")
    assert capped.num_samples == 2
    assert capped.dataset_name == str(SAMPLES_DIR / "openmathinstruct2.jsonl")
    assert (capped.prompt, capped.response) == ("problem", "generated_solution")
    assert registry_only.dataset_name == "open-r1/OpenR1-Math-220k"


def test_unknown_dataset_lists_user_and_registry_names(tmp_path):
    with pytest.raises(ValueError) as error:
        get_dataset_list(["known_lengths", "no_such_set"], str(DATASETS))
    message = str(error.value)
    assert "Unknown dataset 'no_such_set'" in message
    assert "known_lengths, known_lengths_alpaca" in message
    assert "chatqa2_long_sft, chatqa2_narrativeqa_131k" in message
    with pytest.raises(ValueError, match=r"dataset_info.json not found\)"):
        get_dataset_list(["no_such_set"], str(tmp_path))


def test_broken_dataset_info_and_bad_base_are_named(tmp_path):
    (tmp_path / "dataset_info.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"Cannot read .*dataset_info.json"):
        get_dataset_list(["sftdatasetv3"], str(tmp_path))
    (tmp_path / "dataset_info.json").write_text(json.dumps({"mine": {"zebra_base": "sftdatasetv9"}}))
    with pytest.raises(ValueError, match=r"dataset 'mine' has zebra_base='sftdatasetv9'.*Known: chatqa2_long_sft"):
        get_dataset_list(["mine"], str(tmp_path))


def test_online_mode_is_left_to_llamafactory():
    (attr,) = get_dataset_list(["JunxiongWang/sftdatasetv3"], "ONLINE")
    assert (attr.load_from, attr.dataset_name) == ("hf_hub", "JunxiongWang/sftdatasetv3")


def test_web_ui_lists_user_datasets_first_then_the_registry(tmp_path):
    names = list(webui_common.load_dataset_info(str(DATASETS)))
    user = list(json.loads((DATASETS / "dataset_info.json").read_text()))
    assert names[: len(user)] == user
    assert names[len(user) :] == [name for name in registry_dataset_info() if name not in user]
    assert list(webui_common.load_dataset_info(str(tmp_path))) == list(registry_dataset_info())


def test_web_ui_dropdown_offers_registry_datasets():
    from llamafactory.webui.control import list_datasets

    choices = [choice[0] if isinstance(choice, tuple) else choice for choice in list_datasets(str(DATASETS)).choices]
    assert "known_lengths" in choices and "chatqa2_narrativeqa_131k" in choices


def test_seams_are_idempotent():
    wrapped = parser_module.get_dataset_list
    seams.install_dataset_seams()
    assert parser_module.get_dataset_list is wrapped
    assert not hasattr(wrapped.__zebra_original__, "__zebra_original__")
    assert not hasattr(converter_module.get_dataset_converter.__zebra_original__, "__zebra_original__")


def test_a_changed_upstream_signature_is_refused():
    fake = types.ModuleType("llamafactory.data.parser")
    fake.get_dataset_list = lambda names, dataset_dir, streaming: []
    with pytest.raises(
        UpstreamSeamChanged, match=r"get_dataset_list now takes \('names', 'dataset_dir', 'streaming'\)"
    ):
        install(fake)
    fake_ui = types.ModuleType("llamafactory.webui.common")
    with pytest.raises(UpstreamSeamChanged, match="load_dataset_info is gone"):
        install(fake_ui)
