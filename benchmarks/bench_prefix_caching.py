"""vLLM prefix caching on Zebra: time to first token and tokens/s with caching on against caching off.

Requests that share a long context (a document or system prompt of ``--context-tokens``) and differ in a
short question (``--question-tokens``), served offline by ``vllm.LLM`` on the ~100M released-shape Zebra of
``llamafactory_zebra/testing/serving_checkpoint.py`` (random weights). Per mode (one engine each, started in turn in this process):

1. one cold request (context + question 0; its prefill leaves the context's GDN state at a block border);
2. ``--requests`` requests one at a time, 1 output token each: the wall time of each call is its time to
   first token (median and max printed);
3. ``--requests`` new questions at once, ``--output-tokens`` each: wall time, output and total tokens/s,
   vLLM's own time-to-first-token per request (``RequestOutput.metrics``: arrival to first token).

Hit rate: cached prompt tokens over prompt tokens in steps 2-3 from each request's ``num_cached_tokens``,
and vLLM's own counters (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, all steps). Also printed:
the block size vLLM picks for these head shapes; prompts shorter than a block never hit.

    .venv-vllm/bin/python benchmarks/bench_prefix_caching.py [--context-tokens 2048] [--requests 8]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

from llamafactory_zebra.kernels.run_dtype import AUTO, DTYPES, run_dtype
from llamafactory_zebra.testing.serving_checkpoint import build_checkpoint


def token_prompts(vocab: int, context_tokens: int, question_tokens: int, count: int, seed: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (context_tokens,), generator=generator).tolist()
    generator = torch.Generator().manual_seed(seed)
    return [context + torch.randint(0, vocab, (question_tokens,), generator=generator).tolist() for _ in range(count)]


def counter(llm, name: str) -> float:
    return sum(getattr(metric, "value", 0) for metric in llm.get_metrics() if metric.name == name)


def generate(llm, prompt_list: list[list[int]], params) -> list:
    return llm.generate([{"prompt_token_ids": p} for p in prompt_list], params, use_tqdm=False)


def run_mode(model_dir: Path, caching: bool, args: argparse.Namespace, vocab: int) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(
        str(model_dir),
        dtype=args.dtype,
        max_model_len=args.context_tokens + args.question_tokens + args.output_tokens + 64,
        enforce_eager=not args.compile,
        max_num_seqs=args.requests,
        max_num_batched_tokens=args.max_num_batched_tokens,
        enable_prefix_caching=caching,
        skip_tokenizer_init=True,
        disable_log_stats=False,
        seed=0,
    )
    cache_config = llm.llm_engine.vllm_config.cache_config
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    many = SamplingParams(max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True, detokenize=False)

    cold_prompt, *serial_prompts = token_prompts(
        vocab, args.context_tokens, args.question_tokens, args.requests + 1, seed=1
    )
    started = time.perf_counter()
    generate(llm, [cold_prompt], one)
    cold_s = time.perf_counter() - started

    serial_ttft, prompt_tokens, cached_tokens = [], 0, 0
    for prompt in serial_prompts:
        started = time.perf_counter()
        (output,) = generate(llm, [prompt], one)
        serial_ttft.append(time.perf_counter() - started)
        prompt_tokens += len(prompt)
        cached_tokens += output.num_cached_tokens or 0

    batch_prompts = token_prompts(vocab, args.context_tokens, args.question_tokens, args.requests, seed=2)
    started = time.perf_counter()
    outputs = generate(llm, batch_prompts, many)
    batch_s = time.perf_counter() - started
    output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    batch_ttft = [o.metrics.first_token_latency for o in outputs if o.metrics is not None]
    prompt_tokens += sum(len(p) for p in batch_prompts)
    cached_tokens += sum(o.num_cached_tokens or 0 for o in outputs)
    result = {
        "block": cache_config.block_size,
        "mamba_mode": cache_config.mamba_cache_mode,
        "cold_s": cold_s,
        "ttft_median": statistics.median(serial_ttft),
        "ttft_max": max(serial_ttft),
        "batch_s": batch_s,
        "batch_ttft_median": statistics.median(batch_ttft) if batch_ttft else float("nan"),
        "output_tps": output_tokens / batch_s,
        "total_tps": (sum(len(p) for p in batch_prompts) + output_tokens) / batch_s,
        "hit_rate": cached_tokens / prompt_tokens,
        "cached_per_request": cached_tokens / (2 * args.requests),
        "vllm_hits": counter(llm, "vllm:prefix_cache_hits"),
        "vllm_queries": counter(llm, "vllm:prefix_cache_queries"),
    }
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context-tokens", type=int, default=2048)
    parser.add_argument("--question-tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument(
        "--dtype", choices=[AUTO, *DTYPES], default=AUTO, help="auto: fp32 on a CPU without bf16 dot products"
    )
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="as bench_serving.py (CPU: 512)")
    parser.add_argument("--compile", action="store_true", help="vLLM's torch.compile (about 30 s more per engine)")
    parser.add_argument(
        "--model-dir", help="an existing checkpoint (default: build serving_checkpoint.py's ~100M one)"
    )
    args = parser.parse_args()
    args.dtype = run_dtype(args.dtype)

    with tempfile.TemporaryDirectory(prefix="bench_prefix_") as tmp:
        model_dir = Path(args.model_dir or Path(tmp) / "zebra-100m")
        if not args.model_dir:
            build_checkpoint(model_dir, args.dtype)
        from transformers import AutoConfig

        vocab = AutoConfig.from_pretrained(model_dir).vocab_size
        results = {caching: run_mode(model_dir, caching, args, vocab) for caching in (False, True)}

    on, off = results[True], results[False]
    print(
        f"\nZebra ~100M (released head shapes), {args.dtype}, {args.requests} requests x ({args.context_tokens} shared "
        f"+ {args.question_tokens} own) tokens, {args.output_tokens} out in the batch; max_num_batched_tokens "
        f"{args.max_num_batched_tokens}, {'compiled' if args.compile else 'eager'}; {os.cpu_count()} CPUs"
    )
    print(
        f"block size vLLM picked: {on['block']} tokens with caching on ({on['mamba_mode']} mode), {off['block']} off; "
        f"a prompt shorter than {on['block']} tokens never hits"
    )
    print(
        "| prefix caching | cold request s | TTFT median s (one at a time) | TTFT max s | batch s "
        "| batch TTFT median s (vLLM) | output tokens/s | total tokens/s | hit rate | cached tokens/request "
        "| vLLM hits / queries |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in (("off", off), ("on", on)):
        print(
            f"| {name} | {r['cold_s']:.2f} | {r['ttft_median']:.3f} | {r['ttft_max']:.3f} | {r['batch_s']:.2f} "
            f"| {r['batch_ttft_median']:.3f} | {r['output_tps']:.1f} | {r['total_tps']:.0f} | {r['hit_rate']:.1%} "
            f"| {r['cached_per_request']:.0f} | {r['vllm_hits']:.0f} / {r['vllm_queries']:.0f} |"
        )
    print(
        f"\ncaching on / off: TTFT (one at a time) {off['ttft_median'] / on['ttft_median']:.1f}x faster, "
        f"batch output tokens/s {on['output_tps'] / off['output_tps']:.2f}x"
    )


if __name__ == "__main__":
    main()
