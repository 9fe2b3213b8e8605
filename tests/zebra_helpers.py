"""Small builders shared by the model tests."""

import torch


def tiny_config(**overrides):
    from llamafactory_zebra import ZebraConfig

    values = {"vocab_size": 97}
    values.update(overrides)
    return ZebraConfig.from_preset("tiny", **values)


def tiny_model(dtype=torch.float64, attn_implementation="eager", **overrides):
    from llamafactory_zebra import ZebraForCausalLM

    config = tiny_config(**overrides)
    config._attn_implementation = attn_implementation
    return ZebraForCausalLM(config).to(dtype).eval()
