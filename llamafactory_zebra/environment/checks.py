"""The checks behind ``llamafactory-zebra doctor``: is this machine's software stack right for training
Zebra, and if not, how to fix it.

Each check reports ``ok``, ``warn`` (works, but slower, degraded or not applicable here) or ``fail``
(training would break or give wrong results), with the fix.

Exit codes: 0 no check failed (warnings allowed); 1 at least one check failed; 2 bad command line.
A machine without a GPU is a *warning* (CPU-only installs are legitimate for tests, data preparation
and ``plan``); pass ``--require-gpu`` to make it a failure, as a launch script should.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ..attention_policy import LLAMAFACTORY_FA2, attn_implementation_for
from ..configuration_zebra import ZebraConfig
from ..kernels import NOTE, STOP, Resolution, detect_stack, fla_missing_message, resolve, this_machine
from ..kernels.known_issues import CPU_BF16_EMULATED
from ..kernels.run_dtype import PROBE_SHAPE, describe_rates, matmul_rates
from ..kernels.stack import gpu_inventory, numa_balancing, vendor_gpus_present
from .rocm_settings import rocm_env_file, rocm_settings

OK, WARN, FAIL = "ok", "warn", "fail"
EXIT_OK, EXIT_FAILED = 0, 1

PLUGIN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Machine:
    """What the checks need to know about the hardware, gathered once (``kernels/stack.py`` probes it)."""

    torch_version: str
    hip: str | None
    cuda: str | None
    gpu_names: tuple[str, ...]
    gpu_archs: tuple[str, ...]
    amd_gpus_present: bool
    nvidia_gpus_present: bool
    gpu_bf16: bool = False  # the first GPU computes in bf16
    built_for: tuple[str, ...] = ()  # the GPU architectures this torch build has kernels for
    numa_balancing: bool | None = None  # the kernel's NUMA balancing (None: unknown)
    cpu_bf16_dot_products: bool = True  # the CPU has AVX-512-BF16, AMX or Arm bf16 (``Stack.cpu_bf16_dot_products``)

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_names)


def inspect_machine() -> Machine:
    machine, gpus = this_machine(), gpu_inventory()
    amd, nvidia = vendor_gpus_present()
    toolkit = machine.toolkit or ""
    return Machine(
        torch_version=machine.version("torch") or "?",
        hip=toolkit.removeprefix("ROCm ") if toolkit.startswith("ROCm") else None,
        cuda=toolkit.removeprefix("CUDA ") if toolkit.startswith("CUDA") else None,
        gpu_names=gpus.names,
        gpu_archs=gpus.archs,
        amd_gpus_present=amd,
        nvidia_gpus_present=nvidia,
        gpu_bf16=gpus.bf16,
        built_for=gpus.built_for,
        numa_balancing=numa_balancing(),
        cpu_bf16_dot_products=machine.cpu_bf16_dot_products,
    )


def check_torch_build(m: Machine) -> Check:
    build = f"ROCm/HIP {m.hip}" if m.hip else (f"CUDA {m.cuda}" if m.cuda else "CPU-only")
    detail = f"torch {m.torch_version}, {build} build"
    rocm_wheel = "pip install torch --index-url https://download.pytorch.org/whl/rocmX.Y (X.Y = your ROCm, e.g. 6.4)"
    if m.amd_gpus_present and not m.hip:
        return Check("torch build", FAIL, f"{detail}, but this machine has AMD GPUs (/dev/kfd, rocminfo)", rocm_wheel)
    if m.nvidia_gpus_present and not m.cuda:
        return Check(
            "torch build", FAIL, f"{detail}, but this machine has NVIDIA GPUs", "install a CUDA build of torch"
        )
    return Check("torch build", OK, detail)


def check_gpus(m: Machine, require_gpu: bool) -> Check:
    if not m.has_gpu:
        fix = (
            "if this machine has GPUs: check rocm-smi / nvidia-smi, HIP_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES "
            "and access to /dev/kfd and /dev/dri (video, render groups)"
        )
        return Check("GPUs", FAIL if require_gpu else WARN, "no GPU visible: training runs on CPU only", fix)
    detail = f"{len(m.gpu_names)} × {m.gpu_names[0]} ({', '.join(sorted(set(m.gpu_archs)))})"
    if m.hip:
        built_for = set(m.built_for)
        missing = sorted(set(m.gpu_archs) - built_for)
        if missing:
            return Check(
                "GPUs",
                FAIL,
                f"{detail}; torch has no kernels for {', '.join(missing)} (built for {', '.join(sorted(built_for))}): "
                "'invalid device function' or 'Illegal instruction' at the first kernel",
                "install a torch ROCm wheel built for your GPU architecture",
            )
    if len(m.gpu_names) in (2, 4) and "gfx942" in m.gpu_archs:
        return Check(
            "GPUs", WARN, f"{detail}: 2- and 4-GPU collectives are slow on MI300X", "use 1 or 8 GPUs per node"
        )
    return Check("GPUs", OK, detail)


# doctor's CPU probe: a quarter of the benchmarks' prompt chunk (under a second where bf16 is emulated).
DOCTOR_PROBE_SHAPE = (PROBE_SHAPE[0] // 4, *PROBE_SHAPE[1:])


def check_bf16(m: Machine) -> Check:
    if not m.has_gpu:
        rates = describe_rates(matmul_rates(DOCTOR_PROBE_SHAPE, repeats=2), DOCTOR_PROBE_SHAPE)
        if m.cpu_bf16_dot_products:
            # Nothing to act on: bf16 computes at the CPU's bf16 rate (the GPU's absence is the GPUs row's to say).
            return Check("bf16", OK, f"no GPU; the CPU has bf16 dot products: {rates}")
        return Check(
            "bf16",
            WARN,
            f"no GPU; the CPU has no bf16 dot products (no AVX-512-BF16, AMX or Arm bf16), bf16 is emulated: "
            f"{rates}; known issue {CPU_BF16_EMULATED} (kernels rows below)",
            "compute in fp32 on this CPU: vllm serve --dtype float32, infer_dtype: float32, bf16: false",
        )
    if m.gpu_bf16:
        return Check("bf16", OK, "supported")
    return Check(
        "bf16", FAIL, "this GPU has no bf16; Zebra trains in bf16 only (fp16 overflows)", "use MI250/MI300X or Ampere+"
    )


def _mla_head_dims() -> tuple[int, int]:
    from ..configuration_zebra import ZebraConfig

    c = ZebraConfig.from_preset("qwen3-1.7b-7mla21gdn-1m")
    return c.qk_nope_head_dim + c.qk_rope_head_dim, c.v_head_dim


def check_flash_attn(m: Machine) -> Check:
    qk, v = _mla_head_dims()
    needs = f"MLA needs head dims q/k {qk}, v {v}"
    try:
        flash_attn = importlib.import_module("flash_attn")
    except Exception as error:  # a broken build raises ImportError, OSError or RuntimeError
        fix = (
            "ROCm: build ROCm/flash-attention with GPU_ARCHS=gfx942 (CK) or set "
            "FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE; "
            "CUDA: pip install flash-attn --no-build-isolation"
        )
        # Packed rows then run sdpa on the samples' borders (attention_policy: flex_attention on a GPU).
        return Check(
            "flash-attn",
            WARN,
            f"not importable ({type(error).__name__}); packed rows use sdpa on the samples' borders instead",
            fix,
        )
    backend = (
        "Triton (AMD)" if os.environ.get("FLASH_ATTENTION_TRITON_AMD_ENABLE", "").upper() == "TRUE" else "CK/CUDA"
    )
    detail = f"{flash_attn.__version__}, {backend} backend; {needs}"
    if max(qk, v) > 256:
        return Check("flash-attn", FAIL, f"{detail}: FlashAttention-2 stops at 256", "use sdpa (flash_attn: sdpa)")
    if not m.has_gpu:
        return Check("flash-attn", WARN, f"{detail}; no GPU to run it on")
    return _run_flash_attn(flash_attn, qk, v, detail)


def _run_flash_attn(flash_attn, qk: int, v: int, detail: str) -> Check:
    """One causal forward/backward with MLA's head dims: catches wrong-arch builds before a 10-hour job."""
    import torch

    try:
        q = torch.randn(1, 128, 16, qk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, 128, 8, qk, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        val = torch.randn(1, 128, 8, v, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        flash_attn.flash_attn_func(q, k, val, causal=True).float().sum().backward()
        torch.cuda.synchronize()
    except Exception as error:  # any kernel failure means the same fix
        return Check("flash-attn", FAIL, f"{detail}; test run failed: {error}", "rebuild flash-attn for this GPU arch")
    return Check("flash-attn", OK, f"{detail}; forward/backward ran")


def check_fla(m: Machine) -> Check:
    try:
        fla = importlib.import_module("fla")
        importlib.import_module("fla.ops.gated_delta_rule")
        triton = importlib.import_module("triton")
    except Exception as error:  # Triton/driver problems surface as many exception types
        # A warning, not a failure: training runs, on the PyTorch path, at the cost the kernel report states.
        return Check(
            "fla (GDN kernels)",
            WARN,
            f"not importable ({type(error).__name__})" + (f": {fla_missing_message()}" if m.has_gpu else ""),
            "pip install fla-core (needs Triton; on ROCm the Triton that ships with the ROCm torch wheel)",
        )
    detail = f"fla {getattr(fla, '__version__', '?')}, triton {triton.__version__}"
    return Check("fla (GDN kernels)", OK if m.has_gpu else WARN, detail + ("" if m.has_gpu else "; no GPU to run on"))


# The settings doctor resolves kernels for, having no YAML: the recipe's (flash_attn: fa2, enable_liger_kernel).
DOCTOR_ATTENTION, DOCTOR_LIGER = attn_implementation_for(LLAMAFACTORY_FA2), True


def kernel_resolution(training: bool, serving: bool = False) -> Resolution:
    """The kernels a run of the recipe's settings gets on this machine (or ``ZEBRA_FAKE_STACK``'s): the
    registry's choice for each op, as the ops make it."""
    return resolve(
        detect_stack(),
        training=training,
        attn_implementation=DOCTOR_ATTENTION,
        liger_enabled=DOCTOR_LIGER,
        serving=serving,
    )


def check_kernels(m: Machine, training: bool, serving: bool = False) -> Check:
    """Which kernel each op gets and why; a combination that stops training fails the training check, a
    workaround the plugin applies is a note."""
    resolution = kernel_resolution(training, serving)
    name = f"kernels ({resolution.phase})"
    lines = resolution.table(fixes=False).splitlines()
    detail = "\n".join([lines[0].removeprefix(f"kernels for {resolution.phase} ").rstrip(":"), *lines[1:]])
    stops = resolution.with_severity(STOP)
    if stops:
        return Check(name, FAIL, detail, "\n".join(fix for p in stops for fix in p.fixes))
    warned = [p for p in resolution.problems if p.severity not in (STOP, NOTE)]
    return Check(name, WARN if warned else OK, detail, "\n".join(fix for p in warned for fix in p.fixes))


def check_vllm_runner(m: Machine) -> Check:
    """Which of vLLM's model runners would serve the Zebra here, and why (``serving/vllm/runner.py``)."""
    if importlib.util.find_spec("vllm") is None:
        return Check("vLLM model runner", OK, "vLLM is not installed here (it serves from its own venv)")
    try:
        from ..serving.vllm.runner import ENV_VAR, V2, runner_choice, v2_refused

        runner, why = runner_choice()
    except Exception as error:  # a broken vLLM install fails in many ways; serving is not training's concern
        return Check("vLLM model runner", WARN, f"vLLM does not import ({type(error).__name__}: {error})")
    if runner == V2 and v2_refused():
        return Check("vLLM model runner", WARN, f"{runner} ({why})", f"unset {ENV_VAR} (vLLM then serves with V1)")
    return Check("vLLM model runner", OK, f"{runner} ({why})")


def check_liger(m: Machine) -> Check:
    try:
        liger = importlib.metadata.version("liger-kernel")
        importlib.import_module("liger_kernel.transformers.fused_linear_cross_entropy")
    except Exception as error:  # missing package or a broken Triton
        return Check(
            "Liger fused CE",
            WARN,
            f"not importable ({type(error).__name__}): the loss falls back to the chunked PyTorch version",
            "pip install liger-kernel",
        )
    if not m.has_gpu:
        return Check("Liger fused CE", WARN, f"{liger}; Triton kernels need a GPU (CPU uses the PyTorch chunked loss)")
    return Check("Liger fused CE", OK, liger)


def check_deepspeed(m: Machine) -> Check:
    try:
        import deepspeed
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator
    except Exception as error:  # a broken install can fail in many ways
        return Check("DeepSpeed", FAIL, f"not importable: {error}", "pip install deepspeed")
    accelerator = get_accelerator().device_name()
    ops = deepspeed.ops.__compatible_ops__
    usable = ", ".join(name for name in ("cpu_adam", "fused_adam") if ops.get(name))
    detail = f"{deepspeed.__version__}, accelerator {accelerator}; JIT-buildable ops: {usable or 'none'}"
    if m.has_gpu and accelerator != "cuda":
        return Check("DeepSpeed", FAIL, detail, "unset DS_ACCELERATOR (ROCm GPUs are DeepSpeed's 'cuda' accelerator)")
    if not m.has_gpu:
        return Check("DeepSpeed", WARN, detail + " (CPU + gloo: tests only)")
    return Check("DeepSpeed", OK, detail + "; the presets need no compiled op")


def check_collective_env(m: Machine) -> Check:
    if not m.hip:
        nccl = sorted(k for k in os.environ if k.startswith("NCCL_"))
        return Check("RCCL/NCCL env", OK, "not ROCm; NCCL variables set: " + (", ".join(nccl) or "none"))
    arch = next((a for a in m.gpu_archs if rocm_env_file(a) is not None), None)
    if arch is None:
        return Check("RCCL/NCCL env", WARN, f"no recommended settings for {', '.join(m.gpu_archs) or 'no GPU'}")
    missing = [f"{k}={v}" for k, v in rocm_settings(arch).items() if os.environ.get(k) != v]
    problems = [f"unset or different: {', '.join(missing)}"] if missing else []
    if m.numa_balancing:
        problems.append("NUMA balancing is on (sudo sysctl kernel.numa_balancing=0)")
    if int(os.environ.get("NNODES", "1")) > 1 and "NCCL_SOCKET_IFNAME" not in os.environ:
        problems.append("multi-node without NCCL_SOCKET_IFNAME")
    if problems:
        return Check("RCCL/NCCL env", WARN, "; ".join(problems), f"set -a; . {rocm_env_file(arch)}; set +a")
    return Check("RCCL/NCCL env", OK, f"recommended {arch} settings present")


def check_torchrun(m: Machine) -> Check:
    path = shutil.which("torchrun")
    if path is None:
        status = FAIL if len(m.gpu_names) > 1 else WARN
        return Check(
            "torchrun", status, "not on PATH: llamafactory-cli train cannot start workers", "activate the venv"
        )
    interpreter = _script_interpreter(path)
    if interpreter and os.path.realpath(interpreter) != os.path.realpath(sys.executable):
        return Check(
            "torchrun",
            WARN,
            f"{path} runs {interpreter}, not this interpreter ({sys.executable}): workers may lack the plugin",
            "activate the environment llamafactory-zebra is installed in",
        )
    return Check("torchrun", OK, path)


def _script_interpreter(path: str) -> str | None:
    """The ``#!`` interpreter of a console script (``None`` for binaries or ``/usr/bin/env`` shebangs)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if not first.startswith("#!") or first.split()[0].endswith("/env"):
        return None
    return first[2:].split()[0]


def _unmet_requirements(distribution: str) -> list[str]:
    from packaging.requirements import Requirement

    problems = []
    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{requirement.name} missing ({distribution} needs {requirement.specifier or 'it'})")
            continue
        if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
            problems.append(f"{requirement.name} {installed} ({distribution} needs {requirement.specifier})")
    return problems


def check_versions(m: Machine) -> Check:
    problems = _unmet_requirements("llamafactory-zebra") + _unmet_requirements("llamafactory")
    if problems:
        return Check("version pins", FAIL, "; ".join(problems), "pip install -e . (reinstalls matching versions)")
    versions = {
        name: importlib.metadata.version(name) for name in ("llamafactory", "transformers", "peft", "accelerate")
    }
    return Check("version pins", OK, ", ".join(f"{k} {v}" for k, v in versions.items()))


PLUGIN_PROBE = f"""
import json, sys
import llamafactory.model.loader
import transformers
active = "llamafactory_zebra.integration.activation" in sys.modules
try:
    zebra = transformers.AutoConfig.for_model({ZebraConfig.model_type!r}).model_type == {ZebraConfig.model_type!r}
except Exception as error:
    zebra = repr(error)
print("PROBE" + json.dumps({{"active": active, "zebra_config": zebra}}))
"""


def check_plugin(m: Machine) -> Check:
    """What a torchrun worker sees: a fresh interpreter that only imports LLaMA-Factory."""
    if importlib.util.find_spec("llamafactory_zebra_hook") is None:
        return Check(
            "plugin active", FAIL, "the start-up hook is not installed", "pip install -e . (or reinstall the wheel)"
        )
    from llamafactory_zebra_hook import DISABLE_ENV, is_disabled

    if is_disabled():
        return Check("plugin active", FAIL, f"{DISABLE_ENV} is set: LLaMA-Factory stays stock", f"unset {DISABLE_ENV}")
    try:
        result = subprocess.run(
            [sys.executable, "-c", PLUGIN_PROBE], capture_output=True, text=True, timeout=PLUGIN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return Check("plugin active", FAIL, f"importing LLaMA-Factory took over {PLUGIN_TIMEOUT_S} s", "")
    found = re.search(r"^PROBE(.*)$", result.stdout, re.MULTILINE)
    if found is None:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        return Check("plugin active", FAIL, f"fresh interpreter failed: {last}", "pip install -e . and rerun")
    probe = json.loads(found.group(1))
    if probe["active"] and probe["zebra_config"] is True:
        return Check("plugin active", OK, "a fresh interpreter importing LLaMA-Factory registers Zebra")
    return Check(
        "plugin active",
        FAIL,
        f"fresh interpreter: activation imported={probe['active']}, "
        f"AutoConfig {ZebraConfig.model_type!r}={probe['zebra_config']}",
        "pip install -e . (the .pth start-up hook activates the plugin)",
    )


def all_checks(require_gpu: bool) -> list[Callable[[Machine], Check]]:
    return [
        check_torch_build,
        lambda m: check_gpus(m, require_gpu),
        check_bf16,
        check_flash_attn,
        check_fla,
        check_liger,
        lambda m: check_kernels(m, training=True),
        lambda m: check_kernels(m, training=False),
        lambda m: check_kernels(m, training=False, serving=True),
        check_vllm_runner,
        check_deepspeed,
        check_collective_env,
        check_torchrun,
        check_versions,
        check_plugin,
    ]


def run_checks(machine: Machine, checks: Iterable[Callable[[Machine], Check]]) -> list[Check]:
    return [check(machine) for check in checks]


def exit_code(results: Iterable[Check]) -> int:
    return EXIT_FAILED if any(r.status == FAIL for r in results) else EXIT_OK


def render(results: list[Check]) -> str:
    width = max(len(r.name) for r in results)
    lines = [f"{'check':<{width}}  status  detail"]
    indent = " " * (width + 10)
    for r in results:
        lines.append(f"{r.name:<{width}}  {r.status:<6}  " + r.detail.replace("\n", "\n" + indent))
        if r.fix and r.status != OK:
            lines.append(f"{indent}fix: " + r.fix.replace("\n", f"\n{indent}fix: "))
    counts = {s: sum(r.status == s for r in results) for s in (OK, WARN, FAIL)}
    lines.append(f"\n{counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} fail")
    lines.append(
        "After downloading a checkpoint, run `llamafactory-zebra verify MODEL_DIR` once (its MLA convention)."
    )
    return "\n".join(lines)
