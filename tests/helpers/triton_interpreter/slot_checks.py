"""The slot-indexed ops (a serving engine's state cache) with fla's kernels forced, against their PyTorch paths.

Run as ``python -m triton_interpreter.slot_checks OUT.json`` (with ``tests/helpers/`` on ``sys.path``): it switches
Triton to its CPU interpreter before anything imports triton; ``checks.compare`` runs each case with
``ZEBRA_GDN_BACKEND=fla`` and ``torch``. Each case returns the op's output and the whole cache, so a slot
written wrongly, or one not indexed that changed, shows as an error. ``tests/ops/test_ops_in_slots_fla.py``
asserts the tolerances.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from triton_interpreter import checks  # first: importing it switches Triton to its interpreter

compare = checks.compare
CONV_WIDTH, CU_SEQLENS, HEADS, KEY_DIM, VALUE_DIM = (
    checks.CONV_WIDTH, checks.CU_SEQLENS, checks.HEADS, checks.KEY_DIM, checks.VALUE_DIM
)  # fmt: skip

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from llamafactory_zebra.ops import (  # noqa: E402
    causal_conv1d_in_slots,
    causal_conv1d_update_in_slots,
    chunk_gated_delta_rule_in_slots,
    fused_recurrent_gated_delta_rule_in_slots,
)

SLOTS = 7
STATE_INDICES = [5, 0, 3, 6]  # one per CU_SEQLENS segment; slots 1, 2 and 4 must stay as they were
HAS_INITIAL_STATE = [True, False, True, True]


def ssm_cache(gen: torch.Generator) -> torch.Tensor:
    """vLLM's ``[slots, H, V, K]`` fp32 storage, read as ``[slots, H, K, V]`` (as the serving layer does)."""
    return (torch.randn(SLOTS, HEADS, VALUE_DIM, KEY_DIM, generator=gen) * 0.5).transpose(-1, -2)


def token_inputs(gen: torch.Generator, tokens: int) -> list[torch.Tensor]:
    q = torch.randn(tokens, HEADS, KEY_DIM, generator=gen)
    k = torch.randn(tokens, HEADS, KEY_DIM, generator=gen)
    v = torch.randn(tokens, HEADS, VALUE_DIM, generator=gen)
    g = F.logsigmoid(torch.randn(tokens, HEADS, generator=gen) + 2.0)
    beta = torch.rand(tokens, HEADS, generator=gen)
    return [q, k, v, g, beta]


def decode_case() -> Callable:
    def run():
        gen = torch.Generator().manual_seed(11)
        cache = ssm_cache(gen)
        inputs = token_inputs(gen, len(STATE_INDICES))
        out = fused_recurrent_gated_delta_rule_in_slots(
            *inputs, cache, torch.tensor(STATE_INDICES), use_qk_l2norm_in_kernel=True
        )
        return {"output": out, "cache": cache}

    return run


def prefill_case() -> Callable:
    def run():
        gen = torch.Generator().manual_seed(12)
        cache = ssm_cache(gen)
        inputs = [t[None] for t in token_inputs(gen, CU_SEQLENS[-1])]
        out = chunk_gated_delta_rule_in_slots(
            *inputs, cache, torch.tensor(STATE_INDICES), torch.tensor(CU_SEQLENS, dtype=torch.int32),
            torch.tensor(HAS_INITIAL_STATE), use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        return {"output": out, "cache": cache}

    return run


def conv_case() -> Callable:
    def run():
        gen = torch.Generator().manual_seed(13)
        channels = HEADS * KEY_DIM
        cache = torch.randn(SLOTS, CONV_WIDTH - 1, channels, generator=gen).transpose(1, 2)
        x = torch.randn(1, CU_SEQLENS[-1], channels, generator=gen)
        weight = torch.randn(channels, CONV_WIDTH, generator=gen) * 0.5
        slots = torch.tensor(STATE_INDICES)
        y = causal_conv1d_in_slots(
            x, weight, cache, slots, torch.tensor(CU_SEQLENS, dtype=torch.int32), torch.tensor(HAS_INITIAL_STATE)
        )
        after_prefill = cache.clone()
        step = causal_conv1d_update_in_slots(x[0, : len(STATE_INDICES)].clone(), weight, cache, slots)
        return {"output": y, "cache_after_prefill": after_prefill, "decode": step, "cache": cache}

    return run


CASES = {"decode_in_slots_fp32": decode_case, "prefill_in_slots_fp32": prefill_case, "conv_in_slots_fp32": conv_case}


def main(out_path: str) -> None:
    torch.set_num_threads(1)
    results = {}
    for name, case in CASES.items():
        start = time.perf_counter()
        results[name] = compare(case()) | {"seconds": time.perf_counter() - start}
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
