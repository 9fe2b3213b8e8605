"""One table for a person with one GPU: which kernels a run gets, are they right at Zebra's real shapes, how fast.

Rows, in this order, each printed (flushed) the moment it finishes and each under its own time limit
(``--budget-scale`` scales them), so a lease that ends early still returns every finished row:

- ``versions``; ``kernels (training)`` / ``kernels (inference)``: what ``llamafactory_zebra.kernels``
  resolves on this machine, and ``known issues``: any known-broken combination that applies;
- parity at the real shapes of ``qwen3-1.7b-7mla21gdn-64k`` (GDN: 6 heads, key 256, value 512; MLA at
  full width), packed rows with per-segment states: the GDN chunk op forward + backward, the recurrent
  decode op, the short conv with its decode step, and one MLA layer. Each is judged as the error of the
  bf16 fast path (the plugin's own dispatch: fla, FlashAttention-2 when installed) against the fp32
  PyTorch path, divided by the bf16 PyTorch path's own error against the same reference: ``<= 2``
  passes (the worst tensor counts). On a stack where a known issue stops training, the GDN backward is
  not run (it would compile for minutes and then raise);
- training step, full 28-layer Zebra against transformers' own ``Qwen3ForCausalLM`` of the same width
  (Qwen3-1.7B's config, built locally) at 8k and 32k tokens, and Zebra alone at 128k: bf16 weights,
  gradient checkpointing, fused cross-entropy (Liger on a GPU) for both, AdamW, one unpacked row;
  tokens/s, MFU (6 x matmul parameters + causal attention FLOPs, a lower bound for Zebra: GDN's
  recurrence is not counted), the ratio Zebra/Qwen3, peak allocated memory and the planner's
  estimate (``planning.make_plan``) for the same settings;
- decode step after a 1k and a 32k-token prefill, Zebra against the same Qwen3 (ms per token).

A row that runs out of time prints TIMEOUT (the alarm fires between Python calls: a single long CUDA call
finishes first) and one that fails prints ERROR with the exception; the next row starts either way.
``--cpu`` runs the same rows at tiny sizes (the ``tiny`` preset, short rows; no memory numbers): the
table the CI test (``tests/tools/test_gpu_check_report.py``) checks.

    bash tools/gpu_check.sh            # on the GPU machine
    python tools/gpu_check.py --cpu
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.metadata
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import Qwen3Config, Qwen3ForCausalLM

from llamafactory_zebra import ZebraConfig, ZebraForCausalLM, ops
from llamafactory_zebra.attention_policy import SDPA
from llamafactory_zebra.kernels import (
    BACKEND_ENV_VAR,
    KNOWN_ISSUES,
    STOP,
    Stack,
    detect_stack,
    packed_attention,
    resolve,
)
from llamafactory_zebra.kernels.known_issues import BACKWARD, PASSES
from llamafactory_zebra.kernels.stack import DISTRIBUTIONS
from llamafactory_zebra.loss import fused_causal_lm_loss
from llamafactory_zebra.packing import block_causal_mask, segment_ids_from_position_ids
from llamafactory_zebra.planning.memory_plan import TrainingSetup, make_plan

# Dense bf16 tensor-core peak per device (vendor datasheets); ``--peak-tflops`` for anything else.
PEAK_BF16_TFLOPS = {"H200": 989, "H100": 989, "A100": 312, "MI300X": 1307, "MI325X": 1307, "MI250": 181, "L40S": 362}
GIB = 1024**3
PARITY_LIMIT = 2.0
COLUMNS = ("check", "result", "detail", "seconds")


@dataclass(frozen=True)
class Sizes:
    preset: str
    gdn_cu: tuple[int, ...]  # packed segments of the parity rows (a 1-token and a 2-token one included)
    train_lengths: tuple[int, ...]
    zebra_only_lengths: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    decode_steps: int
    timed_steps: int
    # Seconds per row kind. On the GPU they add up to 445 s: with ~30 s of imports and CUDA start-up, the
    # whole table fits gpu_check.sh's 480 s, a fresh machine's first eight minutes.
    budgets: dict[str, float]


GPU = Sizes(
    preset="qwen3-1.7b-7mla21gdn-64k",
    gdn_cu=(0, 1500, 1501, 1503, 3000, 4096),
    train_lengths=(8192, 32768),
    zebra_only_lengths=(131072,),
    decode_contexts=(1024, 32768),
    decode_steps=16,
    timed_steps=2,
    budgets={
        "kernels": 10,
        "gdn chunk": 125,
        "gdn recurrent": 25,
        "conv": 25,
        "mla": 25,
        "packed sdpa": 20,
        "train": 55,
        "decode": 25,
    },
)
CPU = Sizes(
    preset="tiny",
    gdn_cu=(0, 1, 3, 64, 130),
    train_lengths=(64, 128),
    zebra_only_lengths=(256,),
    decode_contexts=(32, 128),
    decode_steps=4,
    timed_steps=1,
    budgets={
        "kernels": 15,
        "gdn chunk": 30,
        "gdn recurrent": 15,
        "conv": 15,
        "mla": 15,
        "packed sdpa": 15,
        "train": 30,
        "decode": 15,
    },
)


class RowTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expire(signum, frame):
        raise RowTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def gdn_backend(choice: str | None) -> Iterator[None]:
    """``ZEBRA_GDN_BACKEND`` for one block (``None``: leave it as the user set it)."""
    before = os.environ.get(BACKEND_ENV_VAR)
    if choice is not None:
        os.environ[BACKEND_ENV_VAR] = choice
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(BACKEND_ENV_VAR, None)
        else:
            os.environ[BACKEND_ENV_VAR] = before


def row(check: str, result: str, detail: str = "") -> dict[str, str]:
    return {"check": check, "result": result, "detail": detail}


def format_row(values: dict[str, str]) -> str:
    return "| " + " | ".join(values.get(c, "") for c in COLUMNS) + " |"


class Report:
    """Prints each row as it finishes; :meth:`run` gives every row its own time limit."""

    def __init__(self, device: str, scale: float) -> None:
        self.device, self.scale, self.lines = device, scale, []
        self._emit("| " + " | ".join(COLUMNS) + " |")
        self._emit("|" + "|".join("---" for _ in COLUMNS) + "|")

    def _emit(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)

    def run(self, name: str, budget: float, produce: Callable[[], list[dict[str, str]]]) -> None:
        limit = budget * self.scale
        start = time.perf_counter()
        try:
            with time_limit(limit):
                rows = produce()
        except RowTimeout:
            rows = [row(name, "TIMEOUT", f"over its {limit:.0f} s limit; the next row runs")]
        except Exception as error:  # one failed row must not cost the others
            rows = [
                row(name, "ERROR", f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}")
            ]
        seconds = time.perf_counter() - start
        gc.collect()
        if self.device == "cuda":
            torch.cuda.empty_cache()
        for values in rows:
            self._emit(format_row({**values, "seconds": f"{seconds:.1f}"}))

    def table(self) -> str:
        return "\n".join(self.lines)


# ---- the resolved kernels ----------------------------------------------------------------------------


def versions_row(device: str) -> list[dict[str, str]]:
    found = []
    for dist in (*DISTRIBUTIONS, "transformers"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    backend = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
    return [row("versions", f"{name} ({backend})", ", ".join(found))]


def kernel_rows(stack: Stack) -> list[dict[str, str]]:
    rows = []
    for training in (True, False):
        resolution = resolve(stack, training=training, attn_implementation="flash_attention_2")
        stops = [p.key or p.part for p in resolution.with_severity(STOP)]
        result = f"STOP: {', '.join(stops)}" if stops else "ok"
        detail = "; ".join(f"{c.part}: {c.kernel}" for c in resolution.choices)
        rows.append(row(f"kernels ({resolution.phase})", result, detail))
    applying = [
        f"{issue.key} ({'training stops' if issue.in_pass == BACKWARD else 'every run'}; {', '.join(issue.upstream[:1])})"
        for issue in KNOWN_ISSUES
        if issue.matches(stack, PASSES)
    ]
    rows.append(
        row(
            "known issues",
            ", ".join(applying) or "none apply",
            f"{len(KNOWN_ISSUES)} known in kernels/known_issues.py",
        )
    )
    return rows


# ---- parity at the real shapes -----------------------------------------------------------------------


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def parity_verdict(names, fast, torch_bf16, reference) -> tuple[str, str]:
    """Worst (fast-path error / PyTorch bf16 error) over the compared tensors, both against the fp32 reference."""
    worst = None
    for name, f, t, r in zip(names, fast, torch_bf16, reference, strict=True):
        fast_error, own_error = relative(f, r), relative(t, r)
        ratio = fast_error / own_error if own_error > 0 else (1.0 if fast_error == 0 else float("inf"))
        if worst is None or ratio > worst[0]:
            worst = (ratio, name, fast_error, own_error)
    ratio, name, fast_error, own_error = worst
    verdict = "PASS" if ratio <= PARITY_LIMIT else "FAIL"
    return (
        f"{verdict}: ratio {ratio:.2f} (<= {PARITY_LIMIT:g})",
        f"worst {name}: bf16 fast {fast_error:.1e}, bf16 PyTorch {own_error:.1e} vs fp32 PyTorch",
    )


def gdn_tensors(config: ZebraConfig, cu: tuple[int, ...], device: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    heads, k_dim, v_dim, length = config.gdn_num_heads, config.gdn_head_dim, config.gdn_head_v_dim, cu[-1]
    q = torch.randn(1, length, heads, k_dim, generator=gen)
    k = torch.randn(1, length, heads, k_dim, generator=gen)
    v = torch.randn(1, length, heads, v_dim, generator=gen)
    g = F.logsigmoid(torch.randn(1, length, heads, generator=gen) + 3.0)
    beta = torch.rand(1, length, heads, generator=gen)
    h0 = torch.randn(len(cu) - 1, heads, k_dim, v_dim, generator=gen) * 0.1
    return [t.to(device) for t in (q, k, v, g, beta, h0)]


def as_layer_dtypes(tensors: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """q, k, v, beta in the activation dtype; the log-decay and the states stay fp32 (the layer's dtypes)."""
    q, k, v, g, beta, h0 = tensors
    return [q.to(dtype), k.to(dtype), v.to(dtype), g, beta.to(dtype), h0]


def run_gdn(op, tensors, cu, backward: bool) -> list[torch.Tensor]:
    leaves = [t.clone().requires_grad_(backward) for t in tensors]
    out, state = op(
        *leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True
    )
    results = [out, state]
    if backward:
        gen = torch.Generator().manual_seed(1)
        weights = [torch.randn(t.shape, generator=gen).to(t.device) for t in (out, state)]
        ((out.float() * weights[0]).sum() + (state * weights[1]).sum()).backward()
        results += [leaf.grad for leaf in leaves]
    return results


def gdn_parity(op_name: str, config, sizes: Sizes, device: str, backward: bool, note: str) -> list[dict[str, str]]:
    op = getattr(ops, op_name)
    cu = torch.tensor(sizes.gdn_cu, dtype=torch.int32, device=device)
    fp32 = gdn_tensors(config, sizes.gdn_cu, device)
    bf16 = as_layer_dtypes(fp32, torch.bfloat16)
    with gdn_backend("torch"):
        reference = run_gdn(op, fp32, cu, backward)
        own = run_gdn(op, bf16, cu, backward)
    fast = run_gdn(op, bf16, cu, backward)  # the plugin's dispatch as the user runs it
    names = ["output", "final state"] + (
        ["grad q", "grad k", "grad v", "grad g", "grad beta", "grad state"] if backward else []
    )
    result, detail = parity_verdict(names, fast, own, reference)
    shape = f"H={config.gdn_num_heads}, K={config.gdn_head_dim}, V={config.gdn_head_v_dim}, {len(sizes.gdn_cu) - 1} segments in {sizes.gdn_cu[-1]}"
    what = "forward + backward" if backward else "forward"
    return [row(f"parity {op_name} ({what}; {shape})", result, f"{detail}{note}")]


def conv_parity(config, sizes: Sizes, device: str) -> list[dict[str, str]]:
    gen = torch.Generator().manual_seed(0)
    channels, width, cu_list = config.gdn_num_heads * config.gdn_head_v_dim, config.gdn_conv_size, sizes.gdn_cu
    x = torch.randn(1, cu_list[-1], channels, generator=gen).to(device)
    weight = (torch.randn(channels, width, generator=gen) / width).to(device)
    state = torch.randn(len(cu_list) - 1, channels, width, generator=gen).to(device)
    cu = torch.tensor(cu_list, dtype=torch.int32, device=device)

    def run(dtype):
        leaves = [t.to(dtype).clone().requires_grad_() for t in (x, weight)]
        y, final = ops.causal_conv1d(
            leaves[0], leaves[1], initial_state=state.to(dtype), output_final_state=True, cu_seqlens=cu
        )
        y.float().square().sum().backward()
        segments = final.shape[0]  # one decode step per packed sequence, from its final state
        step, cache = ops.causal_conv1d_update(x[0, :segments].to(dtype), final.detach().clone(), leaves[1].detach())
        return [y, final, leaves[0].grad, leaves[1].grad, step, cache]

    with gdn_backend("torch"):
        reference, own = run(torch.float32), run(torch.bfloat16)
    fast = run(torch.bfloat16)
    names = ["output", "final state", "grad x", "grad weight", "decode output", "decode cache"]
    result, detail = parity_verdict(names, fast, own, reference)
    return [row(f"parity causal_conv1d (+ decode step; {channels} channels, width {width})", result, detail)]


def packed_row(vocab: int, length: int, device: str, samples: int = 4) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    cuts = sorted(torch.randperm(length - 1, generator=gen)[: samples - 1].add(1).tolist())
    lengths = [b - a for a, b in zip([0, *cuts], [*cuts, length], strict=True)]
    input_ids = torch.randint(0, vocab, (1, length), generator=gen)
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    return {"input_ids": input_ids.to(device), "position_ids": position_ids.to(device)}


def mla_parity(preset: str, length: int, device: str, attention: str) -> list[dict[str, str]]:
    """One MLA layer at full width on a packed row: hidden states and every gradient."""
    config = ZebraConfig.from_preset(preset, num_hidden_layers=1, layer_types=["mla"])
    torch.manual_seed(0)
    with torch.device(device):
        base = ZebraForCausalLM(config).model
    batch = packed_row(config.vocab_size, length, device)
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(1, length, config.hidden_size, generator=gen).to(device)

    def run(dtype, attn):
        model = base.to(dtype)
        model.config._attn_implementation = attn
        model.zero_grad(set_to_none=True)
        hidden = model(**batch).last_hidden_state
        (hidden.float() * weight).sum().backward()
        named = [(n, p.grad.detach().clone()) for n, p in model.named_parameters() if p.grad is not None]
        return [hidden.detach().float(), *(g.float() for _, g in named)], [
            "hidden states",
            *(f"grad {n}" for n, _ in named),
        ]

    reference, names = run(torch.float32, "sdpa")
    own, _ = run(torch.bfloat16, "sdpa")
    fast, _ = run(torch.bfloat16, attention)
    result, detail = parity_verdict(names, fast, own, reference)
    shape = (
        f"{config.num_attention_heads} heads, q/k {config.qk_head_dim}, v {config.v_head_dim}, 4 samples in {length}"
    )
    return [row(f"parity MLA layer ({attention}; {shape})", result, detail)]


def packed_sdpa_parity(length: int, device: str) -> list[dict[str, str]]:
    """Tiny model, fp32, sdpa on packed rows: the samples' borders (the kernel the attention policy picks:
    compiled flex_attention on a GPU, per-sample sdpa on CPU) against the dense 4-D block-causal mask."""
    torch.manual_seed(0)
    config = ZebraConfig.from_preset("tiny")
    config._attn_implementation = SDPA
    with torch.device(device):
        base = ZebraForCausalLM(config).train()
    batch = packed_row(base.config.vocab_size, length, device)
    batch["labels"] = batch["input_ids"].masked_fill(batch["position_ids"] == 0, -100)
    dense_mask = block_causal_mask(segment_ids_from_position_ids(batch["position_ids"]))
    runs = []
    for extra in ({}, {"attention_mask": dense_mask}):
        model = copy.deepcopy(base)
        loss = model(**batch, **extra).loss
        loss.backward()
        runs.append((loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (loss_borders, grads_borders), (loss_dense, grads_dense) = runs
    kernel = packed_attention(SDPA, device).key
    return [
        row(
            f"packed sdpa (tiny, fp32, 4 samples in {length})",
            f"loss rel {relative(loss_borders, loss_dense):.1e}, grads rel {relative(grads_borders, grads_dense):.1e}",
            f"{kernel} on the samples' borders vs the dense block-causal mask",
        )
    ]


# ---- training step and decode against the same-width Qwen3 ---------------------------------------------


def dense_baseline_config(config: ZebraConfig) -> Qwen3Config:
    """Qwen3-1.7B's decoder at the Zebra config's width (tied embeddings, as Qwen3-1.7B), built locally."""
    return Qwen3Config(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=262144,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
    )


def build(kind: str, config: ZebraConfig, device: str, attention: str) -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        model = ZebraForCausalLM(config) if kind == "zebra" else Qwen3ForCausalLM(dense_baseline_config(config))
    model.config._attn_implementation = attention
    return model.to(torch.bfloat16)


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters a token multiplies: all but the input embeddings; the output head counts even when tied."""
    total = sum(p.numel() for p in model.parameters())
    embeddings = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embeddings
    return total if tied else total - embeddings.numel()


def flops_per_token(model: torch.nn.Module, length: int) -> float:
    """6 x matmul parameters + causal attention (QK and PV over half the row on average), forward + backward."""
    config = model.config
    if config.model_type == "zebra":
        layers, qk, v = config.layer_types.count("mla"), config.qk_head_dim, config.v_head_dim
    else:
        layers, qk, v = config.num_hidden_layers, config.head_dim, config.head_dim
    return 6 * matmul_parameters(model) + 3 * layers * config.num_attention_heads * (qk + v) * length


def training_point(kind, config, length, device, attention, loss_backend, sizes, peak_tflops) -> dict:
    model = build(kind, config, device, attention).train()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device == "cuda")
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, config.vocab_size, (1, length), generator=gen).to(device)

    def step():
        hidden = model.model(input_ids=input_ids, use_cache=False).last_hidden_state
        fused_causal_lm_loss(hidden, model.lm_head.weight, input_ids, loss_backend).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # compilation, autotuning, optimizer states
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(sizes.timed_steps):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    tokens_per_s = sizes.timed_steps * length / (time.perf_counter() - start)
    point = {"tokens_per_s": tokens_per_s, "flops": flops_per_token(model, length)}
    point["mfu"] = point["flops"] * tokens_per_s / (peak_tflops * 1e12) if peak_tflops else None
    point["peak"] = torch.cuda.max_memory_allocated() if device == "cuda" else None
    return point


def planned_peak(config: ZebraConfig, length: int, device: str, attention: str) -> float:
    gpu_memory = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else 80 * GIB
    setup = TrainingSetup(
        config=config,
        model_label="zebra",
        cutoff_len=length,
        micro_batch=1,
        gpus=1,
        gpu_memory=gpu_memory,
        gpu_label=device,
        precision="pure_bf16",
        gradient_checkpointing=True,
        fused_cross_entropy=True,
        attention=attention,
        packing=False,
    )
    return make_plan(setup).peak


def size(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.2f} GiB" if num_bytes >= GIB / 10 else f"{num_bytes / 2**20:.1f} MiB"


def describe(point: dict) -> str:
    mfu = f"MFU {100 * point['mfu']:.1f}%" if point["mfu"] is not None else "MFU n/a"
    return f"{point['tokens_per_s']:,.0f} tokens/s ({mfu})"


def training_rows(config, length, device, attention, loss_backend, sizes, peak_tflops, baseline: bool, note: str):
    zebra = training_point("zebra", config, length, device, attention, loss_backend, sizes, peak_tflops)
    plan = planned_peak(config, length, device, attention)
    memory = (
        f"Zebra peak {size(zebra['peak'])} vs plan {size(plan)} ({zebra['peak'] / plan:.2f}x)"
        if zebra["peak"]
        else f"Zebra peak n/a on CPU, plan {size(plan)}"
    )
    result = f"Zebra {describe(zebra)}"
    if baseline:
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
        dense = training_point("qwen3", config, length, device, attention, loss_backend, sizes, peak_tflops)
        result += f" vs Qwen3 {describe(dense)}: {zebra['tokens_per_s'] / dense['tokens_per_s']:.2f}x"
        memory += f"; Qwen3 peak {size(dense['peak'])}" if dense["peak"] else ""
    label = f"train step {length:,} tokens ({config.num_hidden_layers} layers{', vs Qwen3' if baseline else ', Zebra alone'})"
    return [row(label, result, memory + note)]


def decode_point(kind, config, context, device, attention, steps) -> tuple[float, float | None]:
    model = build(kind, config, device, attention).eval()
    ids = torch.randint(0, config.vocab_size, (1, context), generator=torch.Generator().manual_seed(0)).to(device)
    before = torch.cuda.memory_allocated() if device == "cuda" else None
    with torch.no_grad():
        out = model(ids, use_cache=True, logits_to_keep=1)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        held = torch.cuda.memory_allocated() - before if before is not None else None

        def one(position):
            nonlocal cache, token
            out = model(
                token, past_key_values=cache, position_ids=torch.tensor([[position]], device=device), use_cache=True
            )
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)

        one(context)  # warm-up
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for step in range(steps):
            one(context + 1 + step)
        if device == "cuda":
            torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / steps, held


def decode_rows(config, context, device, attention, sizes):
    zebra_ms, zebra_held = decode_point("zebra", config, context, device, attention, sizes.decode_steps)
    gc.collect()
    dense_ms, dense_held = decode_point("qwen3", config, context, device, attention, sizes.decode_steps)
    detail = f"{sizes.decode_steps} greedy steps after a {context:,}-token prefill, batch 1"
    if zebra_held is not None:
        detail += f"; memory held after prefill: Zebra {size(zebra_held)}, Qwen3 {size(dense_held)}"
    result = f"Zebra {zebra_ms:.1f} ms vs Qwen3 {dense_ms:.1f} ms per token ({zebra_ms / dense_ms:.2f}x)"
    return [row(f"decode step @ {context:,} context", result, detail)]


# ---- the table ---------------------------------------------------------------------------------------


def peak_for_device(device: str) -> float | None:
    if device != "cuda":
        return None
    name = torch.cuda.get_device_name().upper()
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in name), None)


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="the same rows at tiny sizes on CPU (tests the table)")
    parser.add_argument("--peak-tflops", type=float, help="the device's dense bf16 peak, for MFU")
    parser.add_argument("--budget-scale", type=float, default=1.0, help="multiply every row's time limit")
    args = parser.parse_args(argv)
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA/ROCm GPU visible to torch (use --cpu to test the report on CPU)")
    sizes = CPU if args.cpu else GPU
    stack = detect_stack() if not args.cpu else detect_stack().on_cpu()
    config = ZebraConfig.from_preset(sizes.preset)
    peak = args.peak_tflops or peak_for_device(device)
    training = resolve(stack, training=True, attn_implementation="flash_attention_2")
    blocked = bool(training.with_severity(STOP)) and training.choice("GDN chunk").family == "fla"
    attention = "flash_attention_2" if training.choice("attention").family == "flash-attn" else "sdpa"
    loss_backend = training.choice("loss").key
    budgets = sizes.budgets
    report = Report(device, args.budget_scale)

    report.run("versions", budgets["kernels"], lambda: versions_row(device) + kernel_rows(stack))
    blocked_note = f"; backward not run: {', '.join(p.key for p in training.with_severity(STOP))}" if blocked else ""
    report.run(
        "parity chunk_gated_delta_rule",
        budgets["gdn chunk"],
        lambda: gdn_parity("chunk_gated_delta_rule", config, sizes, device, not blocked, blocked_note),
    )
    report.run(
        "parity fused_recurrent_gated_delta_rule",
        budgets["gdn recurrent"],
        lambda: gdn_parity("fused_recurrent_gated_delta_rule", config, sizes, device, False, ""),
    )
    report.run("parity causal_conv1d", budgets["conv"], lambda: conv_parity(config, sizes, device))
    report.run(
        "parity MLA layer", budgets["mla"], lambda: mla_parity(sizes.preset, sizes.gdn_cu[-1], device, attention)
    )
    report.run("packed sdpa", budgets["packed sdpa"], lambda: packed_sdpa_parity(sizes.gdn_cu[-1], device))
    # A stack where fla's backward is known broken trains the GDN layers on the PyTorch path, as the fix says.
    train_backend, train_note = (
        ("torch", f"; GDN on the PyTorch path ({BACKEND_ENV_VAR}=torch: fla blocked)") if blocked else (None, "")
    )
    for length in sizes.train_lengths + sizes.zebra_only_lengths:
        baseline = length in sizes.train_lengths

        def train(length=length, baseline=baseline):
            with gdn_backend(train_backend):
                return training_rows(
                    config, length, device, attention, loss_backend, sizes, peak, baseline, train_note
                )

        report.run(f"train step {length:,} tokens", budgets["train"], train)
    for context in sizes.decode_contexts:
        report.run(
            f"decode step @ {context:,} context",
            budgets["decode"],
            lambda context=context: decode_rows(config, context, device, attention, sizes),
        )
    return report.table()


if __name__ == "__main__":
    main()
