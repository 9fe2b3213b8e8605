"""One table for a person with one GPU: is the GPU path of llamafactory-zebra right, and how fast is it?

Rows (each measured in this run, nothing carried over):

- ``kernel equality``: ``tests/test_ops_fla_gpu.py`` (fla's chunk/recurrent/conv kernels vs the PyTorch
  path, bf16, packed ``cu_seqlens``, states, gradients) — pass/fail counts;
- ``packed step``: one training step of the tiny model on packed rows with the GPU backends (fla,
  Liger's fused CE, FlashAttention-2 when installed) against the same step with the PyTorch backends
  (``ZEBRA_GDN_BACKEND=torch``, chunked CE, sdpa): loss and gradient relative errors;
- ``packed sdpa``: one fp32 training step of the tiny model on packed rows with sdpa reading the
  samples' borders (compiled ``flex_attention`` on a GPU) against the same step with the dense 4-D
  block-causal mask: loss and gradient relative errors (docs/gpu.md, section 2b);
- ``throughput``: forward + backward + AdamW step of the tiny model and of a 2-layer real-width Zebra
  (Qwen3-1.7B width, one GDN and one MLA layer) on one packed bf16 row of 8k and 32k tokens:
  tokens/s, MFU (model FLOPs: 6 x matmul parameters per token plus causal MLA attention; GDN's
  recurrence is not counted, so MFU is a lower bound), peak allocated memory and the planner's
  estimate (``planning.make_plan``) for the same settings, with their ratio;
- versions of torch, triton, fla, flash-attn, liger-kernel and the device.

``--cpu`` runs the same code on CPU at short lengths (the CPU backends, no memory numbers) so the table
and the planner comparison are tested without a GPU (``tests/test_gpu_check_report.py``).

    bash benchmarks/gpu_check.sh            # on the GPU machine
    python benchmarks/gpu_check.py --cpu --lengths 64
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM
from llamafactory_zebra.attention_policy import SDPA, packed_attention_kernel
from llamafactory_zebra.ops import BACKEND_ENV_VAR
from llamafactory_zebra.packing import block_causal_mask, segment_ids_from_position_ids
from llamafactory_zebra.planning.parameters import summarize
from llamafactory_zebra.planning.plan import TrainingSetup, make_plan

ROOT = Path(__file__).resolve().parent.parent
# Dense bf16 tensor-core peak per device (vendor datasheets); ``--peak-tflops`` for anything else.
PEAK_BF16_TFLOPS = {"H200": 989, "H100": 989, "A100": 312, "MI300X": 1307, "MI325X": 1307, "MI250": 181, "L40S": 362}
GIB = 1024**3


def model_config(kind: str, attention: str) -> ZebraConfig:
    if kind == "tiny":
        config = ZebraConfig.from_preset("tiny")
    else:
        config = ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-64k", num_hidden_layers=2, layer_types=["gdn", "mla"])
    config._attn_implementation = attention
    return config


def flops_per_token(config: ZebraConfig, length: int) -> float:
    """6 x parameters (input embeddings excluded, lm_head included) + causal MLA attention, fwd + bwd."""
    params = summarize(config).total - config.vocab_size * config.hidden_size
    mla_layers = config.layer_types.count("mla")
    attention = 3 * mla_layers * config.num_attention_heads * (config.qk_head_dim + config.v_head_dim) * length
    return 6 * params + attention


def packed_row(vocab: int, length: int, device: str, samples: int = 4) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    cuts = sorted(torch.randperm(length - 1, generator=gen)[: samples - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, length], strict=True)]
    input_ids = torch.randint(0, vocab, (1, length), generator=gen)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    labels = input_ids.masked_fill(position_ids == 0, -100)
    return {k: v.to(device) for k, v in dict(input_ids=input_ids, position_ids=position_ids, labels=labels).items()}


def size(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB / 10 else f"{num_bytes / 2**20:.1f} MiB"


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def packed_step(device: str, fast_attention: str, length: int) -> dict[str, str]:
    """Tiny model, bf16: GPU backends against PyTorch backends, same weights and batch."""
    torch.manual_seed(0)
    base = ZebraForCausalLM(model_config("tiny", "sdpa")).to(device, torch.bfloat16).train()
    batch = packed_row(base.config.vocab_size, length, device)
    runs = {}
    for name, gdn, loss, attention in (
        ("gpu", "auto", "auto", fast_attention),
        ("torch", "torch", "chunked", "sdpa"),
    ):
        os.environ[BACKEND_ENV_VAR] = gdn
        model = copy.deepcopy(base)
        model.config._attn_implementation = attention
        used_loss = model.enable_fused_cross_entropy(loss)
        out = model(**batch).loss
        out.backward()
        grads = torch.cat([p.grad.flatten().float() for p in model.parameters()])
        runs[name] = (out.detach(), grads, f"{gdn}/{used_loss}/{attention}")
    os.environ.pop(BACKEND_ENV_VAR)
    (loss_gpu, grads_gpu, used), (loss_torch, grads_torch, _) = runs["gpu"], runs["torch"]
    return {
        "check": f"packed step (tiny, bf16, 4 samples in {length})",
        "result": f"loss rel {relative(loss_gpu, loss_torch):.1e}, grads rel {relative(grads_gpu, grads_torch):.1e}",
        "detail": f"backends gdn/loss/attention {used} vs torch/chunked/sdpa",
    }


def packed_sdpa_step(device: str, length: int) -> dict[str, str]:
    """Tiny model, fp32, sdpa on packed rows: the samples' borders (the kernel the attention policy picks:
    compiled flex_attention on a GPU, per-sample sdpa on CPU) against the dense 4-D block-causal mask."""
    torch.manual_seed(0)
    base = ZebraForCausalLM(model_config("tiny", SDPA)).to(device).train()
    batch = packed_row(base.config.vocab_size, length, device)
    dense_mask = block_causal_mask(segment_ids_from_position_ids(batch["position_ids"]))
    runs = []
    for extra in ({}, {"attention_mask": dense_mask}):
        model = copy.deepcopy(base)
        loss = model(**batch, **extra).loss
        loss.backward()
        runs.append((loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (loss_borders, grads_borders), (loss_dense, grads_dense) = runs
    kernel = packed_attention_kernel(SDPA, device)
    return {
        "check": f"packed sdpa (tiny, fp32, 4 samples in {length})",
        "result": f"loss rel {relative(loss_borders, loss_dense):.1e}, grads rel {relative(grads_borders, grads_dense):.1e}",
        "detail": f"{kernel} on the samples' borders vs the dense block-causal mask",
    }


def throughput(kind: str, length: int, device: str, attention: str, peak_tflops: float | None) -> dict[str, str]:
    config = model_config(kind, attention)
    torch.manual_seed(0)
    model = ZebraForCausalLM(config).to(device, torch.bfloat16).train()
    model.enable_fused_cross_entropy("auto")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    batch = packed_row(config.vocab_size, length, device)

    def step():
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: Triton autotuning and compilation, optimizer states
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    step()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens_per_s = length / seconds
    mfu = "n/a (pass --peak-tflops)"
    if peak_tflops:
        mfu = f"{100 * flops_per_token(config, length) * tokens_per_s / (peak_tflops * 1e12):.1f}%"
    gpu_memory = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else 80 * GIB
    setup = TrainingSetup(
        config=config,
        model_label=kind,
        cutoff_len=length,
        micro_batch=1,
        gpus=1,
        gpu_memory=gpu_memory,
        gpu_label=device,
        precision="pure_bf16",
        gradient_checkpointing=False,
        fused_cross_entropy=True,
        attention="flash_attention_2" if attention == "flash_attention_2" else "sdpa",
        packing=True,
    )
    estimate = make_plan(setup).peak
    if device == "cuda":
        measured = torch.cuda.max_memory_allocated()
        memory = f"peak {size(measured)} vs plan {size(estimate)} ({measured / estimate:.2f}x)"
    else:
        memory = f"peak n/a on CPU, plan {size(estimate)}"
    return {
        "check": f"throughput {kind} @ {length} tokens",
        "result": f"{tokens_per_s:,.0f} tokens/s, MFU {mfu}",
        "detail": memory,
    }


def kernel_equality(device: str) -> dict[str, str]:
    if device != "cuda":
        return {
            "check": "kernel equality (fla vs PyTorch)",
            "result": "not run (no GPU)",
            "detail": "CPU: tests/test_kernels_triton_interpreter.py",
        }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_ops_fla_gpu.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-200:]
    return {
        "check": "kernel equality (fla vs PyTorch)",
        "result": "PASS" if proc.returncode == 0 else "FAIL",
        "detail": f"tests/test_ops_fla_gpu.py: {summary}",
    }


def versions(device: str) -> dict[str, str]:
    found = []
    for dist in ("torch", "triton", "pytorch-triton-rocm", "fla-core", "flash-attn", "liger-kernel", "transformers"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    backend = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    return {"check": "versions", "result": f"{name} ({backend})", "detail": ", ".join(found)}


def render(rows: list[dict[str, str]]) -> str:
    columns = ("check", "result", "detail")
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    line = "| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |"
    rule = "|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|"
    body = ["| " + " | ".join(r[c].ljust(widths[c]) for c in columns) + " |" for r in rows]
    return "\n".join([line, rule, *body])


def peak_for_device(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name().upper()
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in name), None)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on CPU (tests the table; no GPU numbers)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    parser.add_argument("--models", nargs="+", default=["tiny", "real-width-2-layer"])
    parser.add_argument("--step-length", type=int, default=512, help="tokens of the packed-step row")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for MFU")
    args = parser.parse_args(argv)
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA/ROCm GPU visible to torch (use --cpu to test the report on CPU)")
    try:
        import flash_attn  # noqa: F401

        attention = "flash_attention_2" if device == "cuda" else "sdpa"
    except ImportError:
        attention = "sdpa"
    peak = args.peak_tflops or peak_for_device(device)
    rows = [versions(device), kernel_equality(device), packed_step(device, attention, args.step_length)]
    rows.append(packed_sdpa_step(device, args.step_length))
    rows += [throughput(kind, length, device, attention, peak) for kind in args.models for length in args.lengths]
    table = render(rows)
    print(table)
    return table


if __name__ == "__main__":
    main()
