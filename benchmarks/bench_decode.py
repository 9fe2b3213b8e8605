"""Long-context prefill and decode on CPU: stock Zebra path vs chunked prefill + absorbed MLA decode,
with a Qwen3 of the same width as the baseline, all in the same run.

The model is a 4-layer Zebra (layer 1 MLA, the others GDN, as the released plan repeats) with the
released head shapes — 16 query / 8 key-value heads, q_lora 1344, kv_lora 256, nope 64 + rope 64,
v 128; GDN 6 heads × 256, expand_v 2 — at hidden 512 so the CPU can reach long contexts. Qwen3: same
width and depth, 16/8 heads of 128 dims, full attention in every layer.

Each point runs in a fresh interpreter (``subprocess_points``) so its ``ru_maxrss`` rise is its own:

- ``stock``: one-shot prefill, then decode through the expanding MLA path (every step re-expands
  every cached latent through ``kv_b_proj``: the forward keyword ``mla_cache_path="expand"``);
- ``chunked+absorbed``: prefill ``--chunk`` tokens per forward through the hybrid cache, then the
  absorbed decode (``kv_b_proj`` folded into queries and output);
- ``qwen3``: one-shot prefill and decode with transformers' ``DynamicCache``.

Decode ms/token is the mean over ``--new-tokens`` greedy steps; "GDN ms" is the time spent inside the
three GDN mixers per step (what should stay flat in context length).

    python benchmarks/bench_decode.py --lengths 4096 8192 --new-tokens 8 --threads 2
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

VARIANTS = ("stock", "chunked+absorbed", "qwen3")
HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 512, 1024, 4, 1024
# What the Zebra and the Qwen3 share: width, depth, attention heads, vocabulary.
SHARED = {
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "attn_implementation": "sdpa",
}


def zebra_model():
    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

    config = ZebraConfig(
        **SHARED,
        q_lora_rank=1344,
        kv_lora_rank=256,
        qk_nope_head_dim=64,
        qk_rope_head_dim=64,
        v_head_dim=128,
        gdn_num_heads=6,
        gdn_head_dim=256,
        gdn_expand_v=2,
    )
    return ZebraForCausalLM(config).eval()


def qwen3_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **SHARED,
        head_dim=128,
    )
    return Qwen3ForCausalLM(config).eval()


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_point(variant: str, length: int, chunk: int, new_tokens: int) -> dict:
    import torch

    from llamafactory_zebra.evaluation.prefill import chunked_prefill
    from llamafactory_zebra.layers.gated_deltanet import ZebraGatedDeltaNet
    from llamafactory_zebra.layers.mla import CACHE_PATH_KEYWORD, EXPAND

    torch.manual_seed(0)
    model = qwen3_model() if variant == "qwen3" else zebra_model()
    # The stock variant's decode steps expand every cached latent (the MLA layers' stock path).
    decode_options = {CACHE_PATH_KEYWORD: EXPAND} if variant == "stock" else {}
    ids = torch.randint(0, VOCAB, (1, length))
    gdn_seconds = [0.0]
    for module in model.modules():
        if isinstance(module, ZebraGatedDeltaNet):
            module.register_forward_pre_hook(
                lambda *_: gdn_seconds.__setitem__(0, gdn_seconds[0] - time.perf_counter())
            )
            module.register_forward_hook(lambda *_: gdn_seconds.__setitem__(0, gdn_seconds[0] + time.perf_counter()))

    with torch.no_grad():
        before = peak_mib()
        start = time.perf_counter()
        if variant == "chunked+absorbed":
            cache, logits = chunked_prefill(model, ids, chunk_size=chunk)
        else:
            out = model(ids, use_cache=True, logits_to_keep=1)
            cache, logits = out.past_key_values, out.logits[:, -1]
        prefill_s = time.perf_counter() - start
        prefill_peak = peak_mib() - before

        token = logits.argmax(-1, keepdim=True)
        gdn_seconds[0] = 0.0
        start = time.perf_counter()
        for step in range(new_tokens):
            position = torch.tensor([[length + step]])
            out = model(token, past_key_values=cache, position_ids=position, use_cache=True, **decode_options)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        decode_s = time.perf_counter() - start
    return {
        "variant": variant,
        "length": length,
        "prefill_s": prefill_s,
        "prefill_peak_mib": prefill_peak,
        "decode_ms_per_token": 1000 * decode_s / new_tokens,
        "gdn_ms_per_token": 1000 * gdn_seconds[0] / new_tokens,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--chunk", type=int, default=2048, help="prefill tokens per forward (chunked variant)")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch threads per point (default: torch's)")
    parser.add_argument("--point", nargs=2, metavar=("VARIANT", "LENGTH"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.point:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        print(json.dumps(run_point(args.point[0], int(args.point[1]), args.chunk, args.new_tokens)))
        return 0

    from subprocess_points import run_point as run_in_subprocess

    print(f"chunk {args.chunk}, {args.new_tokens} decode steps; ratios against 'stock' in the same run\n")
    print(
        "| T | variant | prefill s | prefill peak MiB | decode ms/token | GDN ms/token | decode speed-up | peak ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        rows = {}
        for variant in args.variants:
            extra = ["--chunk", str(args.chunk), "--new-tokens", str(args.new_tokens)]
            extra += ["--threads", str(args.threads)] if args.threads else []
            rows[variant] = run_in_subprocess(__file__, ["--point", variant, str(length), *extra])
        stock = rows.get("stock")
        for variant, row in rows.items():
            if row is None:
                print(f"| {length} | {variant} | killed (out of memory) | | | | | |")
                continue
            speedup = peak = "–"
            if stock is not None:
                speedup = f"{stock['decode_ms_per_token'] / row['decode_ms_per_token']:.2f}x"
                peak = f"{row['prefill_peak_mib'] / max(stock['prefill_peak_mib'], 1e-9):.3f}"
            gdn = f"{row['gdn_ms_per_token']:.1f}" if variant != "qwen3" else "–"
            print(
                f"| {length} | {variant} | {row['prefill_s']:.2f} | {row['prefill_peak_mib']:.0f} | "
                f"{row['decode_ms_per_token']:.1f} | {gdn} | {speedup} | {peak} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
