"""AMD's released layout: the MLA norm placement comes from the weights' keys, and the files' Qwen3 leftovers
(tied head, 40960 positions) do not leak into the hybrid's config."""

import pytest
import torch
from zebra_helpers import tiny_model, write_released_layout

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

YARN = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 32.0, "original_max_position_embeddings": 32768}


@pytest.mark.parametrize("norm", ["qk_head", "lora", "none"])
def test_each_norm_placement_loads_to_its_setting(tmp_path, norm):
    source = tiny_model(dtype=torch.float32, mla_norm=norm, rope_parameters=dict(YARN))
    # Nothing in the files says which norms the MLA layers carry: only the weights do.
    write_released_layout(tmp_path, source)
    config = ZebraConfig.from_pretrained(tmp_path)
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
        ZebraConfig.from_pretrained(tmp_path)
    message = str(error.value)
    assert "kv_norm.weight" in message and "q_norm.weight" in message  # found, and what was expected
    assert "mla_norm 'qk_head': " in message and "kv_a_layernorm.weight" in message and "'none'" in message


def test_use_lora_layer_norm_and_full_kv_heads_are_honoured(tmp_path):
    source = tiny_model(dtype=torch.float32, mla_norm="lora", num_key_value_heads=4)
    hybrid = {"use_lora_layer_norm": True, "use_full_kv_head": True}
    write_released_layout(tmp_path, source, hybrid_overrides=hybrid, base_overrides={"num_key_value_heads": 2})
    (tmp_path / "model.safetensors").unlink()  # the files alone decide here
    config = ZebraConfig.from_pretrained(tmp_path)
    assert config.mla_norm == "lora"
    assert config.num_key_value_heads == config.num_attention_heads == 4


def test_lora_flag_contradicted_by_qk_norm_weights_is_an_error(tmp_path):
    write_released_layout(tmp_path, tiny_model(dtype=torch.float32), hybrid_overrides={"use_lora_layer_norm": True})
    with pytest.raises(ValueError, match="use_lora_layer_norm"):
        ZebraConfig.from_pretrained(tmp_path)
