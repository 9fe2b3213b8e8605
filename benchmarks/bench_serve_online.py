"""Online serving at long prompts: ``vllm bench serve`` against ``vllm serve``, Zebra against the dense Qwen3 it replaces.

Two checkpoints with random weights and the same tokenizer (the offline test tokenizer): a ~67M Zebra with the
released head shapes (MLA q/k 64+64, v 128, latent 256, 16/8 heads; GDN 6 heads, key 256, value 512) and the
released 1:3 MLA:GDN plan over 8 layers, and a dense Qwen3 of the same parameter count (vLLM's own
``Qwen3ForCausalLM``): the same width, depth and attention heads (16/8 of 128), its MLP widened until the counts
match. Both take positions up to 64k. Each is served by ``vllm serve`` on 127.0.0.1 (a free port, the same engine
options for both: vLLM's defaults but the dtype and ``--max-model-len``), once eager and, at ``--compile-lengths``,
once compiled (vLLM's default mode), warmed up by one unrecorded round of short prompts, and measured by
``vllm bench serve`` with its ``random`` dataset: ``--num-prompts`` prompts of each length at once (``--ignore-eos``,
so every request emits ``--output-len`` tokens), ``--repeats`` times, each time with another seed (no prompt shares
a prefix with an earlier one, so prefix caching never hits).

Prints one table: per length and mode, Zebra's and Qwen3's output tok/s, TTFT p50 and ITL p50 (the median over the
repeats, with the range), the measured Zebra/Qwen3 output tok/s ratio and the FLOP ratio (Qwen3's FLOPs over
Zebra's per request, ``llamafactory_zebra.planning.flops``) beside it, and their quotient: how efficiently the
hybrid's layers run against vLLM's dense path. Then the capacity at ``--capacity-len`` tokens: each model's server
started once more with that ``--max-model-len`` in the same ``VLLM_CPU_KVCACHE_SPACE``, and the cache size and the
maximum concurrency vLLM reports at start-up. Every table's caption carries this CPU's bf16 and fp32 matrix-multiply
rates (``kernels/run_dtype.py``'s probe, measured in this process before the servers start): a CPU without bf16 dot
products emulates bf16 many times slower than fp32, so ``--dtype auto`` (the default) serves in fp32 there
(``run_dtype``) and in bf16 elsewhere.

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/bench_serve_online.py \
        [--lengths 256 2048 8192 16384] [--compile-lengths 2048 16384] [--repeats 2]

Long prompts need cache space: ``VLLM_CPU_KVCACHE_SPACE`` defaults to 6 GiB here (4 dense 16k requests hold 2 GiB).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from dense_twin import qwen3_config

from llamafactory_zebra.kernels.run_dtype import AUTO, DTYPES, describe_rates, matmul_rates, run_dtype
from llamafactory_zebra.testing.serving_checkpoint import build_checkpoint

REPO = Path(__file__).resolve().parent.parent
VLLM = Path(sys.executable).parent / "vllm"
METRICS = "ttft,tpot,itl,e2el"
PERCENTILES = "50,90,99"
MAX_POSITIONS = 65536
# The dense twin's attention heads are 128 wide, as the released Qwen3s'.
QWEN3_HEAD_DIM = 128
# The released head shapes at 512 wide and 8 deep, MLA where the released 28-layer plan has it (every fourth
# layer from the second): ~67M parameters.
LONG_CONTEXT_ZEBRA = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "layer_types": ["gdn", "mla", "gdn", "gdn", "gdn", "mla", "gdn", "gdn"],
    "max_position_embeddings": MAX_POSITIONS,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}


def build_dense_qwen3(output: Path, zebra_dir: Path, dtype: str, parameters: int) -> int:
    """A Qwen3 with the Zebra checkpoint's width, depth, attention heads and tokenizer, and an MLP as wide as
    makes its parameter count ``parameters`` (to a multiple of 64 in the MLP width)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen3ForCausalLM

    zebra = AutoConfig.from_pretrained(zebra_dir)

    def count(intermediate_size: int) -> int:
        config = qwen3_config(zebra, intermediate_size, QWEN3_HEAD_DIM)
        with torch.device("meta"):
            return sum(p.numel() for p in Qwen3ForCausalLM(config).parameters())

    per_unit = 3 * zebra.hidden_size * zebra.num_hidden_layers  # gate, up and down rows per MLP unit
    width = zebra.intermediate_size + round((parameters - count(zebra.intermediate_size)) / per_unit / 64) * 64
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config(zebra, width, QWEN3_HEAD_DIM)).to(getattr(torch, dtype))
    model.save_pretrained(output)
    AutoTokenizer.from_pretrained(zebra_dir).save_pretrained(output)
    return sum(p.numel() for p in model.parameters())


def build_pair(work: Path, dtype: str) -> dict[str, Path]:
    """The Zebra and its dense twin under ``work``; returns their directories by name."""
    zebra_dir, qwen3_dir = work / "zebra", work / "qwen3"
    parameters = build_checkpoint(zebra_dir, dtype, LONG_CONTEXT_ZEBRA)["parameters"]
    build_dense_qwen3(qwen3_dir, zebra_dir, dtype, parameters)
    return {"zebra": zebra_dir, "qwen3": qwen3_dir}


def flop_ratio(models: dict[str, Path], prompt_tokens: int, output_tokens: int) -> float:
    """Qwen3's FLOPs over Zebra's for one request (``planning/flops.py``), from the models built on meta."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import llamafactory_zebra  # noqa: F401  (registers model_type zebra)
    from llamafactory_zebra.planning.flops import flop_shape

    flops = {}
    for name, path in models.items():
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
        flops[name] = flop_shape(model).request(prompt_tokens, output_tokens)
    return flops["qwen3"] / flops["zebra"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_healthy(port: int, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {server.returncode} before /health answered")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(2)
    raise TimeoutError(f"vllm serve did not answer /health on 127.0.0.1:{port} within {timeout_s:.0f} s")


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def serve_and_bench(
    names: list[str],
    models: dict[str, Path],
    lengths: list[int],
    compiled: bool,
    args,
    work: Path,
    environments: dict[str, dict[str, str]] | None = None,
):
    """Start ``vllm serve`` for each of ``names`` at once (``environments``: extra variables per name), warm each
    up, then run ``vllm bench serve`` ``args.repeats`` times per length, the models in turn within each repeat;
    results by model and length.

    One name at a time is the plain comparison; several (``--interleave``) put each repeat's runs of the models
    minutes apart rather than a whole model's runs apart, so load from other work shifts both sides alike."""
    mode = "compiled" if compiled else "eager"
    servers: dict[str, tuple[subprocess.Popen, int, Path]] = {}
    results: dict[str, dict[int, list[dict]]] = {name: {} for name in names}
    try:
        for name in names:
            port = free_port()
            command = [str(VLLM), "serve", str(models[name]), "--host", "127.0.0.1", "--port", str(port)]
            command += ["--dtype", args.dtype, "--max-model-len", str(max(lengths) + args.output_len + 64)]
            command += ["--served-model-name", name]
            if not compiled:
                command.append("--enforce-eager")
            if name == "zebra" and args.mamba_ssm_cache_dtype != "auto":
                command += ["--mamba-ssm-cache-dtype", args.mamba_ssm_cache_dtype]
            log_path = work / f"{name}-{mode}-server.log"
            print(f"[{name} {mode}] {' '.join(command)}", flush=True)
            with log_path.open("w") as log:
                env = {**os.environ, **(environments or {}).get(name, {})}
                server = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work, env=env
                )
            servers[name] = (server, port, log_path)
            wait_healthy(port, server, args.start_timeout)
        for name, (_, port, _) in servers.items():
            warm_up(name, models[name], port, args, work)
        for length in lengths:
            for repeat in range(args.repeats):
                for name, (_, port, _) in servers.items():
                    r = bench_once(name, models[name], port, length, repeat, args, work)
                    results[name].setdefault(length, []).append(r)
                    print(
                        f"[{name} {mode}] {length} tokens, run {repeat + 1}: {r['output_throughput']:.2f} output tok/s, "
                        f"TTFT p50 {r['p50_ttft_ms']:.0f} ms, ITL p50 {r['p50_itl_ms']:.1f} ms",
                        flush=True,
                    )
    except Exception:
        for _, _, log_path in servers.values():
            print(log_path.read_text()[-4000:], file=sys.stderr)
        raise
    finally:
        for server, _, _ in servers.values():
            stop(server)
    return results


CAPACITY_LINE = re.compile(
    r"KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x"
)


def capacity(
    name: str, model_dir: Path, tokens: int, args, work: Path, extra: tuple[str, ...] = ()
) -> tuple[int, float]:
    """The cache size (tokens) and maximum concurrency vLLM reports for ``tokens``-token requests (``extra``: more
    ``vllm serve`` options)."""
    port = free_port()
    command = [str(VLLM), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--enforce-eager"]
    command += ["--dtype", args.dtype, "--max-model-len", str(tokens), "--served-model-name", name, *extra]
    log_path = work / f"{name}-capacity-server.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
        try:
            wait_healthy(port, server, args.start_timeout)
        finally:
            stop(server)
    found = CAPACITY_LINE.search(log_path.read_text())
    if found is None:
        raise RuntimeError(f"{name}: vLLM printed no KV cache capacity line; see {log_path}")
    return int(found[1].replace(",", "")), float(found[3])


def client_command(name: str, model_dir: Path, port: int, length: int, output_len: int, seed: int, args) -> list[str]:
    """``vllm bench serve``: ``--num-prompts`` random prompts of ``length`` tokens at once, ``output_len`` out each."""
    client = [str(VLLM), "bench", "serve", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}"]
    client += ["--model", name, "--tokenizer", str(model_dir), "--dataset-name", "random"]
    client += ["--random-input-len", str(length), "--random-output-len", str(output_len)]
    client += ["--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.num_prompts)]
    client += ["--request-rate", "inf", "--ignore-eos", "--seed", str(seed), "--disable-tqdm"]
    return client


def warm_up(name: str, model_dir: Path, port: int, args, work: Path) -> None:
    """One unrecorded round of short prompts, as many at once as the measured runs send: a compiled server's
    first prefill and decode batches pay for compiling their shapes (docs/benchmarks.md, online serving)."""
    client = client_command(name, model_dir, port, 256, 8, 7, args)
    subprocess.run(client, check=True, timeout=args.client_timeout, cwd=work, stdout=subprocess.DEVNULL)


def bench_once(name: str, model_dir: Path, port: int, length: int, repeat: int, args, work: Path) -> dict:
    filename = f"{name}-{length}-{repeat}.json"
    # A seed per (length, repeat): no prompt repeats or extends an earlier one, so the prefix cache never hits.
    client = client_command(name, model_dir, port, length, args.output_len, 1000 * repeat + length, args)
    client += ["--percentile-metrics", METRICS, "--metric-percentiles", PERCENTILES]
    client += ["--save-result", "--result-dir", str(work), "--result-filename", filename]
    subprocess.run(client, check=True, timeout=args.client_timeout, cwd=work, stdout=subprocess.DEVNULL)
    result = json.loads((work / filename).read_text())
    if result["completed"] != args.num_prompts:
        raise RuntimeError(f"{name} at {length} tokens: {result['completed']} of {args.num_prompts} requests done")
    return result


def spread(values: list[float], digits: int) -> str:
    """The median, and the range when there is more than one run."""
    median = f"{statistics.median(values):.{digits}f}"
    return median if len(values) == 1 else f"{median} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="*", default=[256, 2048, 8192, 16384])
    parser.add_argument("--compile-lengths", type=int, nargs="*", default=[2048, 16384])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per run, all sent at once")
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument(
        "--dtype", choices=[AUTO, *DTYPES], default=AUTO, help="auto: fp32 on a CPU without bf16 dot products"
    )
    parser.add_argument("--models", nargs="+", choices=["zebra", "qwen3"], default=["zebra", "qwen3"])
    parser.add_argument("--capacity-len", type=int, default=32768, help="0 skips the capacity row")
    parser.add_argument(
        "--interleave", action="store_true",
        help="serve the models at once and run them in turn per repeat (a machine loaded by other work)",
    )  # fmt: skip
    parser.add_argument(
        "--mamba-ssm-cache-dtype", choices=["auto", "float32", "bfloat16"], default="auto",
        help="the Zebra's GDN state dtype (vLLM's option; auto: the plugin's fp32)",
    )  # fmt: skip
    parser.add_argument("--start-timeout", type=float, default=900, help="seconds to wait for /health")
    parser.add_argument("--client-timeout", type=float, default=3600, help="seconds per vllm bench serve run")
    args = parser.parse_args()
    args.dtype = run_dtype(args.dtype)
    rates = describe_rates(matmul_rates())
    print(f"{rates}; serving in {args.dtype}", flush=True)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "6")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

    modes = [(False, args.lengths), (True, args.compile_lengths)]
    with tempfile.TemporaryDirectory(prefix="bench_serve_online_") as tmp:
        work = Path(tmp)
        models = build_pair(work, args.dtype)
        every_length = sorted(set(args.lengths) | set(args.compile_lengths))
        ratios = {length: flop_ratio(models, length, args.output_len) for length in every_length}
        groups = [args.models] if args.interleave else [[name] for name in args.models]
        results = {
            (name, compiled): by_length
            for compiled, lengths in modes
            if lengths
            for names in groups
            for name, by_length in serve_and_bench(names, models, lengths, compiled, args, work).items()
        }
        capacities = {
            name: capacity(name, models[name], args.capacity_len, args, work)
            for name in (args.models if args.capacity_len else [])
        }

    print(
        f"\nvllm bench serve, random dataset: {args.num_prompts} prompts at once, {args.output_len} tokens out "
        f"(ignore EOS), {args.repeats} runs per point (median, range), "
        f"{'the models in turn per run' if args.interleave else 'one model after the other'}; {args.dtype}; "
        f"{os.cpu_count()} CPUs; "
        f"Zebra 1:3 MLA:GDN (GDN state {args.mamba_ssm_cache_dtype}) vs dense Qwen3 of the same parameter count; "
        f"{rates}"
    )
    print(
        "| prompt tokens | mode | Zebra output tok/s | Qwen3 output tok/s | Zebra/Qwen3 | FLOP ratio | efficiency "
        "| TTFT p50 s Zebra / Qwen3 | ITL p50 ms Zebra / Qwen3 |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for compiled, lengths in modes:
        for length in lengths:
            zebra, qwen3 = results.get(("zebra", compiled), {}), results.get(("qwen3", compiled), {})
            if length not in zebra or length not in qwen3:
                continue
            z_tps = [r["output_throughput"] for r in zebra[length]]
            q_tps = [r["output_throughput"] for r in qwen3[length]]
            ratio = [z / q for z, q in zip(z_tps, q_tps, strict=True)]
            ttft = [r["p50_ttft_ms"] / 1000 for r in zebra[length]], [r["p50_ttft_ms"] / 1000 for r in qwen3[length]]
            itl = [r["p50_itl_ms"] for r in zebra[length]], [r["p50_itl_ms"] for r in qwen3[length]]
            print(
                f"| {length} | {'compiled' if compiled else 'eager'} | {spread(z_tps, 2)} | {spread(q_tps, 2)} "
                f"| {spread(ratio, 2)}x | {ratios[length]:.2f}x | {statistics.median(ratio) / ratios[length]:.2f} "
                f"| {spread(ttft[0], 1)} / {spread(ttft[1], 1)} | {spread(itl[0], 1)} / {spread(itl[1], 1)} |"
            )

    if capacities:
        space = os.environ["VLLM_CPU_KVCACHE_SPACE"]
        print(
            f"\nCapacity at {args.capacity_len} tokens per request, VLLM_CPU_KVCACHE_SPACE={space} GiB ({args.dtype}; "
            f"{rates})"
        )
        print("| model | cache size, tokens | maximum concurrency |")
        print("|---|---:|---:|")
        for name, (tokens, concurrency) in capacities.items():
            print(f"| {name} | {tokens:,} | {concurrency:.2f}x |")


if __name__ == "__main__":
    main()
