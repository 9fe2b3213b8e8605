"""Fails loudly when a LLaMA-Factory upgrade moves any name the plugin wraps or relies on; the one seam
mechanism (``llamafactory_zebra/seam.py``) on stand-ins."""

import dataclasses
import functools
import hashlib
import importlib
import inspect
from types import ModuleType, SimpleNamespace

import pytest
from llamafactory_zebra_hook import WATCHED_MODULES
from repo_paths import DOCS

from llamafactory_zebra import seam
from llamafactory_zebra.integration import registrations, seams
from llamafactory_zebra.integration.sequence_parallel import ACCELERATOR_PREPARE


@pytest.mark.parametrize("record", seams.LLAMAFACTORY_SEAMS, ids=lambda record: record.name)
def test_declared_seams_are_as_recorded(record):
    assert seam.drift(record) is None


def test_one_record_per_name():
    names = [record.name for record in seams.LLAMAFACTORY_SEAMS]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)


def test_changed_signature_is_reported_with_the_disable_hint():
    fake = ModuleType("llamafactory.train.tuner")
    fake.run_exp = lambda args, extra: None
    with pytest.raises(
        seam.UpstreamSeamChanged, match=r"run_exp now takes \('args', 'extra'\).*LLAMAFACTORY_ZEBRA_DISABLE"
    ):
        seams.install(fake)


def test_every_watched_module_has_changes_to_install_and_exists():
    assert seams.modules_installed_at_import() == WATCHED_MODULES
    for name in WATCHED_MODULES:
        assert importlib.util.find_spec(name) is not None, name


def test_the_drift_check_reads_signatures_fields_and_sources():
    """Each kind of record on a stand-in module, as recorded and after a change."""

    def launch(args, callbacks=None, *, mode="train"):
        return args

    @dataclasses.dataclass
    class Metadata:
        num_decodes: int = 0

    module = ModuleType("upstream_stand_in")
    module.launch, module.Metadata = launch, Metadata
    digest = hashlib.sha256(inspect.getsource(launch).encode()).hexdigest()
    records = {
        "order": seam.Seam("upstream_stand_in", "launch", ("args", "callbacks")),
        "keywords": seam.Seam("upstream_stand_in", "launch", keywords=("mode",)),
        "source": seam.Seam("upstream_stand_in", "launch", source_sha256=digest),
        "fields": seam.Seam("upstream_stand_in", "Metadata", fields=("num_decodes",)),
    }
    assert {kind: seam.drift(record, module) for kind, record in records.items()} == dict.fromkeys(records)

    def launch(callbacks, args):  # noqa: F811  the upgrade: order, keyword and source all changed
        return args

    @dataclasses.dataclass
    class Metadata:  # noqa: F811
        decodes: int = 0

    module.launch, module.Metadata = launch, Metadata
    found = {kind: seam.drift(record, module) for kind, record in records.items()}
    assert "now takes ('callbacks', 'args'), expected ('args', 'callbacks') first" in found["order"]
    assert "no longer takes mode" in found["keywords"] and "source changed" in found["source"]
    assert "has no num_decodes any more" in found["fields"]
    assert "is gone" in seam.drift(seam.Seam("upstream_stand_in", "missing"), module)


def test_a_source_recorded_per_upstream_version_accepts_each_and_names_the_running_one():
    """One plugin version for two upstream ones: the record keeps each version's source SHA-256; either is as
    recorded, :func:`seam.recorded_source` says which one runs, any other source is drift naming both."""

    def launch(args):
        return args

    def sha(function):
        return hashlib.sha256(inspect.getsource(function).encode()).hexdigest()

    old_sha = sha(launch)

    def launch(args):  # noqa: F811  the next upstream version
        return [args]

    module = ModuleType("upstream_stand_in")
    module.launch = launch
    record = seam.Seam("upstream_stand_in", "launch", source_sha256={"1.0": old_sha, "1.1": sha(launch)})
    assert seam.drift(record, module) is None and seam.recorded_source(record, module) == "1.1"
    assert seam.recorded_source(seam.Seam("upstream_stand_in", "launch", source_sha256=sha(launch)), module) == ""

    def launch(args):  # noqa: F811  a version nobody re-read
        return (args,)

    module.launch = launch
    assert seam.recorded_source(record, module) is None
    assert f"recorded 1.0: {old_sha}; 1.1: " in seam.drift(record, module)


def test_the_wrappers_are_installed_in_the_imported_modules():
    loader = importlib.import_module("llamafactory.model.loader")
    patcher = importlib.import_module("llamafactory.model.patcher")
    parser = importlib.import_module("llamafactory.hparams.parser")
    assert loader.load_config.__code__.co_name == "zebra_load_config"
    assert loader.patch_model.__code__.co_name == "zebra_patch_model"
    assert loader.apply_liger_kernel.__code__.co_name == "zebra_apply_liger_kernel"
    assert patcher.configure_rope.__code__.co_name == "zebra_configure_rope"
    assert parser.get_train_args.__code__.co_name == "zebra_get_train_args"
    hparams = importlib.import_module("llamafactory.hparams")
    assert hparams.get_train_args is parser.get_train_args


def test_data_pipeline_facts_the_model_relies_on():
    """Packing emits restarting position_ids and neat-packing segment ids; the collator builds the 4-D mask
    only when ``block_diag_attn`` is set — the flag the parser seam clears for Zebra."""
    collator = importlib.import_module("llamafactory.data.collator")
    fields = {f.name for f in dataclasses.fields(collator.SFTDataCollatorWith4DAttentionMask)}
    assert {"block_diag_attn", "neat_packing", "attn_implementation"} <= fields
    model_args = importlib.import_module("llamafactory.hparams.model_args")
    assert "block_diag_attn" in {f.name for f in dataclasses.fields(model_args.ModelArguments)}
    source = importlib.util.find_spec("llamafactory.data.processor.supervised").loader.get_source(
        "llamafactory.data.processor.supervised"
    )
    assert "packed_position_ids += list(range(len(batch_input_ids[index])))" in source
    assert "packed_attention_masks += [i + 1] * len(batch_input_ids[index])" in source


def test_rope_seam_keeps_theta_and_yarn_mscale():
    from llamafactory.extras.constants import RopeScaling
    from llamafactory.model.patcher import configure_rope

    from llamafactory_zebra import ZebraConfig

    rope = {
        "rope_type": "yarn",
        "rope_theta": 1_000_000.0,
        "factor": 2.0,
        "original_max_position_embeddings": 32768,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    }
    config = ZebraConfig.from_preset("tiny", rope_parameters=dict(rope))
    configure_rope(config, SimpleNamespace(rope_scaling=RopeScaling.YARN, model_max_length=1_048_576))
    assert config.rope_parameters == {**rope, "factor": 32.0}
    assert config.max_position_embeddings == 1_048_576


def test_rope_seam_leaves_other_models_to_llamafactory():
    from llamafactory.extras.constants import RopeScaling
    from llamafactory.model.patcher import configure_rope

    config = SimpleNamespace(model_type="llama", rope_scaling=None, max_position_embeddings=4096)
    configure_rope(config, SimpleNamespace(rope_scaling=RopeScaling.LINEAR, model_max_length=8192))
    assert config.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert config.max_position_embeddings == 8192


def test_rope_seam_switching_away_from_yarn_drops_yarn_keys():
    from llamafactory.extras.constants import RopeScaling
    from llamafactory.model.patcher import configure_rope

    from llamafactory_zebra import ZebraConfig

    rope = {
        "rope_type": "yarn",
        "rope_theta": 5e5,
        "factor": 2.0,
        "original_max_position_embeddings": 64,
        "mscale": 1.0,
    }
    config = ZebraConfig.from_preset("tiny", rope_parameters=rope)
    configure_rope(config, SimpleNamespace(rope_scaling=RopeScaling.LINEAR, model_max_length=300))
    assert config.rope_parameters == {"rope_type": "linear", "rope_theta": 5e5, "factor": 5.0}
    assert config.max_position_embeddings == 320


def test_llamafactory_loader_reads_a_released_layout_directory(tmp_path):
    import json

    from llamafactory.hparams import ModelArguments
    from llamafactory.model.loader import load_config

    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "num_hidden_layers": 4, "hidden_size": 64})
    )
    (tmp_path / "hybrid_config.json").write_text(json.dumps({"mla_layers": [1], "linear_type": "gdn"}))
    config = load_config(ModelArguments(model_name_or_path=str(tmp_path)))
    assert config.model_type == "zebra"
    assert config.layer_types == ["gdn", "mla", "gdn", "gdn"]


LOAD_CONFIG = seam.Seam("llamafactory.model.loader", "load_config", ("model_args",))


def _fake_loader():
    """A stand-in for ``llamafactory.model.loader`` (a declared seam module) with its own ``load_config``."""
    module = ModuleType("llamafactory.model.loader")

    def load_config(model_args):
        return "upstream"

    module.load_config = load_config
    return module, load_config


def _wrapper_of(original):
    @functools.wraps(original)
    def zebra_load_config(model_args):
        return "zebra"

    return zebra_load_config


def test_wrap_marks_the_original_and_refuses_a_second_wrap():
    module, original = _fake_loader()
    seam.wrap(LOAD_CONFIG, module, _wrapper_of(original))
    assert module.load_config(None) == "zebra" and seam.is_wrapped(module, "load_config")
    assert getattr(module.load_config, seam.ORIGINAL) is original and seam.original(module, "load_config") is original
    with pytest.raises(seam.AlreadyWrapped, match="llamafactory.model.loader.load_config is already wrapped"):
        seam.wrap(LOAD_CONFIG, module, _wrapper_of(module.load_config))
    seam.unwrap(module, "load_config")
    assert module.load_config is original and not seam.is_wrapped(module, "load_config")


def test_install_loops_over_the_table_and_refuses_undeclared_names_and_wrappers_of_something_else():
    module, original = _fake_loader()
    table = (dataclasses.replace(LOAD_CONFIG, wrapper=lambda m: _wrapper_of(m.load_config)),)
    seam.install(table, module)
    seam.install(table, module)  # idempotent
    assert module.load_config(None) == "zebra" and seam.original(module, "load_config") is original
    with pytest.raises(KeyError, match="not_a_seam not declared in the seam table"):
        seam.install(table, module, only=("not_a_seam",))
    other, original = _fake_loader()
    with pytest.raises(ValueError, match="functools.wraps around its current value"):
        seam.wrap(LOAD_CONFIG, other, lambda model_args: None)
    assert other.load_config is original


def test_installed_wrappers_went_through_the_door():
    """Every name the hook wraps at import carries wrap()'s mark (none was assigned around it)."""
    wrapped_at_import = [
        ("llamafactory.model.loader", "load_config"),
        ("llamafactory.model.loader", "apply_liger_kernel"),
        ("llamafactory.model.loader", "patch_model"),
        ("llamafactory.model.patcher", "configure_rope"),
        ("llamafactory.hparams.parser", "get_train_args"),
        ("llamafactory.data.converter", "get_dataset_converter"),
        ("llamafactory.data.parser", "get_dataset_list"),
        ("llamafactory.webui.common", "load_dataset_info"),
        ("llamafactory.launcher", "launch"),
    ]
    for module_name, attribute in wrapped_at_import:
        assert seam.is_wrapped(importlib.import_module(module_name), attribute), f"{module_name}.{attribute}"
    # One wrapper on get_train_args, directly around LLaMA-Factory's own function.
    parser = importlib.import_module("llamafactory.hparams.parser")
    original = getattr(parser.get_train_args, seam.ORIGINAL)
    assert original.__module__ == "llamafactory.hparams.parser" and not hasattr(original, seam.ORIGINAL)


def test_the_docs_seam_table_lists_exactly_the_declared_seams():
    docs = (DOCS / "llamafactory.md").read_text(encoding="utf-8")
    section = docs.split("## What changes, and where", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    documented = [line.split("`")[1] for line in rows]
    declared = [record.name for record in seams.LLAMAFACTORY_SEAMS]
    assert sorted(documented) == sorted(declared)


def test_wrapped_method_changes_one_object_for_one_block():
    from accelerate import Accelerator

    accelerator, other = Accelerator(cpu=True), Accelerator(cpu=True)

    @functools.wraps(accelerator.prepare)
    def prepare_nothing(*objects):
        return "zebra"

    with seam.wrapped_method(ACCELERATOR_PREPARE, accelerator, prepare_nothing):
        assert accelerator.prepare(None) == "zebra" and getattr(accelerator.prepare, seam.ORIGINAL) is not None
        assert other.prepare is not prepare_nothing and "prepare" not in vars(other)
        with pytest.raises(seam.AlreadyWrapped, match="Accelerator.prepare is already replaced"):
            wrapper = functools.wraps(accelerator.prepare)(lambda x: x)
            with seam.wrapped_method(ACCELERATOR_PREPARE, accelerator, wrapper):
                pass
    assert "prepare" not in vars(accelerator) and accelerator.prepare.__func__ is Accelerator.prepare
    with pytest.raises(ValueError, match="functools.wraps"):
        with seam.wrapped_method(ACCELERATOR_PREPARE, accelerator, lambda *objects: None):
            pass
    assert "prepare" not in vars(accelerator)


def _plugin_registrations() -> set[tuple[str, str]]:
    """(registry, key) of every entry in transformers' Auto mappings and attention registry that holds a
    llamafactory-zebra object."""
    from transformers.modeling_utils import AttentionInterface
    from transformers.models.auto import auto_factory, configuration_auto, modeling_auto

    def ours(value):
        return getattr(value, "__module__", "").startswith("llamafactory_zebra")

    found = {("AttentionInterface", k) for k, v in AttentionInterface._global_mapping.items() if ours(v)}
    found |= {("AutoConfig", k) for k, v in configuration_auto.CONFIG_MAPPING._extra_content.items() if ours(v)}
    for name in dir(modeling_auto):
        auto_class = getattr(modeling_auto, name)
        mapping = getattr(auto_class, "_model_mapping", None)
        if isinstance(auto_class, type) and isinstance(mapping, auto_factory._LazyAutoMapping):
            found |= {(name, k.__name__) for k, v in mapping._extra_content.items() if ours(v)}
    return found


def test_transformers_registrations_are_exactly_the_declared_ones():
    """What the docs say the plugin adds to transformers' registries is what it adds (FlashAttention's
    entries are added by a distillation teacher that loads with FA; this test adds them the same way)."""
    from transformers.modeling_utils import AttentionInterface

    import llamafactory_zebra  # noqa: F401

    declared = {(registry, key) for registry, key, _ in registrations.TRANSFORMERS_REGISTRATIONS}
    before = dict(AttentionInterface._global_mapping)
    try:
        registrations.register_sinkless_flash_attention()
        registrations.register_sinkless_flash_attention()
        assert _plugin_registrations() == declared
    finally:
        AttentionInterface._global_mapping.clear()
        AttentionInterface._global_mapping.update(before)
    with pytest.raises(KeyError, match="not declared in TRANSFORMERS_REGISTRATIONS"):
        registrations.register_attention_function("sdpa", print)


def test_the_docs_registry_table_lists_exactly_the_declared_registrations():
    docs = (DOCS / "llamafactory.md").read_text(encoding="utf-8")
    section = docs.split("### transformers' registries", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("`") for line in section.splitlines() if line.startswith("| `")]
    documented = sorted((row[1], row[3]) for row in rows)
    assert documented == sorted((registry, key) for registry, key, _ in registrations.TRANSFORMERS_REGISTRATIONS)
