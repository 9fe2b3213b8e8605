"""Output tokens/s: vLLM offline (``vllm.LLM.chat``) against LLaMA-Factory's HF engine, same checkpoint and prompts.

The two engines cannot share a venv (LLaMA-Factory 0.9.5 pins transformers<=5.6, vLLM 0.32 needs >=5.16.1),
so this driver runs three subprocesses: ``build`` (the checkpoint, in the LLaMA-Factory venv), ``hf``
(``llamafactory.chat.ChatModel`` with ``infer_backend: huggingface``: one request at a time, as its
engine serves them) and ``vllm`` (one ``LLM.chat`` call over all prompts: continuous batching), each
with this repository first on ``PYTHONPATH``, and prints one table.

The checkpoint (``llamafactory_zebra/testing/serving_checkpoint.py``): a random Zebra of ~100M parameters
with the released head shapes (MLA q/k 64+64, v 128,
latent 256, q rank 1344, 16/8 heads; GDN 6 heads, key 256, value 512) and a small hidden size, depth and
vocabulary (the offline test tokenizer's). Prompts: one user turn each, rendered by the ``zebra``
template with ``enable_thinking: false`` (both engines render the checkpoint's Qwen3 chat template), of
exactly ``--prompt-tokens`` tokens. vLLM ignores EOS so that each request emits ``--output-tokens``; the
HF engine stops at EOS, so the table counts the tokens each side actually produced. vLLM runs with its
defaults otherwise, torch.compile included (``--enforce-eager`` turns it off). Model load and engine start-up
(compilation too) are timed separately, not in tokens/s. Both sides compute on one thread (OMP_NUM_THREADS=1 for
the HF engine; vLLM's CPU worker binds one core and reserves the other); the CPU seconds of each side
(vLLM: its engine and worker processes) give a rate that holds up when other work shares the cores.

    python benchmarks/bench_serving.py [--hf-python .venv/bin/python] [--vllm-python .venv-vllm/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from llamafactory_zebra.kernels.run_dtype import AUTO, DTYPES, run_dtype
from llamafactory_zebra.testing.serving_checkpoint import build_checkpoint

REPO = Path(__file__).resolve().parent.parent
WORDS = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa".split()


def make_prompts(model_dir: Path, count: int, prompt_tokens: int) -> list[list[dict]]:
    """``count`` distinct user turns whose rendered prompt is exactly ``prompt_tokens`` tokens."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def length(text: str) -> int:
        messages = [{"role": "user", "content": text}]
        rendered = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )
        return len(tokenizer(rendered, add_special_tokens=False)["input_ids"])

    prompts = []
    for index in range(count):
        words = [f"{index}:"]
        while length(" ".join(words)) < prompt_tokens:
            words.append(WORDS[(index * 7 + len(words)) % len(WORDS)])
        text = " ".join(words)
        while length(text) > prompt_tokens:  # a word can add several tokens: trim characters
            text = text[:-1]
        if length(text) != prompt_tokens:
            raise RuntimeError(f"could not make prompt {index} exactly {prompt_tokens} tokens long")
        prompts.append([{"role": "user", "content": text}])
    return prompts


def run_hf(model_dir: Path, prompts: list[list[dict]], output_tokens: int, dtype: str) -> dict:
    from llamafactory.chat import ChatModel

    started = time.perf_counter()
    chat_model = ChatModel(
        {
            "model_name_or_path": str(model_dir),
            "template": "zebra",
            "enable_thinking": False,
            "infer_backend": "huggingface",
            "infer_dtype": dtype,
            "max_new_tokens": output_tokens,
            "do_sample": False,
        }
    )
    load_s = time.perf_counter() - started
    cpu_started = time.process_time()
    started = time.perf_counter()
    responses = []
    for index, messages in enumerate(prompts):
        responses.append(chat_model.chat(messages)[0])
        print(f"[hf] request {index + 1}/{len(prompts)}: {time.perf_counter() - started:.1f} s", flush=True)
    seconds = time.perf_counter() - started
    return {
        "load_s": load_s,
        "generate_s": seconds,
        "cpu_s": time.process_time() - cpu_started,
        "requests": len(responses),
        "prompt_tokens": sum(r.prompt_length for r in responses),
        "output_tokens": sum(r.response_length for r in responses),
    }


def process_tree_cpu_seconds() -> float:
    """CPU time of this process and its children (vLLM computes in an engine-core and a worker process)."""
    import psutil

    tree = [psutil.Process(), *psutil.Process().children(recursive=True)]
    return sum(sum(p.cpu_times()[:2]) for p in tree)


def run_vllm(
    model_dir: Path,
    prompts: list[list[dict]],
    output_tokens: int,
    dtype: str,
    max_num_batched_tokens: int,
    enforce_eager: bool,
    prefix_caching: bool,
) -> dict:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(
        str(model_dir),
        dtype=dtype,
        max_model_len=1024,
        enforce_eager=enforce_eager,
        max_num_seqs=len(prompts),
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=prefix_caching,
    )
    load_s = time.perf_counter() - started
    params = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)
    cpu_started = process_tree_cpu_seconds()
    started = time.perf_counter()
    outputs = llm.chat(prompts, params, chat_template_kwargs={"enable_thinking": False}, use_tqdm=False)
    seconds = time.perf_counter() - started
    return {
        "load_s": load_s,
        "generate_s": seconds,
        "cpu_s": process_tree_cpu_seconds() - cpu_started,
        "requests": len(outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids) for o in outputs),
        "output_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
    }


def run_side(args: argparse.Namespace) -> None:
    model_dir = Path(args.model_dir)
    if args.side == "build":
        result = build_checkpoint(model_dir, args.dtype)
    else:
        prompts = make_prompts(model_dir, args.num_prompts, args.prompt_tokens)
        if args.side == "hf" and args.hf_prompts:
            prompts = prompts[: args.hf_prompts]
        if args.side == "hf":
            result = run_hf(model_dir, prompts, args.output_tokens, args.dtype)
        else:
            result = run_vllm(
                model_dir,
                prompts,
                args.output_tokens,
                args.dtype,
                args.max_num_batched_tokens,
                args.enforce_eager,
                not args.no_prefix_caching,
            )
    Path(args.result).write_text(json.dumps(result))


def subprocess_side(python: str, side: str, args: argparse.Namespace, model_dir: Path, work: Path) -> dict:
    result = work / f"{side}.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
        "VLLM_NO_USAGE_STATS": "1",
    }
    command = [python, __file__, "--side", side, "--model-dir", str(model_dir), "--result", str(result)]
    command += ["--num-prompts", str(args.num_prompts), "--prompt-tokens", str(args.prompt_tokens)]
    command += ["--output-tokens", str(args.output_tokens), "--dtype", args.dtype]
    command += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.enforce_eager:
        command.append("--enforce-eager")
    if args.no_prefix_caching:
        command.append("--no-prefix-caching")
    if args.hf_prompts:
        command += ["--hf-prompts", str(args.hf_prompts)]
    print(f"[{side}] {' '.join(command)}", flush=True)
    subprocess.run(command, check=True, env=env, cwd=REPO)
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-python", default=str(REPO / ".venv/bin/python"), help="LLaMA-Factory's venv")
    parser.add_argument("--vllm-python", default=str(REPO / ".venv-vllm/bin/python"), help="scripts/vllm_env.sh")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument(
        "--hf-prompts",
        type=int,
        help="time the HF engine on the first N prompts only: it serves one request at a time, so its rate "
        "does not depend on how many wait (default: all)",
    )
    parser.add_argument(
        "--dtype", choices=[AUTO, *DTYPES], default=AUTO, help="auto: fp32 on a CPU without bf16 dot products"
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=512,
        help="vLLM's per-step token budget (vLLM's CPU default is 4096; on this 2-core machine the prefill of "
        "the 64 prompts took 44 s at 4096, 32 s at 1024, 30 s at 512, 29 s at 256: smaller steps stay in cache)",
    )
    parser.add_argument(
        "--enforce-eager",
        action="store_true",
        help="run vLLM without torch.compile (vLLM's default compiles: about 30 s more start-up here, counted in "
        "load s, and fused elementwise ops in every step)",
    )
    parser.add_argument(
        "--no-prefix-caching",
        action="store_true",
        help="run vLLM with prefix caching off (on is vLLM's default; these distinct prompts never hit, and "
        "caching keeps Zebra's GDN states in vLLM's align mode)",
    )
    parser.add_argument("--side", choices=["build", "hf", "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = run_dtype(args.dtype)
    if args.side:
        run_side(args)
        return
    for name, python in (("--hf-python", args.hf_python), ("--vllm-python", args.vllm_python)):
        if not Path(python).exists():
            sys.exit(f"error: {name} {python} does not exist (LLaMA-Factory's venv / bash scripts/vllm_env.sh)")

    with tempfile.TemporaryDirectory(prefix="bench_serving_") as tmp:
        work = Path(tmp)
        model_dir = work / "zebra-100m"
        built = subprocess_side(args.hf_python, "build", args, model_dir, work)
        results = {
            side: subprocess_side(python, side, args, model_dir, work)
            for side, python in (("hf", args.hf_python), ("vllm", args.vllm_python))
        }

    print(
        f"\nZebra, {built['parameters'] / 1e6:.1f}M parameters (released head shapes), {args.dtype}; "
        f"{args.num_prompts} prompts x {args.prompt_tokens} tokens in, up to {args.output_tokens} out; "
        f"{os.cpu_count()} CPUs, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
    )
    print(
        "| engine | load s | requests | generate s | CPU s | prompt tokens | output tokens | output tokens/s "
        "| output tokens per CPU s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    names = {"hf": "LLaMA-Factory ChatModel (huggingface)", "vllm": "vLLM LLM.chat (this plugin)"}
    rates, cpu_rates = {}, {}
    for side, result in results.items():
        rates[side] = result["output_tokens"] / result["generate_s"]
        cpu_rates[side] = result["output_tokens"] / result["cpu_s"]
        print(
            f"| {names[side]} | {result['load_s']:.1f} | {result['requests']} | {result['generate_s']:.1f} "
            f"| {result['cpu_s']:.1f} | {result['prompt_tokens']} | {result['output_tokens']} | {rates[side]:.1f} "
            f"| {cpu_rates[side]:.1f} |"
        )
    print(
        f"\nvLLM / HF output tokens/s: {rates['vllm'] / rates['hf']:.2f}x wall clock, "
        f"{cpu_rates['vllm'] / cpu_rates['hf']:.2f}x per CPU second (goal: >= 5x)"
    )


if __name__ == "__main__":
    main()
