"""The kernel registry's vocabulary: op names, entry keys, entry points, kernel families and the facts of a call,
each spelled once, here.

Why a leaf module of its own: the registry (``kernels/registry.py``), the switches, the resolver, the ops, the
losses and the vLLM layer all name the same ops, families and facts; with the names as members here, a misspelt
one is an ``AttributeError`` at import instead of a name that quietly matches nothing. It imports nothing, so
every module may import it.

The members are strings (``Op.CONV == "conv"``): environment values, doctor's table and JSON reports read the
same as plain strings (:class:`Name`). The classes are written out (not derived from the registry's rows), so an
editor and a type checker see every member; ``tests/kernels/test_kernel_registry.py`` checks that each key is
some row's and each row's key is here.
"""

from __future__ import annotations

from enum import Enum


class Name(str, Enum):
    """A name that is its own string everywhere: printed, formatted, shown (``repr``), hashed and compared as
    its value, so messages, doctor's table and reports read exactly as the plain strings did."""

    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return repr(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Op(Name):
    """The ops the registry chooses a kernel for, as doctor prints them."""

    GDN_CHUNK = "GDN chunk"
    GDN_RECURRENT = "GDN recurrent"
    CONV = "conv"
    GDN_PREFILL_IN_SLOTS = "GDN prefill in slots"
    GDN_DECODE_STEP = "GDN decode step"
    CONV_IN_SLOTS = "conv in slots"
    LATENT_DECODE = "MLA latent decode"
    GATED_NORM = "GDN gated RMSNorm"
    ATTENTION = "attention"
    LOSS = "loss"
    DISTILLATION_LOSS = "distillation loss"


class Key(Name):
    """An entry's name within its op (``kernels/registry.py``: one row per op × key); the switches, doctor's
    table and the ops' bindings (``kernels.bind``) name entries by these."""

    FLA = "fla"
    TORCH = "torch"
    TORCH_PARALLEL_COMPILED = "torch-parallel-compiled"
    TORCH_PARALLEL = "torch-parallel"
    TORCH_CHUNK = "torch-chunk"
    CPP = "cpp"
    CPP_BF16_GEMM = "cpp-bf16-gemm"
    TORCH_BF16_GEMM = "torch-bf16-gemm"
    VLLM_CPP = "vllm-cpp"
    TRITON = "triton"
    CONV_OP = "conv-op"
    FLASH_VARLEN = "flash_varlen"
    FLEX_BLOCK_MASK = "flex_block_mask"
    SDPA_PER_SEGMENT = "sdpa_per_segment"
    DENSE_MASK = "dense_mask"
    LIGER = "liger"
    CHUNKED = "chunked"
    LOGITS = "logits"


class EntryPoint(Name):
    """Where an op is entered: most ops at one point (``RUN``); the conv at one for whole sequences and one for
    decode steps, the conv on state slots at one for decode tokens and one for prompt chunks. Each entry of an
    op has a function at each of its op's points (``kernels/op_specs.py`` lists them)."""

    RUN = "run"
    SEQUENCE = "sequence"
    STEP = "step"
    PREFILL = "prefill"


class Family(Name):
    """Where an entry's code comes from, one name each everywhere (planner, losses, doctor, known issues)."""

    FLA = "fla"
    TORCH = "torch"
    CPP = "cpp"
    VLLM = "vllm"
    TRITON = "triton"
    FLASH_ATTN = "flash-attn"
    FLEX = "flex"
    SDPA = "sdpa"
    DENSE = "dense"
    LIGER = "liger"
    CHUNKED = "chunked"
    LOGITS = "logits"


class Fact(Name):
    """What a call tells the registry beyond its inputs' device and dtype (``op_specs.OP_SPECS``: which op reads
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
