"""The serving layer's conv choice (``serving/vllm/gdn.py``'s ``uses_vllm_cpu_conv``) is the kernel registry's
``conv in slots`` entry on this machine (phase 1 of issue 36: the layer still decides with its own rule,
so the two rules are checked against each other; phase 2 makes the layer ask the registry)."""

import pytest
import torch
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.platforms import current_platform

from llamafactory_zebra.kernels import CONV_IN_SLOTS, Call, select, this_machine
from llamafactory_zebra.serving.vllm.gdn import uses_vllm_cpu_conv


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("width", [4, 3])
def test_the_layer_runs_vllms_conv_exactly_where_the_registry_says(dtype, width):
    call = Call.on(
        "cpu",
        dtype,
        width=width,
        conv_state_dim_first=is_conv_state_dim_first(),
        vllm_cpu_platform=current_platform.is_cpu(),
    )
    chosen = select(CONV_IN_SLOTS, call, this_machine()).kernel.key
    assert (chosen == "vllm-cpp") == uses_vllm_cpu_conv(dtype, width)
