"""Peak resident memory of a plain ``model.generate`` against prompt length: the long-context quickstart's Zebra.

A random ``tiny-16k`` Zebra (the quickstart's model, positions raised to fit the longest prompt), one prompt of
random tokens, greedy ``generate`` of ``--new-tokens`` tokens with no chunked prefill: what transformers,
LLaMA-Factory's chat and predict, and lm-eval do with a prompt. Each (path, length) runs in a process of its own
so that its peak (``ru_maxrss``) is its own; the table gives the peak above the process's resident memory just
before ``generate`` (the model, the prompt, torch itself) and the time of the call.

Paths (``--paths``): ``fused`` is the model as it ships on sdpa (on a CPU, MLA's attention through
``ops/fused_sdpa.py``); ``transformers`` registers transformers' own sdpa function under another name and loads
the model with it, which is what the MLA layers ran before (the math kernel: ``[heads, T, T]`` scores); ``eager``
is the plain reference, quadratic by design. A run whose resident memory passes ``--limit-gb`` is stopped and
shown as over the limit.

    OMP_NUM_THREADS=1 python benchmarks/bench_generate_memory.py
    OMP_NUM_THREADS=1 python benchmarks/bench_generate_memory.py --paths transformers --lengths 4k,8k,16k
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

PATHS = ("fused", "transformers", "eager")
TRANSFORMERS_SDPA = "sdpa_transformers"  # transformers' sdpa function, registered under a name of its own


def tokens(text: str) -> int:
    """``4k`` → 4096, ``1000`` → 1000."""
    return int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)


def child(length: int, path: str, new_tokens: int) -> dict[str, float]:
    """Run one generate in this process and return its memory and time."""
    import torch
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

    implementation = {"fused": "sdpa", "transformers": TRANSFORMERS_SDPA, "eager": "eager"}[path]
    if path == "transformers":
        AttentionInterface.register(TRANSFORMERS_SDPA, sdpa_attention_forward)
        AttentionMaskInterface.register(TRANSFORMERS_SDPA, sdpa_mask)
    positions = max(16384, length + new_tokens)
    config = ZebraConfig.from_preset(
        "tiny-16k", vocab_size=1024, pad_token_id=0, eos_token_id=None, max_position_embeddings=positions
    )
    config._attn_implementation = implementation
    torch.manual_seed(0)
    model = ZebraForCausalLM(config).eval()
    ids = torch.randint(1, config.vocab_size, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # a short warm-up, so one-off allocations are not counted as the prompt's
        model.generate(ids[:, :64], max_new_tokens=2, do_sample=False)
    before = _resident_mb()
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"before_mb": before, "peak_mb": peak, "seconds": seconds}


def _resident_mb(pid: str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(length: int, path: str, new_tokens: int, limit_gb: float) -> dict[str, float] | None:
    """One child process; ``None`` when its resident memory passed ``limit_gb`` (it is stopped then)."""
    command = [sys.executable, __file__, "--child", str(length), path, "--new-tokens", str(new_tokens)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    while process.poll() is None:
        try:
            if _resident_mb(str(process.pid)) > limit_gb * 1024:
                process.kill()
                process.wait()
                return None
        except FileNotFoundError:
            break
        time.sleep(0.05)
    output = process.stdout.read()
    if process.returncode != 0:
        raise RuntimeError(f"{path} at {length} tokens failed (exit {process.returncode})")
    return json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="4k,8k,16k,32k,64k", help="prompt lengths in tokens, e.g. 4k,8k")
    parser.add_argument("--paths", default="fused,transformers", help=f"comma-separated, of {', '.join(PATHS)}")
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--limit-gb", type=float, default=12.0, help="stop a run whose resident memory passes this")
    parser.add_argument("--child", nargs=2, metavar=("LENGTH", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(int(args.child[0]), args.child[1], args.new_tokens)))
        return
    paths = args.paths.split(",")
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"--paths: {', '.join(sorted(unknown))} unknown; use {', '.join(PATHS)}")
    lengths = [tokens(text) for text in args.lengths.split(",")]
    print("| path | prompt tokens | resident before generate (MB) | peak above it (MB) | generate (s) |")
    print("|---|---:|---:|---:|---:|")
    for path in paths:
        over = False
        for length in lengths:
            result = None if over else measure(length, path, args.new_tokens, args.limit_gb)
            if result is None:
                over = True  # a longer prompt needs more: not run
                print(f"| {path} | {length:,} | - | > {args.limit_gb:g} GB (stopped) | - |", flush=True)
                continue
            above = result["peak_mb"] - result["before_mb"]
            print(
                f"| {path} | {length:,} | {result['before_mb']:,.0f} | {above:,.0f} | {result['seconds']:.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
