"""Kernel/version/device combinations known to give wrong results, stop, hang or crawl a run: the data, one entry each.

An entry matches a :class:`~.stack.Stack` when the op it concerns runs the named kernel family, the device vendor (and
compute capability or architecture) fall in its range, every versioned package is installed within its range and the
run makes the affected pass (``"backward"``: training only; ``"forward"``: every run; a pass, not a resolver phase:
training, inference or serving). ``resolver.py`` reads the entries; nothing else in the package hard-codes one. Each
entry says what this project *established* (and how) apart from what is *reported* upstream, cites the threads, and
gives fixes a user can run. An entry with a ``workaround`` is one the plugin applies itself (``workarounds.py``): it is
a note, not a stop, and its fixes are the advice for when the workaround is not enough. A CPU entry concerns no one
kernel but every matrix multiply of a run in its dtype (``run_dtype.py``); one that only slows a run down is a
warning in every phase, never a stop. Add an entry here when an upstream bug is confirmed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kernel_names import Family, Op
from .registry import TORCH_GDN_GPU_COST
from .run_dtype import BF16, FP32
from .stack import Stack, parse_version
from .switches import BACKEND_ENV_VAR
from .workarounds import FLA_MAX_STAGES_ENV_VAR, TRITON_CACHE_PER_RANK, TRITON_STAGE_CAP

FORWARD, BACKWARD = "forward", "backward"
PASSES = (FORWARD, BACKWARD)
TRITON_CACHE_SHARED = "triton-cache-shared-by-ranks"
CPU_BF16_EMULATED = "cpu-bf16-without-dot-products"
# The part a CPU entry concerns: not one registry op but every matrix multiply of the run (linear layers included).
MATMULS = "matrix multiplies"


@dataclass(frozen=True)
class VersionRange:
    """``package`` installed at a version ``>= low`` and ``< high`` (either bound may be open)."""

    package: str
    low: str | None = None
    high: str | None = None

    def contains(self, version: str | None) -> bool:
        if version is None:
            return False
        release = parse_version(version)
        if self.low is not None and release < parse_version(self.low):
            return False
        return self.high is None or release < parse_version(self.high)

    def __str__(self) -> str:
        bounds = [f">={self.low}" if self.low else "", f"<{self.high}" if self.high else ""]
        return f"{self.package} {','.join(b for b in bounds if b) or '(any version)'}"


@dataclass(frozen=True)
class KnownIssue:
    key: str
    part: str  # the op it concerns (``op_specs.OPS``), or MATMULS
    kernel_family: str | None  # the kernel family of that op it concerns (``kernel_names.Family``); None: any
    summary: str
    vendor: str  # "cuda", "rocm" or "cpu" (a run without a GPU, or with ``use_cpu``)
    versions: tuple[VersionRange, ...]
    in_pass: str  # the pass the bug hits: FORWARD or BACKWARD
    upstream: tuple[str, ...]
    fixes: tuple[str, ...]  # what a user can do, best first
    # CUDA compute capabilities [from, below); None: any. ROCm entries name architectures instead (empty: any).
    capability_from: tuple[int, int] | None = None
    capability_below: tuple[int, int] | None = None
    archs: tuple[str, ...] = ()
    established: str = ""  # what this project established about it, and how
    # An installed package that routes the affected kernel elsewhere (the issue is then a warning, not a stop).
    avoided_by: str | None = None
    avoided_note: str = ""
    workaround: str | None = None  # what the plugin does about it itself (``workarounds.py``), if anything
    run_dtype: str | None = None  # the dtype of the run it concerns (``run_dtype.DTYPES``); None: any
    without_cpu_bf16: bool = False  # only on a CPU without bf16 dot products (``Stack.cpu_bf16_dot_products``)
    only_slow: bool = False  # the run works, slower: a warning in every phase, never a stop

    def matches(self, stack: Stack, passes: tuple[str, ...], dtype: str = BF16) -> bool:
        if self.in_pass not in passes or stack.device != self.vendor:
            return False
        if self.run_dtype is not None and dtype != self.run_dtype:
            return False
        if self.without_cpu_bf16 and stack.cpu_bf16_dot_products:
            return False
        if self.capability_from is not None:
            if stack.capability is None or not self.capability_from <= stack.capability < self.capability_below:
                return False
        if self.archs and stack.arch not in self.archs:
            return False
        return all(r.contains(stack.version(r.package)) for r in self.versions)

    def avoided(self, stack: Stack) -> bool:
        return self.avoided_by is not None and stack.version(self.avoided_by) is not None

    def where(self) -> str:
        if self.vendor == "cpu":
            return "cpu without bf16 dot products" if self.without_cpu_bf16 else "cpu"
        if self.capability_from is None:
            return f"{self.vendor} {', '.join(self.archs) or '(any GPU)'}"
        low, high = self.capability_from, self.capability_below
        return f"{self.vendor} compute capability >= {low[0]}.{low[1]} and < {high[0]}.{high[1]}"


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        key="fla-hopper-triton-gated-bwd",
        part=Op.GDN_CHUNK,
        kernel_family=Family.FLA,
        summary=(
            "Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs miscompiles fla's gated chunk_bwd_dqkwg (the GDN "
            "backward); fla raises at the first backward, after its kernels compiled (minutes on a fresh machine)"
        ),
        vendor="cuda",
        capability_from=(9, 0),
        capability_below=(10, 0),
        versions=(VersionRange("fla-core"), VersionRange("triton", "3.4.0", "3.7.1")),
        in_pass=BACKWARD,
        upstream=(
            "fla-org/flash-linear-attention#640",
            "fla-org/flash-linear-attention#826",
            "fla-org/flash-linear-attention#983",
            "unslothai/unsloth#5276",
            "unslothai/unsloth-zoo#1010",
        ),
        fixes=(
            'upgrade Triton: pip install "triton>=3.7.1" (or a torch >= 2.12.1, which ships Triton 3.7.1)',
            "or install TileLang, which fla then uses for this kernel (needs nvcc on PATH): pip install tilelang",
            f"or set {BACKEND_ENV_VAR}=torch to train the GDN layers with the PyTorch path ({TORCH_GDN_GPU_COST})",
        ),
        established="hit on an H200 (docs/benchmarks.md); fla's own guard names the range",
        avoided_by="tilelang",
        avoided_note=(
            "tilelang is installed: fla routes chunk_bwd_dqkwg to TileLang when nvcc is on PATH and the call "
            "passes its checks, else fla's guard stops the first backward (unverified for Zebra on a GPU)"
        ),
    ),
    KnownIssue(
        key="fla-rocm-autotune-stages",
        part=Op.GDN_CHUNK,
        kernel_family=Family.FLA,
        summary=(
            "Triton's autotuning of fla kernels with num_stages >= 3 configs hangs on MI300X (reported for "
            "chunk_h.py's chunk_bwd_kernel_dh and KDA's chunk_kda_bwd_kernel_intra); a hang at the first "
            "backward gives no message"
        ),
        vendor="rocm",
        versions=(VersionRange("fla-core"),),
        in_pass=BACKWARD,
        upstream=("AMD-AGI/Primus tools/hybrid/patch_fla_triton_autotune_hang.sh",),
        fixes=(
            f"if a ROCm run still stops at its first backward with no message, set {FLA_MAX_STAGES_ENV_VAR}=2: "
            f"every autotuned fla kernel of the GDN path then tunes at most 2 stages",
        ),
        established=(
            "fla 0.6.0's GDN backward never launches either reported kernel: its dh comes from "
            "chunk_delta_h.py, whose state-recurrence kernels (the runtime-length loops over chunks) tune "
            "num_stages {1} (backward) and {1, 2} (forward recompute) on every GPU with less than 166,912 B of "
            "shared memory, every AMD Instinct GPU among them; four backward kernels tune {2, 3, 4} with "
            "compile-time loop bounds (chunk_bwd_kernel_dqkwg, chunk_bwd_kernel_dv_local, "
            "recompute_w_u_fwd_kernel, prepare_wy_repr_bwd_kernel), not reported to hang (Primus trains its "
            "GDN configs on MI300X through the same kernels, unpatched). Found by running Zebra's GDN forward "
            "and backward under Triton's interpreter and reading fla's autotune configs (docs/rocm.md)"
        ),
        workaround=TRITON_STAGE_CAP,
    ),
    KnownIssue(
        key=TRITON_CACHE_SHARED,
        part=Op.GDN_CHUNK,
        kernel_family=Family.FLA,
        summary=(
            "ranks that share one Triton cache directory race while they compile and autotune fla's kernels "
            "(reported: AMD's Primus carried a cache directory per local rank)"
        ),
        vendor="rocm",
        versions=(VersionRange("fla-core"),),
        in_pass=BACKWARD,
        upstream=("AMD-AGI/Primus tools/hybrid/patch_fla_triton_autotune_hang.sh",),
        fixes=("set TRITON_CACHE_DIR to a directory of its own in each rank before it starts",),
        established=(
            "not reproduced: Triton 3.8 writes each cache file in a temporary directory and renames it into "
            "place (atomic on POSIX); Primus's current script has its per-rank cache commented out"
        ),
        workaround=TRITON_CACHE_PER_RANK,
    ),
    KnownIssue(
        key=CPU_BF16_EMULATED,
        part=MATMULS,
        kernel_family=None,
        summary=(
            "a bf16 run on a CPU without bf16 dot products (no AVX-512-BF16, AMX or Arm bf16): PyTorch and vLLM's "
            "CPU build emulate every bf16 matrix multiply, many times slower than fp32 — the Zebra and a dense "
            'model alike (measured: docs/benchmarks.md, "bf16 on a CPU without bf16 dot products")'
        ),
        vendor="cpu",
        versions=(VersionRange("torch"),),
        in_pass=FORWARD,
        # #146508: bf16 (and fp16) matmuls 44-499x slower than fp32 on AVX2-only CPUs (open); #86550: PyTorch's
        # AMP docs say bf16 can be slower than fp32 without AVX-512-BF16.
        upstream=("pytorch/pytorch#146508", "pytorch/pytorch#86550"),
        fixes=(
            f"serving: vllm serve ... --dtype {FP32} (vLLM's auto serves a bf16 checkpoint in bf16)",
            f"inference (chat, api, eval-long): infer_dtype: {FP32} (LLaMA-Factory's auto is fp32 on a CPU)",
            "training: bf16: false",
        ),
        established=(
            "measured on a 2-core AMD EPYC without avx512_bf16 or AMX (issue 46), and reproduced on an AMX Xeon "
            "with oneDNN capped at AVX2 (ONEDNN_MAX_CPU_ISA=AVX2): docs/benchmarks.md"
        ),
        run_dtype=BF16,
        without_cpu_bf16=True,
        only_slow=True,
    ),
)
