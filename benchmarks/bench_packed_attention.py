"""Peak memory and time of one MLA layer's forward + backward on a packed row: samples' borders vs dense mask.

Baseline ("dense"): what sdpa got for packed rows before, the ``[B, 1, T, T]`` block-causal mask
(``packing.block_causal_mask``, built inside the measured region as the model built it per forward)
handed to transformers' sdpa. New ("borders"): the samples' borders (``packing.flash_varlen_kwargs``)
and the kernel ``kernels.packed_attention`` picks for sdpa on this device
(``sdpa_per_segment`` on CPU). The layer has Zebra's real MLA shapes (hidden 2048, q rank 1344, kv rank
256, qk head 64 + 64, v head 128, ``qk_head`` norms) with fewer heads than the released 16 / 8 (default
2 / 1, the same 2:1 grouping) to keep the dense baseline's ``T x T`` work within minutes on a CPU.
The row holds ``--segments`` equal samples. Each point runs in a fresh subprocess; peak =
``ru_maxrss`` during forward + backward minus the resident set before it.

    python benchmarks/bench_packed_attention.py --lengths 8192 32768 --segments 8
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from subprocess_points import run_point


def measure(kind: str, length: int, segments: int, heads: int, kv_heads: int) -> dict:
    import torch

    from llamafactory_zebra import ZebraConfig
    from llamafactory_zebra.attention_policy import SDPA
    from llamafactory_zebra.kernels import packed_attention
    from llamafactory_zebra.layers.mla import ZebraMLA
    from llamafactory_zebra.modeling_zebra import ZebraRotaryEmbedding
    from llamafactory_zebra.packing import block_causal_mask, flash_varlen_kwargs, positions_within_segments

    torch.manual_seed(0)
    config = ZebraConfig.from_preset(
        "qwen3-1.7b-7mla21gdn-64k", num_attention_heads=heads, num_key_value_heads=kv_heads
    )
    config._attn_implementation = SDPA
    layer = ZebraMLA(config, layer_idx=0)
    segment_ids = torch.arange(length)[None] * segments // length + 1
    hidden = torch.randn(1, length, config.hidden_size, requires_grad=True)
    upstream = torch.randn(1, length, config.hidden_size)
    cos, sin = ZebraRotaryEmbedding(config)(hidden, positions_within_segments(segment_ids))
    baseline_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    if kind == "dense":
        inputs = {"attention_mask": block_causal_mask(segment_ids)}
    else:
        inputs = flash_varlen_kwargs(segment_ids)
    output, _ = layer(hidden, position_embeddings=(cos, sin), **inputs)
    objective = (output * upstream).sum()
    objective.backward()
    elapsed = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "kernel": "dense_mask" if kind == "dense" else packed_attention(SDPA, hidden.device.type).key,
        "objective": objective.item(),
        "grad_norm": hidden.grad.norm().item(),
        "seconds": elapsed,
        "peak_mib": (peak_kib - baseline_kib) / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--segments", type=int, default=8)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--point", nargs=2, metavar=("KIND", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    shape = ["--segments", str(args.segments), "--heads", str(args.heads), "--kv-heads", str(args.kv_heads)]
    if args.point:
        print(json.dumps(measure(args.point[0], int(args.point[1]), args.segments, args.heads, args.kv_heads)))
        return

    print(
        f"one MLA layer, forward + backward, fp32, CPU, {args.heads} query / {args.kv_heads} key-value heads, "
        f"{args.segments} samples per row; baseline: dense block-causal mask + sdpa"
    )
    print(
        "| T | borders kernel | borders peak MiB | dense peak MiB | memory ratio | borders s | dense s | time ratio "
        "| rel. objective diff | rel. grad-norm diff |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        # One case at a time, each in its own process: the dense one at 32K holds gigabytes.
        new = run_point(__file__, ["--point", "borders", str(length), *shape])
        dense = run_point(__file__, ["--point", "dense", str(length), *shape])
        if dense is None:
            print(
                f"| {length} | {new['kernel']} | {new['peak_mib']:.0f} | killed (out of memory) | – "
                f"| {new['seconds']:.2f} | – | – | – | – |"
            )
            continue
        objective = abs(new["objective"] - dense["objective"]) / abs(dense["objective"])
        grad = abs(new["grad_norm"] - dense["grad_norm"]) / dense["grad_norm"]
        print(
            f"| {length} | {new['kernel']} | {new['peak_mib']:.0f} | {dense['peak_mib']:.0f} "
            f"| {new['peak_mib'] / dense['peak_mib']:.3f} | {new['seconds']:.2f} | {dense['seconds']:.2f} "
            f"| {new['seconds'] / dense['seconds']:.2f} | {objective:.1e} | {grad:.1e} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
