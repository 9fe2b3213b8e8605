"""The serving layer's conv choice (the registry's, for ``serving/vllm/gdn.py``'s ``conv_in_slots_call``, built
once per layer) in the vLLM venv, where vLLM is installed: vLLM's C++ conv exactly for bf16 activations, a 4-wide
window and vLLM's default conv-state layout on its CPU platform, on a CPU with bf16 dot products; the project's conv
op otherwise."""

import pytest
import torch
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.platforms import current_platform

from llamafactory_zebra.kernels import Key, Op, select, this_machine
from llamafactory_zebra.serving.vllm.gdn import conv_in_slots_call


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("width", [4, 3])
def test_the_layer_runs_vllms_conv_exactly_where_it_can(dtype, width):
    vllm_conv_runs = (
        current_platform.is_cpu()
        and this_machine().cpu_bf16_dot_products
        and dtype == torch.bfloat16
        and width == 4
        and not is_conv_state_dim_first()
    )
    chosen = select(Op.CONV_IN_SLOTS, conv_in_slots_call(dtype, width)).kernel.key
    assert chosen == (Key.VLLM_CPP if vllm_conv_runs else Key.CONV_OP)
