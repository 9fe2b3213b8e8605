"""AMD's released layout: the MLA norm placement comes from the weights' keys, and the files' Qwen3 leftovers
(tied head, 40960 positions) do not leak into the hybrid's config."""

import pytest
import torch

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.released import load_released_config
from llamafactory_zebra.testing.models import tiny_model, write_released_layout

YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 32.0, "original_max_position_embeddings": 32768}


@pytest.mark.parametrize("norm", ["qk_head", "lora", "none"])
def test_each_norm_placement_loads_to_its_setting(tmp_path, norm):
    source = tiny_model(dtype=torch.float32, mla_norm=norm, rope_parameters=dict(YARN))
    # Nothing in the files says which norms the MLA layers carry: only the weights do.
    write_released_layout(tmp_path, source)
    config = load_released_config(tmp_path)
    assert (config.mla_norm, config.rope_interleave, config.tie_word_embeddings) == (norm, True, False)
    assert config.max_position_embeddings == 32768 * 32  # not the 40960 of hybrid_config.json
    loaded = ZebraForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = torch.randint(0, 97, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens).logits, source(tokens).logits, rtol=0, atol=0)


def test_unknown_mla_keys_fail_listing_expected_and_found(tmp_path):
    source = tiny_model(dtype=torch.float32)
    write_released_layout(
        tmp_path, source, drop="model.layers.1.mla.k_norm.weight", extra="model.layers.1.mla.kv_norm.weight"
    )
    with pytest.raises(ValueError, match="layer 1") as error:
        load_released_config(tmp_path)
    message = str(error.value)
    assert "kv_norm.weight" in message and "q_norm.weight" in message  # found, and what was expected
    assert "mla_norm 'qk_head': " in message and "kv_a_layernorm.weight" in message and "'none'" in message


def test_use_lora_layer_norm_and_full_kv_heads_are_honoured(tmp_path):
    source = tiny_model(dtype=torch.float32, mla_norm="lora", num_key_value_heads=4)
    hybrid = {"use_lora_layer_norm": True, "use_full_kv_head": True}
    write_released_layout(tmp_path, source, hybrid_overrides=hybrid, base_overrides={"num_key_value_heads": 2})
    (tmp_path / "model.safetensors").unlink()  # the files alone decide here
    config = load_released_config(tmp_path)
    assert config.mla_norm == "lora"
    assert config.num_key_value_heads == config.num_attention_heads == 4


def test_lora_flag_contradicted_by_qk_norm_weights_is_an_error(tmp_path):
    write_released_layout(tmp_path, tiny_model(dtype=torch.float32), hybrid_overrides={"use_lora_layer_norm": True})
    with pytest.raises(ValueError, match="use_lora_layer_norm"):
        load_released_config(tmp_path)


def test_zebra_config_from_pretrained_on_a_released_directory_points_to_the_loaders(tmp_path):
    """``ZebraConfig`` reads only native configs; AMD's Qwen3 config.json is refused, not read as a Zebra."""
    write_released_layout(tmp_path, tiny_model(dtype=torch.float32))
    with pytest.raises(ValueError, match="describes a 'qwen3' model") as error:
        ZebraConfig.from_pretrained(tmp_path)
    assert "ZebraForCausalLM.from_pretrained" in str(error.value) and "llamafactory-zebra import" in str(error.value)


def test_auto_config_reads_a_released_directory_as_the_qwen3_its_config_json_describes(tmp_path):
    """transformers' own reading, left alone (docs/architecture.md, "Released layout")."""
    from transformers import AutoConfig

    write_released_layout(tmp_path, tiny_model(dtype=torch.float32))
    assert AutoConfig.from_pretrained(tmp_path).model_type == "qwen3"


def test_model_from_pretrained_puts_config_fields_into_the_translated_config(tmp_path):
    write_released_layout(tmp_path, tiny_model(dtype=torch.float32))
    model = ZebraForCausalLM.from_pretrained(tmp_path, use_cache=False, rms_norm_eps=1e-5, dtype=torch.float32)
    assert (model.config.use_cache, model.config.rms_norm_eps, model.config.mla_norm) == (False, 1e-5, "qk_head")
    assert model.dtype == torch.float32 and model.config.layer_types == ["gdn", "mla", "gdn", "gdn"]


@pytest.mark.slow
def test_llamafactory_cli_trains_a_released_directory_as_it_is(tmp_path):
    """Through the real ``llamafactory-cli train`` (the plugin's loader seam, then transformers' own loading with
    the translated config): two steps, and the checkpoint it saves is native."""
    from llamafactory_cli import BASE_ARGS, run_cli

    from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    released = tmp_path / "released"
    write_released_layout(released, tiny_model(dtype=torch.float32, vocab_size=len(tokenizer)))
    tokenizer.save_pretrained(released)
    out = tmp_path / "out"
    args = {**BASE_ARGS, "model_name_or_path": str(released), "finetuning_type": "full", "max_steps": 2}
    log = run_cli("train", {**args, "output_dir": str(out), "enable_liger_kernel": False}, tmp_path)
    assert f"{released} is in AMD's released layout (hybrid_config.json); loading it as ZebraForCausalLM" in log
    assert ZebraConfig.from_pretrained(out).layer_types == ["gdn", "mla", "gdn", "gdn"]
