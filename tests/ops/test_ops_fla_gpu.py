"""fla's Triton kernels against this package's PyTorch path, on a GPU (skipped without one or without fla).

They prove that the GPU path (fla) and the CPU path (PyTorch) compute the same function with the same
state layouts, so a cache or checkpoint moves between them. On a fresh machine fla compiles and
autotunes every kernel variant first (minutes): ``tools/gpu_check.sh`` runs the same checks at
Zebra's real shapes in one process, row by row; run this file with ``-v -s`` to see each case as it
finishes. The shapes are the real GDN's (``gdn_num_heads``, ``gdn_head_dim``, its value width).
On Hopper with Triton >= 3.4, < 3.7.1 fla refuses the gated backward (``kernels/known_issues.py``): the
backward cases fail there with fla's own message, which is the known issue, not a parity failure.
"""

import pytest
import torch
import torch.nn.functional as F

from llamafactory_zebra import ZebraConfig
from llamafactory_zebra.ops import (
    BACKEND_ENV_VAR,
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_torch,
    fused_recurrent_gated_delta_rule,
    fused_recurrent_gated_delta_rule_torch,
)

fla = pytest.importorskip("fla", reason="fla (pip fla-core) is not installed")
if not torch.cuda.is_available():
    pytest.skip("fla's kernels need a CUDA or ROCm GPU", allow_module_level=True)

DEVICE = "cuda"
REAL = ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-64k")
# Packed segments of uneven length, one shorter than the conv width, one of a single token.
CU = [0, 300, 301, 303, 700, 1000]


def gdn_inputs(
    length, heads=REAL.gdn_num_heads, key_dim=REAL.gdn_head_dim, value_dim=REAL.gdn_head_v_dim, num_seqs=1, seed=0
):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, length, heads, key_dim, generator=gen)
    k = torch.randn(1, length, heads, key_dim, generator=gen)
    v = torch.randn(1, length, heads, value_dim, generator=gen)
    g = F.logsigmoid(torch.randn(1, length, heads, generator=gen) + 3.0)
    beta = torch.rand(1, length, heads, generator=gen)
    h0 = torch.randn(num_seqs, heads, key_dim, value_dim, generator=gen) * 0.1
    bf16 = [t.to(DEVICE, torch.bfloat16) for t in (q, k, v)]
    return [*bf16, g.to(DEVICE), beta.to(DEVICE, torch.bfloat16), h0.to(DEVICE)]


def relative_error(actual, expected):
    return ((actual.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


@pytest.mark.parametrize("packed", [False, True])
def test_fla_chunk_matches_torch_forward_and_backward(packed, monkeypatch):
    monkeypatch.setenv(BACKEND_ENV_VAR, "fla")
    cu = torch.tensor(CU, device=DEVICE, dtype=torch.int32) if packed else None
    tensors = gdn_inputs(CU[-1], num_seqs=len(CU) - 1 if packed else 1)
    results = []
    for fn in (chunk_gated_delta_rule, chunk_gated_delta_rule_torch):
        leaves = [t.clone().requires_grad_() for t in tensors]
        o, state = fn(
            *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
        )
        (o.float().square().sum() + state.sum()).backward()
        results.append((o, state, [t.grad for t in leaves]))
    (o_fla, s_fla, g_fla), (o_pt, s_pt, g_pt) = results
    assert s_fla.dtype == s_pt.dtype == torch.float32
    assert relative_error(o_fla, o_pt) < 2e-2
    assert relative_error(s_fla, s_pt) < 2e-2
    for name, a, b in zip(("q", "k", "v", "g", "beta", "initial_state"), g_fla, g_pt, strict=True):
        assert relative_error(a, b) < 5e-2, name


def test_fla_fused_recurrent_continues_a_torch_prefill(monkeypatch):
    tensors = gdn_inputs(72, num_seqs=1)
    prefill = [t[:, :64] for t in tensors[:5]]
    _, state = chunk_gated_delta_rule_torch(*prefill, initial_state=tensors[5], output_final_state=True)
    steps = [t[:, 64:] for t in tensors[:5]]
    monkeypatch.setenv(BACKEND_ENV_VAR, "fla")
    o_fla, s_fla = fused_recurrent_gated_delta_rule(
        *steps, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    o_pt, s_pt = fused_recurrent_gated_delta_rule_torch(
        *steps, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    assert relative_error(o_fla, o_pt) < 2e-2
    assert relative_error(s_fla, s_pt) < 2e-2


def test_auto_backend_picks_fla_on_gpu(monkeypatch):
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

    monkeypatch.setenv(BACKEND_ENV_VAR, "auto")
    q, k, v, g, beta, _ = gdn_inputs(128)
    o_auto, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    o_fla, _ = fla_chunk(q=q, k=k, v=v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    assert torch.equal(o_auto, o_fla)


def test_fla_conv_matches_torch_with_borders_state_and_decode(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    channels = 96
    x = torch.randn(1, CU[-1], channels, generator=gen).to(DEVICE, torch.bfloat16)
    weight = torch.randn(channels, 4, generator=gen).to(DEVICE, torch.bfloat16)
    state = torch.randn(len(CU) - 1, channels, 4, generator=gen).to(DEVICE, torch.bfloat16)
    cu = torch.tensor(CU, device=DEVICE, dtype=torch.int32)
    outs = {}
    for backend in ("fla", "torch"):
        monkeypatch.setenv(BACKEND_ENV_VAR, backend)
        y, final = causal_conv1d(x, weight, initial_state=state, output_final_state=True, cu_seqlens=cu)
        step, cache = causal_conv1d_update(x[0, :5], final[:5].clone(), weight)
        outs[backend] = (y, final, step, cache)
    for name, a, b in zip(
        ("y", "final_state", "decode output", "decode cache"), outs["fla"], outs["torch"], strict=True
    ):
        assert a.shape == b.shape, name
        assert relative_error(a, b) < 2e-2, name
