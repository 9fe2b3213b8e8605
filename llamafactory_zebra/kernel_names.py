"""The kernel registry's vocabulary: op names, kernel families, entry keys and the facts of a call, each
spelled once, here.

Why a leaf module of its own: the registry (``kernels/registry.py``), the switches, the resolver, the ops'
implementation tables, the losses, the attention policy and the vLLM layer all name the same entries; with
the names as members here, a misspelt one is an ``AttributeError`` at import instead of a key that quietly
matches nothing. It imports nothing, so every module (``attention_policy.py``, ``loss.py``, which the
registry itself imports) may import it.

The members are strings (``Key.FLA == "fla"``): environment values, doctor's table, JSON reports and the
tables keyed by them read the same as before.
"""

from __future__ import annotations

from enum import Enum


class _Name(str, Enum):
    """A name that is its own string everywhere: printed, formatted, shown (``repr``), hashed and compared as
    its value, so messages, doctor's table and reports read exactly as the plain strings did."""

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Op(_Name):
    """The ops the registry chooses a kernel for, as doctor prints them."""

    GDN_CHUNK = "GDN chunk"
    GDN_RECURRENT = "GDN recurrent"
    CONV = "conv"
    GDN_PREFILL_IN_SLOTS = "GDN prefill in slots"
    GDN_DECODE_STEP = "GDN decode step"
    CONV_IN_SLOTS = "conv in slots"
    GATED_NORM = "GDN gated RMSNorm"
    ATTENTION = "attention"
    LOSS = "loss"
    DISTILLATION_LOSS = "distillation loss"


class Family(_Name):
    """Where an entry's code comes from, one name each everywhere (planner, losses, doctor, known issues)."""

    FLA = "fla"
    TORCH = "torch"
    CPP = "cpp"
    VLLM = "vllm"
    FLASH_ATTN = "flash-attn"
    FLEX = "flex"
    SDPA = "sdpa"
    DENSE = "dense"
    LIGER = "liger"
    CHUNKED = "chunked"
    LOGITS = "logits"


class Key(_Name):
    """An entry's key within its op: what the op's implementation table maps to a function."""

    FLA = "fla"
    TORCH = "torch"
    TORCH_CHUNK = "torch-chunk"
    TORCH_PARALLEL = "torch-parallel"
    TORCH_PARALLEL_COMPILED = "torch-parallel-compiled"
    CPP = "cpp"
    CPP_BF16_GEMM = "cpp-bf16-gemm"
    TORCH_BF16_GEMM = "torch-bf16-gemm"
    VLLM_CPP = "vllm-cpp"
    CONV_OP = "conv-op"
    FLASH_VARLEN = "flash_varlen"
    FLEX_BLOCK_MASK = "flex_block_mask"
    SDPA_PER_SEGMENT = "sdpa_per_segment"
    DENSE_MASK = "dense_mask"
    LIGER = "liger"
    CHUNKED = "chunked"
    LOGITS = "logits"


class Fact(_Name):
    """What a call tells the registry beyond its inputs' device and dtype (``registry.FACTS``: which op reads
    which; a call that names another fails)."""

    GRAD = "grad"  # the inputs need a gradient
    STATE_DTYPE = "state_dtype"  # the recurrent state's dtype
    STATE_ROWS_CONTIGUOUS = "state_rows_contiguous"  # each state row contiguous in V (vLLM's SSM slot, viewed)
    SAME_GATE = "same_gate"  # the norm's gate has the values' dtype and shape
    WIDTH = "width"  # the conv's window
    CONV_STATE_DIM_FIRST = "conv_state_dim_first"  # vLLM's conv-state layout
    VLLM_CPU_PLATFORM = "vllm_cpu_platform"  # vLLM runs on its CPU platform
    ATTN_IMPLEMENTATION = "attn_implementation"  # transformers' attention implementation
    FUSED = "fused"  # LLaMA-Factory's enable_liger_kernel: the loss from hidden states
