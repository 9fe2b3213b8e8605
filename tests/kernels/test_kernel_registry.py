"""The kernel registry (``kernels/registry.py``, ``decider.py``): the entries and their code, the switches'
semantics, and the fallback when an installed package does not load. What doctor says against what runs, per machine,
is ``test_kernel_matrix.py``."""

import ast
import doctest
import importlib
import importlib.util
from pathlib import Path

import pytest
import torch

from llamafactory_zebra import kernels as kernels_package
from llamafactory_zebra.kernel_names import Fact, Op
from llamafactory_zebra.kernels import (
    ATTENTION,
    FAMILIES,
    GDN_CHUNK,
    GDN_DECODE_STEP,
    GDN_PREFILL_IN_SLOTS,
    KERNELS,
    LOSS,
    OPS,
    SWITCHES,
    Call,
    KernelLoadError,
    KernelUnavailable,
    Key,
    Stack,
    decider,
    registry,
    run,
    select,
)
from llamafactory_zebra.kernels.registry import implementations

CPU = Stack("cpu", versions={"fla-core": "0.6.0"}, compiler="/usr/bin/c++")
H200 = Stack("cuda", "NVIDIA H200", (9, 0), "sm_90", {"fla-core": "0.6.0", "triton": "3.7.1", "liger-kernel": "0.8.5"})
DECODE = dict(state_dtype=torch.float32, state_rows_contiguous=True)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for switch in SWITCHES:
        monkeypatch.delenv(switch.env_var, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(decider, "_unusable", {})
    decider._select.cache_clear()
    yield
    decider._select.cache_clear()


def test_every_op_has_entries_with_one_family_name_each_and_unique_keys():
    for op in OPS:
        keys = implementations(op)
        assert keys and len(keys) == len(set(keys)), op
    assert {kernel.family for kernel in KERNELS} <= set(FAMILIES)
    assert {kernel.op for kernel in KERNELS} == set(OPS)


def test_every_entry_names_functions_that_exist_at_its_ops_entry_points():
    """Each entry's code resolves to a callable (the vLLM layer's imports vLLM: its venv checks those), and the
    entries of one op answer at the same entry points (``run``'s ``entry_point``); only the dense attention mask,
    which the model's own attention function runs, names none."""
    vllm = importlib.util.find_spec("vllm") is not None
    for op in OPS:
        entries = [kernel for kernel in KERNELS if kernel.op == op]
        points = {frozenset(kernel.code) for kernel in entries if kernel.code}
        assert len(points) == 1, (op, points)
        for kernel in entries:
            for point, where in kernel.code.items():
                if vllm or "serving.vllm" not in where:
                    assert callable(kernel.function(point)), (op, kernel.key, where)
    assert [kernel.key for kernel in KERNELS if not kernel.code] == ["dense_mask"]


def test_a_call_with_a_fact_its_op_does_not_read_fails_loudly():
    with pytest.raises(ValueError, match="GDN decode step: a call with unknown fact.s. state_dtpye"):
        select(GDN_DECODE_STEP, Call.on("cpu", torch.float32, state_dtpye=torch.float32), CPU)
    with pytest.raises(ValueError, match="GDN chunk: a call with unknown fact.s. width .its entries read: none."):
        select(GDN_CHUNK, Call.on("cpu", width=4), CPU)
    assert set(registry.FACTS) == set(OPS)


def test_the_switches_leave_out_force_and_demand():
    gpu, cpu = Call.on("cuda"), Call.on("cpu")
    assert select(GDN_CHUNK, gpu, H200).kernel.key == "fla"
    assert select(GDN_CHUNK, cpu, H200).kernel.key == "torch-chunk"  # a CPU tensor on a GPU machine
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ZEBRA_GDN_BACKEND", "torch")  # leaves fla out; the automatic rule still picks the formulation
        assert select(GDN_CHUNK, gpu, H200).kernel.key == "torch-parallel"
        patch.setenv("ZEBRA_GDN_TORCH_CHUNK", "chunk")  # forces one formulation, even where auto would not
        assert select(GDN_CHUNK, gpu, H200).kernel.key == "torch-chunk"
        patch.setenv("ZEBRA_GDN_TORCH_CHUNK", "parallel")
        assert select(GDN_CHUNK, cpu, CPU).kernel.key == "torch-parallel"
        patch.setenv("ZEBRA_GDN_BACKEND", "fla")  # demands fla: nothing else stands in
        with pytest.raises(KernelUnavailable, match="ZEBRA_GDN_BACKEND=fla but GDN chunk cannot run it on cpu"):
            select(GDN_CHUNK, cpu, CPU)
        patch.setenv("TRITON_INTERPRET", "1")  # ... unless Triton's interpreter runs it on the CPU
        assert select(GDN_CHUNK, cpu, CPU).kernel.key == "fla"
    assert select(GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), CPU).kernel.key == "cpp"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ZEBRA_CPU_KERNELS", "torch")
        assert select(GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), CPU).kernel.key == "torch"
        patch.setenv("ZEBRA_PACKED_SDPA", "dense_mask")  # sdpa only: FlashAttention's varlen path stays
        assert select(ATTENTION, Call.on("cuda", attn_implementation="sdpa"), H200).kernel.key == "dense_mask"
        flash = Call.on("cuda", attn_implementation="flash_attention_2")
        assert select(ATTENTION, flash, H200).kernel.key == "flash_varlen"
        patch.setenv("ZEBRA_CPU_KERNELS", "rust")
        with pytest.raises(ValueError, match="ZEBRA_CPU_KERNELS='rust' is not valid; use one of auto, torch"):
            select(GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), CPU)
    assert select(LOSS, Call.on("cuda"), H200, force="chunked").kernel.key == "chunked"
    with pytest.raises(KernelUnavailable, match="loss: liger demanded but loss cannot run it on cpu"):
        select(LOSS, Call.on("cpu"), CPU, force="liger")


def test_each_entry_fits_only_the_calls_it_takes():
    no_bf16 = Stack("cpu", compiler="/usr/bin/c++")
    bf16 = Stack("cpu", cpu_features=frozenset({"avx512_bf16"}), compiler="/usr/bin/c++")
    bf16_call = Call.on("cpu", torch.bfloat16, state_dtype=torch.float32)
    assert select(GDN_PREFILL_IN_SLOTS, bf16_call, bf16).kernel.key == "cpp-bf16-gemm"
    assert select(GDN_PREFILL_IN_SLOTS, bf16_call, no_bf16).kernel.key == "cpp"
    fp32_call = Call.on("cpu", torch.float32, state_dtype=torch.float32)
    assert select(GDN_PREFILL_IN_SLOTS, fp32_call, bf16).kernel.key == "cpp"
    bf16_state = Call.on("cpu", torch.bfloat16, state_dtype=torch.bfloat16)
    assert select(GDN_PREFILL_IN_SLOTS, bf16_state, bf16).kernel.key == "torch-bf16-gemm"
    assert (
        select(GDN_PREFILL_IN_SLOTS, Call.on("cpu", torch.float64, state_dtype=torch.float64), bf16).kernel.key
        == "torch"
    )
    assert (
        select(
            GDN_DECODE_STEP, Call.on("cpu", torch.bfloat16, **{**DECODE, "state_dtype": torch.bfloat16}), CPU
        ).kernel.key
        == "cpp"
    )
    for dtype, state in ((torch.float32, {**DECODE, "state_rows_contiguous": False}), (torch.float64, DECODE)):
        assert select(GDN_DECODE_STEP, Call.on("cpu", dtype, **state), CPU).kernel.key == "torch"
    windows = Stack("cpu", compiler="/usr/bin/c++", platform="win32")
    passed_over = dict(
        (k.key, why)
        for k, why in select(GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), windows).passed_over
    )
    assert passed_over["cpp"] == "not Linux (win32)"
    assert select(GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), Stack("cpu")).kernel.key == "torch"


def test_a_package_that_does_not_load_passes_to_the_next_entry_with_one_warning(monkeypatch):
    warnings = []
    monkeypatch.setattr(decider, "_emitted", set())
    monkeypatch.setattr(decider.logger, "warning", warnings.append)
    monkeypatch.setattr(decider, "detect_stack", lambda: H200)

    def broken_fla():
        raise KernelLoadError("fla.ops.gated_delta_rule does not import (a broken Triton)")

    ran = {key: (lambda key=key: key) for key in implementations(GDN_CHUNK)} | {"fla": broken_fla}
    monkeypatch.setattr(decider, "implementation", lambda kernel, point: ran[kernel.key])
    assert run(GDN_CHUNK, Call.on("cuda")) == "torch-parallel"
    assert run(GDN_CHUNK, Call.on("cuda")) == "torch-parallel"
    (warning,) = warnings
    assert "missing or does not import" in warning
    assert "does not load here (fla.ops.gated_delta_rule does not import" in select(GDN_CHUNK, Call.on("cuda")).reason


def test_the_packed_attention_examples_hold():
    results = doctest.testmod(decider)
    assert results.attempted >= 2 and results.failed == 0


def _spelled_names(source: str, names: set[str]) -> list[tuple[int, str]]:
    """``(line, name)`` of each string literal in ``source`` that is one of ``names``, docstrings and the keys of
    dict literals that map a switch's values (``"dense_mask": ...``: the variable's values, the user's words)
    left out."""
    tree = ast.parse(source)
    skipped = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            skipped.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg == "values" and isinstance(node.value, ast.Dict):
            skipped |= {id(key) for key in node.value.keys}
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in names and id(node) not in skipped
    ]


def test_no_op_name_entry_key_or_fact_is_spelled_outside_its_one_home():
    """An entry key is spelled in its row of the registry's table (``kernels/registry.py``, which derives ``Key``),
    op names and facts in ``kernel_names.py``; the rest of the package names the members. (Plain words that are
    also keys and families, ``fla``, ``torch``, ``cpp``, are distribution names too, so only the others are held.)"""
    keys = {key.value for key in Key if "-" in key.value or "_" in key.value}
    words = {op.value for op in Op if " " in op.value} | {fact.value for fact in Fact}
    package = Path(kernels_package.__file__).resolve().parents[1]
    homes = {"kernels/registry.py": keys, "kernel_names.py": words}
    spelled, in_the_table = [], []
    for path in sorted(package.rglob("*.py")):
        relative = str(path.relative_to(package))
        found = _spelled_names(path.read_text(encoding="utf-8"), keys | words)
        spelled += [f"{relative}:{line}: {name!r}" for line, name in found if name not in homes.get(relative, ())]
        in_the_table += [name for _, name in found if relative == "kernels/registry.py" and name in keys]
    assert spelled == []
    assert sorted(in_the_table) == sorted(kernel.key for kernel in KERNELS if kernel.key in keys)  # once per row
    assert _spelled_names('"""torch-chunk"""\nx = {"conv-op": 1}\nSwitch(values={"torch-chunk": 2})\n', keys) == [
        (2, "conv-op")
    ]
