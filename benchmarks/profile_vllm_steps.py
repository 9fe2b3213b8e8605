"""Where a vLLM engine step's time goes, per layer part, for the long-context Zebra and its dense Qwen3 twin.

The models are ``bench_serve_online.py``'s (a ~67M Zebra with the released head shapes and 1:3 MLA:GDN plan,
and the dense Qwen3 of the same parameter count). Each is run in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
eager, the engine's other options vLLM's defaults for ``vllm serve``) on ``--num-prompts`` random prompts of each
length, ``--output-len`` tokens out. Every module's forward and the GDN layer's op calls are timed by wall clock
(the work is synchronous on a CPU), each span counted once, in its innermost part:

- GDN: projections (``qkvg_proj``, ``a_proj``, ``b_proj``, ``o_proj``), gates, conv, chunked recurrence
  (prefill), state step (decode), gated output norm, the rest of the layer (splits, copies);
- MLA (Zebra) / attention (Qwen3): projections, norms, RoPE, vLLM's attention, the rest of the layer;
- MLP, the decoder's RMSNorms, embedding and logits, sampling and vLLM's own work around the model (the engine
  step's wall time less the model's forward).

A step whose tokens are all decodes is a decode step; any other a prefill step. The table gives ms per step
(prefill: per 1,000 prompt tokens too) and each part's share.

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/profile_vllm_steps.py [--lengths 2048 16384]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "6")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bench_serve_online import build_pair  # noqa: E402

from llamafactory_zebra.kernels.run_dtype import AUTO, DTYPES, run_dtype  # noqa: E402

# Module name (the last part of its qualified name) -> part, per mixer kind.
PARTS = {
    "qkvg_proj": "GDN projections",
    "a_proj": "GDN projections",
    "b_proj": "GDN projections",
    "o_norm": "GDN output norm",
    "q_a_proj": "attention projections",
    "q_b_proj": "attention projections",
    "q_proj": "attention projections",
    "kv_a_proj_with_mqa": "attention projections",
    "kv_b_proj": "attention projections",
    "out_proj": "attention projections",
    "qkv_proj": "attention projections",
    "q_a_layernorm": "attention norms",
    "kv_a_layernorm": "attention norms",
    "q_norm": "attention norms",
    "k_norm": "attention norms",
    "rotary_emb": "attention RoPE",
    "attn": "attention (vLLM kernel)",
    "mla": "attention rest",
    "self_attn": "attention rest",
    "gdn": "GDN rest",
    "mlp": "MLP",
    "input_layernorm": "decoder RMSNorms",
    "post_attention_layernorm": "decoder RMSNorms",
    "norm": "decoder RMSNorms",
    "embed_tokens": "embedding + logits",
    "lm_head": "embedding + logits",
    "logits_processor": "embedding + logits",
}
GDN_OPS = {
    "gdn_gates": "GDN gates",
    "causal_conv1d_in_slots": "GDN conv",
    "causal_conv1d_update_in_slots": "GDN conv",
    "causal_conv1d_fwd_cpu": "GDN conv",
    "causal_conv1d_update_cpu": "GDN conv",
    "chunk_gated_delta_rule_in_slots": "GDN chunked recurrence",
    "fused_recurrent_gated_delta_rule_in_slots": "GDN state step",
}
ORDER = [
    "GDN projections", "GDN gates", "GDN conv", "GDN chunked recurrence", "GDN state step", "GDN output norm",
    "GDN rest", "attention projections", "attention norms", "attention RoPE", "attention (vLLM kernel)",
    "attention rest", "MLP", "decoder RMSNorms", "embedding + logits", "model rest", "vLLM around the model",
]  # fmt: skip


class Timer:
    """Exclusive wall time per part: a span's time minus that of the spans inside it."""

    def __init__(self) -> None:
        self.stack: list[list] = []
        self.step: dict[str, float] = defaultdict(float)

    @contextlib.contextmanager
    def span(self, part: str):
        frame = [part, time.perf_counter(), 0.0]
        self.stack.append(frame)
        try:
            yield
        finally:
            self.stack.pop()
            elapsed = time.perf_counter() - frame[1]
            self.step[part] += elapsed - frame[2]
            if self.stack:
                self.stack[-1][2] += elapsed


def instrument(timer: Timer, model) -> None:
    """Time every module whose name has a part, and the GDN layer's op calls."""
    for name, module in model.named_modules():
        part = PARTS.get(name.rsplit(".", 1)[-1])
        if name.endswith(".gdn.o_proj"):
            part = "GDN projections"
        if part is None:
            continue
        module.forward = _timed(timer, part, module.forward)
    from llamafactory_zebra.serving.vllm import gdn

    for function, part in GDN_OPS.items():
        if hasattr(gdn, function):
            setattr(gdn, function, _timed(timer, part, getattr(gdn, function)))
        elif hasattr(gdn.vllm_ops, function):
            setattr(gdn.vllm_ops, function, _timed(timer, part, getattr(gdn.vllm_ops, function)))


def _timed(timer: Timer, part: str, function):
    @functools.wraps(function)
    def timed(*args, **kwargs):
        with timer.span(part):
            return function(*args, **kwargs)

    return timed


def profile(path: Path, lengths: list[int], args) -> dict:
    """Per length and step kind: summed part times (s), step count and prompt tokens."""
    import torch
    from vllm import LLM, SamplingParams

    timer = Timer()
    records: list[tuple[int, int, dict]] = []  # (tokens, decode requests, parts)
    with timed_engine_steps(timer, records):  # before the engine binds its step function
        llm = LLM(
            str(path), dtype=args.dtype, enforce_eager=True, max_model_len=max(lengths) + args.output_len + 64,
            max_num_batched_tokens=args.max_num_batched_tokens, skip_tokenizer_init=True, seed=0,
        )  # fmt: skip
        model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model
        instrument(timer, model)
        forward = model.forward

        @functools.wraps(forward)
        def timed_forward(*f_args, **f_kwargs):
            with timer.span("model rest"):
                return forward(*f_args, **f_kwargs)

        model.forward = timed_forward
        generator = torch.Generator().manual_seed(0)
        params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True, detokenize=False)
        results = {}
        try:
            for length in lengths:
                prompts = [
                    {
                        "prompt_token_ids": torch.randint(
                            0, model.config.vocab_size, (length,), generator=generator
                        ).tolist()
                    }
                    for _ in range(args.num_prompts)
                ]
                records.clear()
                llm.generate(prompts, params, use_tqdm=False)
                results[length] = summarize(records)
        finally:
            llm.llm_engine.engine_core.shutdown()
    return results


@contextlib.contextmanager
def timed_engine_steps(timer: Timer, records: list):
    """Time vLLM's engine steps and remember each step's scheduled tokens and decode requests."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    step, schedule = EngineCore.step, Scheduler.schedule
    scheduled: list[tuple[int, int]] = []

    def recording_schedule(self, *args, **kwargs):
        output = schedule(self, *args, **kwargs)
        tokens = output.num_scheduled_tokens
        decodes = sum(1 for request_id, count in tokens.items() if count == 1 and _decoding(self, request_id))
        scheduled.append((sum(tokens.values()), decodes))
        return output

    def timed_step(self):
        timer.step = defaultdict(float)
        scheduled.clear()
        started = time.perf_counter()
        outputs = step(self)
        total = time.perf_counter() - started
        parts = dict(timer.step)
        if parts and scheduled:
            parts["vLLM around the model"] = total - sum(parts.values())
            records.append((*scheduled[-1], parts))
        return outputs

    EngineCore.step, Scheduler.schedule = timed_step, recording_schedule
    try:
        yield
    finally:
        EngineCore.step, Scheduler.schedule = step, schedule


def _decoding(scheduler, request_id: str) -> bool:
    """Whether a request scheduled for one token is past its prompt (a decode, not a prompt's last token)."""
    request = scheduler.requests[request_id]
    return request.num_computed_tokens > request.num_prompt_tokens  # counted once scheduled


def summarize(records: list[tuple[int, int, dict]]) -> dict:
    kinds: dict[str, dict] = {}
    for tokens, decodes, parts in records:
        kind = "decode" if decodes == tokens else "prefill"
        entry = kinds.setdefault(kind, {"steps": 0, "tokens": 0, "parts": defaultdict(float)})
        entry["steps"] += 1
        entry["tokens"] += tokens - decodes
        for part, seconds in parts.items():
            entry["parts"][part] += seconds
    return kinds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 16384])
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument(
        "--dtype", choices=[AUTO, *DTYPES], default=AUTO, help="auto: fp32 on a CPU without bf16 dot products"
    )
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048, help="vllm serve's CPU default")
    parser.add_argument("--models", nargs="+", choices=["zebra", "qwen3"], default=["zebra", "qwen3"])
    args = parser.parse_args()
    args.dtype = run_dtype(args.dtype)
    with tempfile.TemporaryDirectory(prefix="profile_vllm_steps_") as tmp:
        models = build_pair(Path(tmp), args.dtype)
        results = {name: profile(models[name], args.lengths, args) for name in args.models}
    print(
        f"\nvLLM engine steps, in-process, eager, {args.dtype}, {args.num_prompts} prompts at once, "
        f"max_num_batched_tokens {args.max_num_batched_tokens}; ms per step (share of the step)"
    )
    columns = [(n, length, kind) for length in args.lengths for kind in ("prefill", "decode") for n in args.models]
    header = " | ".join(f"{n} {length} {kind}" for n, length, kind in columns)
    print(f"| part | {header} |")
    print("|---|" + "---:|" * len(columns))
    for part in [*ORDER, "whole step"]:
        cells = []
        for name, length, kind in columns:
            entry = results[name][length].get(kind)
            if entry is None:
                cells.append("")
                continue
            total = sum(entry["parts"].values())
            seconds = total if part == "whole step" else entry["parts"].get(part, 0.0)
            cells.append(f"{1000 * seconds / entry['steps']:.1f} ({100 * seconds / total:.0f}%)" if seconds else "")
        if any(cells):
            print(f"| {part} | " + " | ".join(cells) + " |")
    steps = []
    for name, length, kind in columns:
        entry = results[name][length].get(kind)
        if entry:
            per_k = ""
            if kind == "prefill":
                per_k = f", {1e6 * sum(entry['parts'].values()) / entry['tokens']:.0f} ms per 1k prompt tokens"
            steps.append(f"{name} {length} {kind}: {entry['steps']} steps{per_k}")
    print("\n" + "; ".join(steps))


if __name__ == "__main__":
    main()
