"""Online serving with vLLM's own client: ``vllm bench serve`` against ``vllm serve``, Zebra against dense Qwen3.

Two checkpoints with random weights and the same tokenizer (the offline test tokenizer): the ~100M Zebra
with the released head shapes from ``llamafactory_zebra/testing/serving_checkpoint.py``, and a dense Qwen3 of the same size (vLLM's own
``Qwen3ForCausalLM``): the same width, depth and attention heads (Qwen3-1.7B's 16/8 of 128), its MLP
widened until the parameter counts match (Zebra's GDN and MLA projections are wider than Qwen3's attention). Each is served by ``vllm serve`` on 127.0.0.1
(a free port, the same engine options for both) and measured by ``vllm bench serve`` with its ``random``
dataset (fixed-length prompts, ``--ignore-eos`` so every request emits ``--output-len`` tokens) at each
``--concurrency``; the server is stopped by its process group before the next one starts. Prints one table:
request and token throughput, TTFT, TPOT and inter-token latency percentiles, and the Zebra / Qwen3 ratios.

    .venv-vllm/bin/python benchmarks/bench_serve_online.py [--num-prompts 32] [--concurrency 2 16]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from llamafactory_zebra.testing.serving_checkpoint import MODEL_OVERRIDES, build_checkpoint

REPO = Path(__file__).resolve().parent.parent
VLLM = Path(sys.executable).parent / "vllm"
METRICS = "ttft,tpot,itl,e2el"
PERCENTILES = "50,90,99"


def build_dense_qwen3(output: Path, zebra_dir: Path, dtype: str, parameters: int) -> int:
    """A Qwen3 with the Zebra checkpoint's width, depth, attention heads and tokenizer, and an MLP as wide as
    makes its parameter count ``parameters`` (to a multiple of 64 in the MLP width)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, Qwen3ForCausalLM

    zebra = AutoConfig.from_pretrained(zebra_dir)

    def count(intermediate_size: int) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in Qwen3ForCausalLM(qwen3_config(zebra, intermediate_size)).parameters())

    per_unit = 3 * zebra.hidden_size * zebra.num_hidden_layers  # gate, up and down rows per MLP unit
    width = zebra.intermediate_size + round((parameters - count(zebra.intermediate_size)) / per_unit / 64) * 64
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(qwen3_config(zebra, width)).to(getattr(torch, dtype))
    model.save_pretrained(output)
    AutoTokenizer.from_pretrained(zebra_dir).save_pretrained(output)
    return sum(p.numel() for p in model.parameters())


def qwen3_config(zebra, intermediate_size: int):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=zebra.vocab_size,
        hidden_size=zebra.hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=zebra.num_hidden_layers,
        num_attention_heads=zebra.num_attention_heads,
        num_key_value_heads=zebra.num_key_value_heads,
        head_dim=128,
        max_position_embeddings=MODEL_OVERRIDES["max_position_embeddings"],
        rope_parameters=MODEL_OVERRIDES["rope_parameters"],
        tie_word_embeddings=False,
        eos_token_id=zebra.eos_token_id,
        pad_token_id=zebra.pad_token_id,
        bos_token_id=None,
    )


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


def serve_and_bench(name: str, model_dir: Path, args: argparse.Namespace, work: Path) -> dict[int, dict]:
    port = free_port()
    command = [str(VLLM), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    command += ["--dtype", args.dtype, "--max-model-len", str(args.input_len + args.output_len + 64)]
    command += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    command += ["--max-num-seqs", str(max(args.concurrency)), "--served-model-name", name]
    if not args.compile:
        command.append("--enforce-eager")
    log = (work / f"{name}-server.log").open("w")
    print(f"[{name}] {' '.join(command)}", flush=True)
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=work)
    results = {}
    try:
        wait_healthy(port, server, args.start_timeout)
        for concurrency in args.concurrency:
            filename = f"{name}-c{concurrency}.json"
            client = [str(VLLM), "bench", "serve", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}"]
            client += ["--model", name, "--tokenizer", str(model_dir), "--dataset-name", "random"]
            client += ["--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len)]
            client += ["--num-prompts", str(args.num_prompts), "--max-concurrency", str(concurrency)]
            client += ["--request-rate", "inf", "--ignore-eos", "--seed", "0", "--disable-tqdm"]
            client += ["--percentile-metrics", METRICS, "--metric-percentiles", PERCENTILES]
            client += ["--save-result", "--result-dir", str(work), "--result-filename", filename]
            print(f"[{name}] {' '.join(client)}", flush=True)
            subprocess.run(client, check=True, timeout=args.client_timeout, cwd=work)
            results[concurrency] = json.loads((work / filename).read_text())
    except Exception:
        log.flush()
        print((work / f"{name}-server.log").read_text()[-4000:], file=sys.stderr)
        raise
    finally:
        stop(server)
        log.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--max-num-batched-tokens", type=int, default=512, help="as bench_serving.py (CPU: 512)")
    parser.add_argument("--compile", action="store_true", help="vLLM's torch.compile (about 30 s more per server)")
    parser.add_argument("--start-timeout", type=float, default=600, help="seconds to wait for /health")
    parser.add_argument("--client-timeout", type=float, default=900, help="seconds per vllm bench serve run")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

    with tempfile.TemporaryDirectory(prefix="bench_serve_online_") as tmp:
        work = Path(tmp)
        zebra_dir, qwen3_dir = work / "zebra-100m", work / "qwen3-dense"
        sizes = {"zebra": build_checkpoint(zebra_dir, args.dtype)["parameters"]}
        sizes["qwen3"] = build_dense_qwen3(qwen3_dir, zebra_dir, args.dtype, sizes["zebra"])
        results = {
            name: serve_and_bench(name, path, args, work)
            for name, path in (("zebra", zebra_dir), ("qwen3", qwen3_dir))
        }

    print(
        f"\nvllm bench serve, random dataset: {args.num_prompts} prompts x {args.input_len} tokens in, "
        f"{args.output_len} out (ignore EOS), request rate inf; {args.dtype}, max_num_batched_tokens "
        f"{args.max_num_batched_tokens}, {'compiled' if args.compile else 'eager'}; {os.cpu_count()} CPUs; "
        f"Zebra {sizes['zebra'] / 1e6:.1f}M, Qwen3 {sizes['qwen3'] / 1e6:.1f}M parameters"
    )
    print(
        "| model | concurrency | req/s | output tok/s | total tok/s | TTFT p50 / p90 / p99 ms "
        "| TPOT p50 ms | ITL p50 / p90 / p99 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, label in (("zebra", "Zebra (this plugin)"), ("qwen3", "Qwen3 dense (vLLM's own)")):
        for concurrency, r in results[name].items():
            if r["completed"] != args.num_prompts:
                raise RuntimeError(f"{name} at concurrency {concurrency}: {r['completed']} of {args.num_prompts} done")
            print(
                f"| {label} | {concurrency} | {r['request_throughput']:.2f} | {r['output_throughput']:.1f} "
                f"| {r['total_token_throughput']:.0f} | {r['p50_ttft_ms']:.0f} / {r['p90_ttft_ms']:.0f} / "
                f"{r['p99_ttft_ms']:.0f} | {r['p50_tpot_ms']:.0f} | {r['p50_itl_ms']:.0f} / {r['p90_itl_ms']:.0f} / "
                f"{r['p99_itl_ms']:.0f} |"
            )
    for concurrency in args.concurrency:
        zebra, qwen3 = results["zebra"][concurrency], results["qwen3"][concurrency]
        print(
            f"concurrency {concurrency}: Zebra / Qwen3 output tok/s {zebra['output_throughput'] / qwen3['output_throughput']:.2f}x, "
            f"TTFT p50 {zebra['p50_ttft_ms'] / qwen3['p50_ttft_ms']:.2f}x, ITL p50 {zebra['p50_itl_ms'] / qwen3['p50_itl_ms']:.2f}x"
        )


if __name__ == "__main__":
    main()
