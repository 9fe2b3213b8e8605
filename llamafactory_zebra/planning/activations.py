"""Activation memory of Zebra training, per token, from the tensors each op keeps for backward.

Generic rules of thumb (``34·s·b·h`` per layer for a GPT block) do not fit this model: a GDN layer's
footprint is set by its kernel (fla's chunked delta rule keeps normalised q/k, v, the decay cumsum and
the in-chunk matrix A; this package's PyTorch path keeps every chunk's entering state), and the
logits dwarf everything unless the loss is fused. So the count below follows the code that runs:

* shared by both layer types: ``ZebraRMSNorm`` (fp32 copy of its input, the rsqrt, the normalised
  16-bit tensor) twice, and the SwiGLU MLP (input, gate, SiLU(gate), up, product);
* MLA: the projection chain of ``layers/mla.py`` (the value is a view of ``kv_b_proj``'s output, so
  attention saving it keeps that whole tensor alive; RoPE saves only the shared cos/sin tables) and
  attention's saved q, k, v, output and log-sum-exp (FlashAttention-2 and torch SDPA's flash kernel
  save the same set; SDPA's wrapper adds one contiguous copy of the output);
* GDN: the gates, the short convolutions, the delta-rule kernel (``fla``, or ``torch``: the tensors
  ``ops/gated_delta_rule/chunk.py`` passes to ``save_for_backward``, which change with that file), and
  ``ZebraGatedRMSNorm``, which keeps its inputs (its PyTorch formula runs again in backward).

Backward also needs scratch memory on top of the saved tensors (gradients of one layer's
intermediates; for fla's kernel the per-chunk states ``h`` and ``dh``); ``_backward_peak`` estimates
it more coarsely than the saved tensors. ``docs/planning.md`` explains the composition and how the CPU path
was checked against measured peaks (``benchmarks/bench_plan_activations.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..attention_policy import FLASH_ATTENTION_2, PLANNER_ATTENTION, SDPA
from ..configuration_zebra import GDN, MLA, ZebraConfig
from ..kernel_names import Family, Key

FP32 = 4
# fla's and this package's chunked delta rule both cut sequences into 64-token chunks.
GDN_CHUNK = 64
# Chunk length of this package's PyTorch fused cross-entropy (loss.py's DEFAULT_CHUNK_TOKENS).
TORCH_CE_CHUNK = 1024

# The kernel families whose saved tensors the planner models (the registry's names).
GDN_BACKENDS = (Family.FLA, Family.TORCH)
LOSS_BACKENDS = (Key.LIGER, Key.CHUNKED, Key.LOGITS)


@dataclass(frozen=True)
class Kernels:
    """Which implementation runs each op whose saved tensors differ between implementations."""

    attention: str = FLASH_ATTENTION_2
    gdn: str = Family.FLA
    loss: str = Key.LIGER

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("attention", self.attention, PLANNER_ATTENTION),
            ("gdn", self.gdn, GDN_BACKENDS),
            ("loss", self.loss, LOSS_BACKENDS),
        ):
            if value not in allowed:
                raise ValueError(f"Kernels.{name}={value!r}; choose one of {allowed}")


@dataclass(frozen=True)
class _Dims:
    """Short names for the sizes the formulas use, and the activation element size ``a``."""

    a: int
    h: int
    i: int
    vocab: int
    heads: int
    kv_heads: int
    q_rank: int | None
    kv_rank: int
    nope: int
    rope: int
    v: int
    gdn_heads: int
    dk: int
    dv: int
    conv: int

    @property
    def qk(self) -> int:
        return self.nope + self.rope

    @property
    def key_dim(self) -> int:
        return self.gdn_heads * self.dk

    @property
    def value_dim(self) -> int:
        return self.gdn_heads * self.dv

    def rms_norm(self, n: int) -> float:
        """``ZebraRMSNorm`` over ``n`` channels: fp32 input copy, fp32 rsqrt, normalised ``a``-byte tensor."""
        return FP32 * n + FP32 + self.a * n


def _dims(config: ZebraConfig, act_bytes: int) -> _Dims:
    c = config
    return _Dims(
        a=act_bytes,
        h=c.hidden_size,
        i=c.intermediate_size,
        vocab=c.vocab_size,
        heads=c.num_attention_heads,
        kv_heads=c.num_key_value_heads,
        q_rank=c.q_lora_rank,
        kv_rank=c.kv_lora_rank,
        nope=c.qk_nope_head_dim,
        rope=c.qk_rope_head_dim,
        v=c.v_head_dim,
        gdn_heads=c.gdn_num_heads,
        dk=c.gdn_head_dim,
        dv=c.gdn_head_dim * c.gdn_expand_v,
        conv=c.gdn_conv_size,
    )


def _block_saved(d: _Dims) -> dict[str, float]:
    return {"norms": 2 * d.rms_norm(d.h), "mlp": d.a * (d.h + 4 * d.i)}


def _mla_saved(d: _Dims, k: Kernels) -> dict[str, float]:
    a, H, kvH = d.a, d.heads, d.kv_heads
    projections = (
        a * d.h  # mixer input, shared by the query and latent projections
        + (0 if d.q_rank is None else a * d.q_rank)  # q_a output, q_b's input
        + d.rms_norm(d.kv_rank)
        + a * d.kv_rank  # normalised latent, kv_b's input
        + a * kvH * (d.nope + d.v)  # kv_b output, kept whole by the value view attention saves
    )
    attention = a * H * d.qk + a * kvH * d.qk + a * H * d.v + FP32 * H  # q, k, output, log-sum-exp
    if k.attention == SDPA:
        attention += a * H * d.v  # transpose(1, 2).contiguous() of the output, out_proj's input
    return {**_block_saved(d), "mla projections": projections, "attention": attention}


def _torch_chunk_saved(Kt: int, Vt: int, H: int) -> float:
    """Floats per token ``ops/gated_delta_rule/chunk.py`` saves for backward: chunked q, k, v, beta and γ."""
    return 2 * Kt + Vt + 2 * H


def _torch_chunk_intermediates(Kt: int, Vt: int, H: int) -> float:
    """Floats per token of the in-chunk tensors its backward works from (what it saved before it recomputed):
    q, k, [q·γ; W], k·decay; v, [products; v_new]; beta, γ terms; decay, kkᵀ, qkᵀ, intra, inverse (C×C)."""
    return 5 * Kt + 3 * Vt + H * (3 + 5 * GDN_CHUNK)


def _gdn_saved(d: _Dims, k: Kernels) -> dict[str, float]:
    a, H, Kt, Vt = d.a, d.gdn_heads, d.key_dim, d.value_dim
    channels = 2 * Kt + Vt
    gates = a * d.h + a * H + 2 * FP32 * H  # input; sigmoid(beta); softplus input and output (fp32)
    if k.gdn == Family.FLA:
        convolutions = a * channels  # fla's conv saves its input
        # normalised q and k, their rstd, v, the chunk-local cumsum of g and the in-chunk matrix A
        delta_rule = 2 * a * Kt + 2 * FP32 * H + a * Vt + FP32 * H + a * H * GDN_CHUNK
    else:
        convolutions = a * channels  # the inputs: the convolution runs again in backward (ops/recompute.py)
        l2norm = 2 * (FP32 * Kt + FP32 * H)
        # chunked q, k, v, beta and γ (the in-chunk intermediates are recomputed in backward)
        chunk_tensors = _torch_chunk_saved(Kt, Vt, H)
        entering_states = H * d.dk * d.dv / GDN_CHUNK
        delta_rule = l2norm + FP32 * (chunk_tensors + entering_states)
    gated_norm = 3 * a * Vt  # o and the gate (the PyTorch norm runs again in backward); o_proj's input
    return {
        **_block_saved(d),
        "gdn gates": gates,
        "short convolutions": convolutions,
        "delta rule": delta_rule,
        "gated norm": gated_norm,
    }


def _backward_peak(d: _Dims, k: Kernels, layer_type: str, saved: dict[str, float]) -> float:
    """Bytes per token of one layer at the height of its backward pass, its own saved tensors included.

    Backward runs the layer in reverse: first the MLP (everything still saved, plus the MLP's gradient
    temporaries), then the token mixer's kernel, by which time the MLP, the second norm and the
    mixer's output side (attention's output copy, GDN's gated norm) have been consumed and freed.
    Kernel scratch is counted from the code (fla's backward recomputes the per-chunk states ``h`` and
    allocates ``dh`` of the same size; the PyTorch path keeps its chunk-level gradients until the end).
    """
    a, total = d.a, sum(saved.values())
    mlp_phase = total + a * (3 * d.i + 2 * d.h)
    upstream = total - saved["mlp"] - d.rms_norm(d.h)
    if layer_type == MLA:
        if k.attention == SDPA:
            upstream -= a * d.heads * d.v
        scratch = a * (d.heads * d.qk + d.kv_heads * (d.qk + d.v)) + FP32 * d.heads * d.qk
    else:
        upstream -= saved["gated norm"]
        Kt, Vt, H = d.key_dim, d.value_dim, d.gdn_heads
        if k.gdn == Family.FLA:
            scratch = 2 * a * H * d.dk * d.dv / GDN_CHUNK + a * (2 * Kt + 4 * Vt) + FP32 * (3 * Kt + H)
        else:
            # the gradients, and the in-chunk intermediates recomputed from the saved chunked inputs
            recomputed = _torch_chunk_intermediates(Kt, Vt, H) - _torch_chunk_saved(Kt, Vt, H)
            scratch = FP32 * (8 * Kt + 7 * Vt + 7 * H * GDN_CHUNK + recomputed)
        scratch += FP32 * Vt  # the fp32 gradient of the kernel's output
    return max(mlp_phase, upstream + scratch) + 2 * a * d.h  # plus the residual stream's gradients


@dataclass(frozen=True)
class LayerActivations:
    """Bytes per token of one decoder layer."""

    saved: dict[str, float]
    backward_peak: float

    @property
    def total_saved(self) -> float:
        return sum(self.saved.values())

    @property
    def transient(self) -> float:
        """What the layer's backward adds on top of everything that is saved."""
        return self.backward_peak - self.total_saved


def layer_activations(config: ZebraConfig, layer_type: str, act_bytes: int, kernels: Kernels) -> LayerActivations:
    d = _dims(config, act_bytes)
    saved = _mla_saved(d, kernels) if layer_type == MLA else _gdn_saved(d, kernels)
    return LayerActivations(saved, _backward_peak(d, kernels, layer_type, saved))


def liger_chunk_tokens(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's fused linear cross-entropy chunk: tokens split so one chunk of logits ≈ the hidden states."""
    inc_factor = math.ceil(vocab / hidden)
    return 1 << max(0, math.ceil(math.log2(max(1, math.ceil(tokens / inc_factor)))))


@dataclass(frozen=True)
class LossMemory:
    saved: float
    """From the end of forward until backward."""
    peak_extra: float
    """On top of ``saved`` while the loss runs forward or backward."""


def loss_memory(config: ZebraConfig, tokens: int, act_bytes: int, kernels: Kernels) -> LossMemory:
    """Memory of lm_head + cross-entropy over ``tokens`` tokens on one rank.

    logits (transformers' ``ForCausalLMLoss``, fused cross-entropy off): bf16 logits, their fp32 copy and fp32
    log-softmax in forward; log-softmax output kept; two fp32 vocab-sized gradients in backward.
    liger / chunked: the gradient w.r.t. the hidden states and lm_head is computed chunk by chunk in
    forward and kept (``grad_input`` tokens × hidden, ``grad_weight`` vocab × hidden), so only one chunk
    of logits ever exists.
    """
    d = _dims(config, act_bytes)
    a, h, V = d.a, d.h, d.vocab
    if kernels.loss == Key.LOGITS:
        return LossMemory(saved=FP32 * V * tokens, peak_extra=2 * FP32 * V * tokens)
    if kernels.loss == Key.LIGER:
        chunk = min(tokens, liger_chunk_tokens(tokens, h, V))
        return LossMemory(saved=a * h * tokens + a * V * h, peak_extra=a * chunk * V + a * V * h)
    chunk = min(tokens, TORCH_CE_CHUNK)
    # per chunk: fp32 hidden copy, logits, log-probs, fp32 grad of the chunk; weight.float() and Wᵀ·h temp
    return LossMemory(
        saved=a * h * tokens + FP32 * V * h,
        peak_extra=chunk * FP32 * (2 * h + 2 * V) + 2 * FP32 * V * h,
    )


@dataclass(frozen=True)
class ActivationEstimate:
    tokens: int
    mla_layer: LayerActivations
    gdn_layer: LayerActivations
    checkpointed: bool
    layers_saved: float
    """All decoder layers' saved tensors (checkpoint inputs only, with gradient checkpointing)."""
    model_saved: float
    """Final norm, RoPE tables and the loss's saved tensors."""
    loss_peak: float
    layer_peak: float
    """Largest single-layer working set during backward (recompute + scratch with checkpointing)."""
    components: dict[str, float] = field(default_factory=dict)

    @property
    def peak(self) -> float:
        """Peak activation bytes: everything kept, plus the larger of the loss or one layer's working set."""
        return self.layers_saved + max(self.model_saved + self.loss_peak, self.layer_peak)


def activation_estimate(
    config: ZebraConfig,
    tokens: int,
    act_bytes: int,
    kernels: Kernels,
    gradient_checkpointing: bool,
    checkpoints_on_cpu: bool = False,
) -> ActivationEstimate:
    """Activation bytes on one GPU that processes ``tokens`` tokens per micro-step.

    ``gradient_checkpointing`` is transformers' per-decoder-layer checkpointing as LLaMA-Factory enables
    it (each layer keeps only its input); ``checkpoints_on_cpu`` is LLaMA-Factory's ``use_unsloth_gc``,
    which moves those inputs to host memory.
    """
    if tokens <= 0:
        raise ValueError(f"tokens per micro-step must be positive, got {tokens}")
    d = _dims(config, act_bytes)
    per_type = {t: layer_activations(config, t, act_bytes, kernels) for t in (MLA, GDN)}
    present = [per_type[t] for t in set(config.layer_types)]
    counts = {t: config.layer_types.count(t) for t in (MLA, GDN)}

    loss = loss_memory(config, tokens, act_bytes, kernels)
    model_saved = d.rms_norm(d.h) * tokens + 2 * d.a * d.rope * tokens + loss.saved
    if gradient_checkpointing:
        per_layer_input = 0 if checkpoints_on_cpu else d.a * d.h
        layers_saved = config.num_hidden_layers * per_layer_input * tokens
        layer_peak = max(layer.backward_peak for layer in present) * tokens
    else:
        layers_saved = sum(counts[t] * per_type[t].total_saved for t in (MLA, GDN)) * tokens
        layer_peak = max(layer.transient for layer in present) * tokens
    components = {f"{t} layers": counts[t] * per_type[t].total_saved * tokens for t in (MLA, GDN)}
    return ActivationEstimate(
        tokens=tokens,
        mla_layer=per_type[MLA],
        gdn_layer=per_type[GDN],
        checkpointed=gradient_checkpointing,
        layers_saved=layers_saved,
        model_saved=model_saved,
        loss_peak=loss.peak_extra,
        layer_peak=layer_peak,
        components=components,
    )


def inference_cache_bytes(
    config: ZebraConfig, tokens: int, sequences: int = 1, act_bytes: int = 2
) -> dict[str, float]:
    """Decode-cache bytes: MLA keeps ``config.mla_cache_channels`` values per token; GDN a fixed state.

    The GDN state per sequence and layer is the fp32 ``[H, dk, dv]`` recurrence plus the q/k/v
    convolution windows (``[D, W]`` each, fla's layout, in the activation dtype).
    """
    d = _dims(config, act_bytes)
    mla_layers = config.layer_types.count(MLA)
    gdn_layers = config.layer_types.count(GDN)
    latent = mla_layers * config.mla_cache_channels * act_bytes * tokens * sequences
    recurrent = FP32 * d.gdn_heads * d.dk * d.dv
    windows = (2 * d.key_dim + d.value_dim) * d.conv * act_bytes
    return {"mla latent cache": latent, "gdn state": gdn_layers * (recurrent + windows) * sequences}
