"""fla's and Liger's Triton kernels, reached through this package's dispatch, against the PyTorch paths.

Run as ``python -m triton_interpreter.checks OUT.json [CASE ...]`` (with ``tests/helpers/`` on ``sys.path``): it
switches Triton to its CPU interpreter before anything imports triton, forces ``ZEBRA_GDN_BACKEND=fla``
for the fla side and ``torch`` for the reference, and writes per case the relative errors of every
output, final state and gradient, the shapes/dtypes of both sides, and which Triton kernels ran.
``tests/kernels/test_kernels_triton_interpreter.py`` runs it and asserts the tolerances.

Shapes are tiny (the interpreter runs every Triton program in numpy): two heads, K = 16, V = 32, an
odd length, packed segments including a single token and one shorter than the conv width.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from collections.abc import Callable

from triton_interpreter import interpreter

interpreter.enable()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from llamafactory_zebra.loss import fused_causal_lm_loss  # noqa: E402
from llamafactory_zebra.ops import (  # noqa: E402
    BACKEND_ENV_VAR,
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
)

HEADS, KEY_DIM, VALUE_DIM, CONV_WIDTH = 2, 16, 32, 4
LENGTH = 67
# Packed borders over 130 tokens: a single token, one shorter than the conv width, and an odd tail.
CU_SEQLENS = [0, 1, 3, 64, 130]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` (fla's own tests compare this way: bf16 rounding is noise
    spread over every element, a broken contract is an O(1) error)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    return ((actual - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def describe(tensor: torch.Tensor | None) -> list:
    return None if tensor is None else [list(tensor.shape), str(tensor.dtype).removeprefix("torch.")]


def compare(run: Callable[[], dict[str, torch.Tensor | None]]) -> dict:
    """``run`` once with fla forced and once with PyTorch; kernel launches are counted per side."""
    sides = {}
    for backend in ("fla", "torch"):
        os.environ[BACKEND_ENV_VAR] = backend
        interpreter.launched.clear()
        torch.manual_seed(0)
        sides[backend] = (run(), dict(interpreter.launched))
    (triton_out, kernels), (torch_out, torch_kernels) = sides["fla"], sides["torch"]
    errors, contract = {}, {}
    for name, expected in torch_out.items():
        actual = triton_out[name]
        contract[name] = [describe(actual), describe(expected)]
        if actual is not None and expected is not None and actual.shape == expected.shape:
            errors[name] = relative_error(actual, expected)
    return {"errors": errors, "contract": contract, "kernels": kernels, "torch_kernels": torch_kernels}


def gdn_inputs(dtype: torch.dtype, batch: int, length: int, num_seqs: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(batch, length, HEADS, KEY_DIM, generator=gen)
    k = torch.randn(batch, length, HEADS, KEY_DIM, generator=gen)
    v = torch.randn(batch, length, HEADS, VALUE_DIM, generator=gen)
    g = F.logsigmoid(torch.randn(batch, length, HEADS, generator=gen) + 2.0)
    beta = torch.rand(batch, length, HEADS, generator=gen)
    h0 = torch.randn(num_seqs, HEADS, KEY_DIM, VALUE_DIM, generator=gen) * 0.5
    # The layer's dtypes: q/k/v/beta in the model dtype, the log-decay and the state in fp32.
    return [q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype), h0]


def gdn_case(rule: Callable, dtype: torch.dtype, packed: bool, backward: bool) -> Callable:
    cu = torch.tensor(CU_SEQLENS, dtype=torch.int32) if packed else None
    batch, length = (1, CU_SEQLENS[-1]) if packed else (2, LENGTH)
    tensors = gdn_inputs(dtype, batch, length, len(CU_SEQLENS) - 1 if packed else batch)

    def run():
        leaves = [t.clone().requires_grad_(backward) for t in tensors]
        q, k, v, g, beta, h0 = leaves
        out, state = rule(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
        )
        result = {"output": out, "final_state": state}
        if backward:
            weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out.dtype)
            ((out * weights).float().sum() + state.square().sum()).backward()
            result |= {f"grad_{n}": t.grad for n, t in zip(("q", "k", "v", "g", "beta", "h0"), leaves, strict=True)}
        return result

    return run


def conv_case(dtype: torch.dtype) -> Callable:
    gen = torch.Generator().manual_seed(3)
    channels = HEADS * KEY_DIM
    x = torch.randn(1, CU_SEQLENS[-1], channels, generator=gen).to(dtype)
    weight = (torch.randn(channels, CONV_WIDTH, generator=gen) * 0.5).to(dtype)
    state = torch.randn(len(CU_SEQLENS) - 1, channels, CONV_WIDTH, generator=gen).to(dtype)
    cu = torch.tensor(CU_SEQLENS, dtype=torch.int32)

    def run():
        x_, w_ = x.clone().requires_grad_(), weight.clone().requires_grad_()
        y, final = causal_conv1d(
            x_, w_, activation="silu", initial_state=state, output_final_state=True, cu_seqlens=cu
        )
        y.float().square().sum().backward()
        cache = final.detach().clone()
        step, cache = causal_conv1d_update(x[0, :4].clone(), cache, weight, activation="silu")
        return {
            "output": y,
            "final_state": final,
            "grad_x": x_.grad,
            "grad_weight": w_.grad,
            "decode": step,
            "decode_cache": cache,
        }

    return run


def cross_entropy_case(dtype: torch.dtype) -> Callable:
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, LENGTH, 32, generator=gen).to(dtype)
    weight = (torch.randn(97, 32, generator=gen) * 0.3).to(dtype)
    labels = torch.randint(0, 97, (2, LENGTH), generator=gen)
    labels[0, :9] = labels[1, 40:] = -100

    def run():
        backend = "liger" if os.environ[BACKEND_ENV_VAR] == "fla" else "chunked"
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = fused_causal_lm_loss(h, w, labels, force=backend, num_items_in_batch=torch.tensor(100))
        loss.backward()
        return {"loss": loss, "grad_hidden": h.grad, "grad_weight": w.grad}

    return run


def training_step_case(dtype: torch.dtype) -> Callable:
    """One step of a two-layer tiny model (one GDN, one MLA layer) on two packed rows of 48 tokens: fla GDN + Liger CE
    against the PyTorch GDN + chunked CE; loss and every parameter's gradient."""
    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

    config = ZebraConfig.from_preset("tiny", vocab_size=97, num_hidden_layers=2, layer_types=["gdn", "mla"])
    config._attn_implementation = "sdpa"
    torch.manual_seed(5)
    model = ZebraForCausalLM(config).to(dtype).train()
    gen = torch.Generator().manual_seed(6)
    input_ids = torch.randint(0, 97, (2, 48), generator=gen)
    # LLaMA-Factory's packing: positions restart at each sample; row 1 holds one 2-token sample.
    position_ids = torch.cat([torch.arange(21), torch.arange(27), torch.arange(2), torch.arange(46)]).view(2, 48)
    labels = input_ids.masked_fill(position_ids == 0, -100)

    def run():
        replica = copy.deepcopy(model)
        fla = os.environ[BACKEND_ENV_VAR] == "fla"
        replica.enable_fused_cross_entropy("liger" if fla else "chunked")
        loss = replica(input_ids=input_ids, position_ids=position_ids, labels=labels).loss
        loss.backward()
        grads = {f"grad {name}": p.grad for name, p in replica.named_parameters()}
        every = torch.cat([g.flatten().float() for g in grads.values()])
        return {"loss": loss, "grad (all parameters)": every} | grads

    return run


CASES: dict[str, Callable[[], Callable]] = {}
for _dtype_name, _dtype in DTYPES.items():
    for _packed in (False, True):
        _layout = "varlen" if _packed else "batch"
        CASES[f"chunk_{_layout}_{_dtype_name}"] = lambda d=_dtype, p=_packed: gdn_case(
            chunk_gated_delta_rule, d, p, backward=True
        )
        CASES[f"fused_recurrent_{_layout}_{_dtype_name}"] = lambda d=_dtype, p=_packed: gdn_case(
            fused_recurrent_gated_delta_rule, d, p, backward=False
        )
    CASES[f"conv_varlen_{_dtype_name}"] = lambda d=_dtype: conv_case(d)
    CASES[f"liger_cross_entropy_{_dtype_name}"] = lambda d=_dtype: cross_entropy_case(d)
    CASES[f"training_step_{_dtype_name}"] = lambda d=_dtype: training_step_case(d)


def main(out_path: str, names: list[str]) -> None:
    torch.set_num_threads(1)
    results = {}
    for name in names or CASES:
        start = time.perf_counter()
        results[name] = compare(CASES[name]()) | {"seconds": time.perf_counter() - start}
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
