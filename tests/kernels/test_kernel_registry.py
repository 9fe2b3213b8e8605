"""The kernel registry (``kernels/registry.py``, ``op_specs.py``, ``bindings.py``, ``decider.py``): the records, the
entries and the functions the ops bind to them, the switches' semantics, and the fallback when an installed package
does not load. What doctor says against what runs, per machine,
is ``test_kernel_matrix.py``."""

import ast
import doctest
import importlib
import importlib.util
import re
from pathlib import Path

import pytest
import torch

from llamafactory_zebra import kernels as kernels_package
from llamafactory_zebra.kernels import (
    KERNELS,
    OP_SPECS,
    OPS,
    SWITCHES,
    Call,
    EntryPoint,
    Fact,
    Family,
    KernelLoadError,
    KernelUnavailable,
    Key,
    Op,
    Stack,
    bind,
    bindings,
    decider,
    fixed_call,
    run,
    select,
)
from llamafactory_zebra.kernels.registry import implementations

# The modules that run the ops, which bind their entries' functions when imported (the vLLM layer imports vLLM:
# its venv checks that one).
OP_MODULES = ("llamafactory_zebra.ops", "llamafactory_zebra.loss", "llamafactory_zebra.distill.kd_loss")
OP_MODULES += ("llamafactory_zebra.layers.mla",)
VLLM_LAYER = "llamafactory_zebra.serving.vllm.gdn"

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


def test_every_op_has_one_record_and_entries_with_one_family_name_each_and_unique_keys():
    assert OPS == tuple(Op) and set(OP_SPECS) == set(Op)
    for op, spec in OP_SPECS.items():
        keys = implementations(op)
        assert spec.op == op and keys and len(keys) == len(set(keys)), op
    assert {kernel.family for kernel in KERNELS} <= set(Family)
    assert {kernel.op for kernel in KERNELS} == set(OPS)
    assert {kernel.key for kernel in KERNELS} == set(Key)  # every key is some row's, every row's key a member


def test_every_entry_has_the_function_its_ops_module_binds_at_each_entry_point():
    """Importing the modules that run the ops binds a callable for every entry at each of its op's entry points;
    only the dense attention mask, which the model's own attention function runs, has none."""
    vllm = importlib.util.find_spec("vllm") is not None
    for module in OP_MODULES + ((VLLM_LAYER,) if vllm else ()):
        importlib.import_module(module)
    expected = set()
    for op, spec in OP_SPECS.items():
        if op == Op.CONV_IN_SLOTS and not vllm:
            continue
        for point in spec.entry_points:
            expected.add((op, point))
            for kernel in (kernel for kernel in KERNELS if kernel.op == op and kernel.has_function):
                assert callable(decider.implementation(kernel, point)), (op, kernel.key, point)
    assert expected <= bindings.bound_ops()
    assert [kernel.key for kernel in KERNELS if not kernel.has_function] == [Key.DENSE_MASK]
    dense = next(kernel for kernel in KERNELS if kernel.key == Key.DENSE_MASK)
    with pytest.raises(LookupError, match="attention: dense_mask has no function of its own"):
        decider.implementation(dense)


def test_a_binding_names_exactly_its_ops_entries_at_one_of_its_entry_points():
    norm = {Key.CPP: print, Key.TORCH: print}
    with pytest.raises(ValueError, match="GDN gated RMSNorm at run: bind exactly its entries cpp, torch; unknown"):
        bind(Op.GATED_NORM, norm | {Key.FLA: print})
    with pytest.raises(ValueError, match="bind exactly its entries cpp, torch; missing: torch"):
        bind(Op.GATED_NORM, {Key.CPP: print})
    with pytest.raises(ValueError, match="conv: no entry point 'run'; its entry points: sequence, step"):
        bind(Op.CONV, {Key.FLA: print, Key.TORCH: print})
    with pytest.raises(TypeError, match="the functions of torch are not callable"):
        bind(Op.GATED_NORM, {Key.CPP: print, Key.TORCH: "gated_rms_norm_reference"})


def test_kernels_names_no_code_above_it():
    """No module of ``kernels/`` spells a module path of the package or a ``module:function`` in its code (so every
    edge it has is an import statement, which ``tests/repo/test_import_cycles.py`` holds to the floors; docstrings
    may cite), and only ``fla_seams.py`` imports by name, fla's own modules."""
    package_path = re.compile(r"llamafactory_zebra\.|^[\w.]+:\w+$")
    found = []
    for path in sorted(Path(kernels_package.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        for node in ast.walk(tree):
            if id(node) in docstrings:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and package_path.search(node.value):
                found.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
            if isinstance(node, ast.Import) and path.name != "fla_seams.py":
                found += [f"{path.name}:{node.lineno}: {a.name}" for a in node.names if a.name == "importlib"]
    assert found == []
    assert package_path.search("llamafactory_zebra.loss:logits_cross_entropy_sum")


def test_a_fixed_call_chooses_once_and_passes_an_entry_that_does_not_load_over(monkeypatch):
    monkeypatch.setattr(decider, "detect_stack", lambda: CPU)
    chosen = []

    def broken(*args):
        raise KernelLoadError("the C++ extension does not build here")

    def implementation(kernel, point=EntryPoint.RUN):
        chosen.append(kernel.key)
        return broken if kernel.key == Key.CPP else (lambda *args: kernel.key)

    monkeypatch.setattr(decider, "implementation", implementation)
    call = Call.on("cpu", torch.float32, **DECODE)
    step = fixed_call(Op.GDN_DECODE_STEP, call)
    assert step.kernel.key == Key.CPP
    assert step() == Key.TORCH and step() == Key.TORCH
    assert chosen == [Key.CPP, Key.TORCH, Key.TORCH]
    assert select(Op.GDN_DECODE_STEP, call).kernel.key == Key.TORCH  # the process agrees from then on


def test_a_call_with_a_fact_its_op_does_not_read_fails_loudly():
    with pytest.raises(ValueError, match="GDN decode step: a call with unknown fact.s. state_dtpye"):
        select(Op.GDN_DECODE_STEP, Call.on("cpu", torch.float32, state_dtpye=torch.float32), CPU)
    with pytest.raises(ValueError, match="GDN chunk: a call with unknown fact.s. width .its entries read: none."):
        select(Op.GDN_CHUNK, Call.on("cpu", width=4), CPU)
    assert all(spec.facts <= set(Fact) for spec in OP_SPECS.values())


def test_the_switches_leave_out_force_and_demand():
    gpu, cpu = Call.on("cuda"), Call.on("cpu")
    assert select(Op.GDN_CHUNK, gpu, H200).kernel.key == "fla"
    assert select(Op.GDN_CHUNK, cpu, H200).kernel.key == "torch-chunk"  # a CPU tensor on a GPU machine
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ZEBRA_GDN_BACKEND", "torch")  # leaves fla out; the automatic rule still picks the formulation
        assert select(Op.GDN_CHUNK, gpu, H200).kernel.key == "torch-parallel"
        patch.setenv("ZEBRA_GDN_TORCH_CHUNK", "chunk")  # forces one formulation, even where auto would not
        assert select(Op.GDN_CHUNK, gpu, H200).kernel.key == "torch-chunk"
        patch.setenv("ZEBRA_GDN_TORCH_CHUNK", "parallel")
        assert select(Op.GDN_CHUNK, cpu, CPU).kernel.key == "torch-parallel"
        patch.setenv("ZEBRA_GDN_BACKEND", "fla")  # demands fla: nothing else stands in
        with pytest.raises(KernelUnavailable, match="ZEBRA_GDN_BACKEND=fla but GDN chunk cannot run it on cpu"):
            select(Op.GDN_CHUNK, cpu, CPU)
        patch.setenv("TRITON_INTERPRET", "1")  # ... unless Triton's interpreter runs it on the CPU
        assert select(Op.GDN_CHUNK, cpu, CPU).kernel.key == "fla"
    assert select(Op.GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), CPU).kernel.key == "cpp"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ZEBRA_CPU_KERNELS", "torch")
        assert select(Op.GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), CPU).kernel.key == "torch"
        patch.setenv("ZEBRA_PACKED_SDPA", "dense_mask")  # sdpa only: FlashAttention's varlen path stays
        assert select(Op.ATTENTION, Call.on("cuda", attn_implementation="sdpa"), H200).kernel.key == "dense_mask"
        flash = Call.on("cuda", attn_implementation="flash_attention_2")
        assert select(Op.ATTENTION, flash, H200).kernel.key == "flash_varlen"
        patch.setenv("ZEBRA_CPU_KERNELS", "rust")
        with pytest.raises(ValueError, match="ZEBRA_CPU_KERNELS='rust' is not valid; use one of auto, torch"):
            select(Op.GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), CPU)
    assert select(Op.LOSS, Call.on("cuda"), H200, force="chunked").kernel.key == "chunked"
    with pytest.raises(KernelUnavailable, match="loss: liger demanded but loss cannot run it on cpu"):
        select(Op.LOSS, Call.on("cpu"), CPU, force="liger")


def test_each_entry_fits_only_the_calls_it_takes():
    no_bf16 = Stack("cpu", compiler="/usr/bin/c++")
    bf16 = Stack("cpu", cpu_features=frozenset({"avx512_bf16"}), compiler="/usr/bin/c++")
    bf16_call = Call.on("cpu", torch.bfloat16, state_dtype=torch.float32)
    assert select(Op.GDN_PREFILL_IN_SLOTS, bf16_call, bf16).kernel.key == "cpp-bf16-gemm"
    assert select(Op.GDN_PREFILL_IN_SLOTS, bf16_call, no_bf16).kernel.key == "cpp"
    fp32_call = Call.on("cpu", torch.float32, state_dtype=torch.float32)
    assert select(Op.GDN_PREFILL_IN_SLOTS, fp32_call, bf16).kernel.key == "cpp"
    bf16_state = Call.on("cpu", torch.bfloat16, state_dtype=torch.bfloat16)
    assert select(Op.GDN_PREFILL_IN_SLOTS, bf16_state, bf16).kernel.key == "torch-bf16-gemm"
    assert (
        select(Op.GDN_PREFILL_IN_SLOTS, Call.on("cpu", torch.float64, state_dtype=torch.float64), bf16).kernel.key
        == "torch"
    )
    assert (
        select(
            Op.GDN_DECODE_STEP, Call.on("cpu", torch.bfloat16, **{**DECODE, "state_dtype": torch.bfloat16}), CPU
        ).kernel.key
        == "cpp"
    )
    for dtype, state in ((torch.float32, {**DECODE, "state_rows_contiguous": False}), (torch.float64, DECODE)):
        assert select(Op.GDN_DECODE_STEP, Call.on("cpu", dtype, **state), CPU).kernel.key == "torch"
    windows = Stack("cpu", compiler="/usr/bin/c++", platform="win32")
    passed_over = dict(
        (k.key, why)
        for k, why in select(Op.GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), windows).passed_over
    )
    assert passed_over["cpp"] == "not Linux (win32)"
    assert select(Op.GDN_DECODE_STEP, Call.on("cpu", torch.float32, **DECODE), Stack("cpu")).kernel.key == "torch"


def test_a_package_that_does_not_load_passes_to_the_next_entry_with_one_warning(monkeypatch):
    warnings = []
    monkeypatch.setattr(decider, "_emitted", set())
    monkeypatch.setattr(decider.logger, "warning", warnings.append)
    monkeypatch.setattr(decider, "detect_stack", lambda: H200)

    def broken_fla():
        raise KernelLoadError("fla.ops.gated_delta_rule does not import (a broken Triton)")

    ran = {key: (lambda key=key: key) for key in implementations(Op.GDN_CHUNK)} | {"fla": broken_fla}
    monkeypatch.setattr(decider, "implementation", lambda kernel, point: ran[kernel.key])
    assert run(Op.GDN_CHUNK, Call.on("cuda")) == "torch-parallel"
    assert run(Op.GDN_CHUNK, Call.on("cuda")) == "torch-parallel"
    (warning,) = warnings
    assert "missing or does not import" in warning
    reason = select(Op.GDN_CHUNK, Call.on("cuda")).reason
    assert "does not load here (fla.ops.gated_delta_rule does not import" in reason


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
    """Entry keys, op names and facts are spelled in ``kernel_names.py``; the rest of the package, the registry's
    table included, names the members. (Plain words that are also keys and families, ``fla``, ``torch``, ``cpp``,
    are distribution names too, so only the others are held.)"""
    keys = {key.value for key in Key if "-" in key.value or "_" in key.value}
    words = {op.value for op in Op if " " in op.value} | {fact.value for fact in Fact}
    package = Path(kernels_package.__file__).resolve().parents[1]
    spelled = []
    for path in sorted(package.rglob("*.py")):
        relative = str(path.relative_to(package))
        found = _spelled_names(path.read_text(encoding="utf-8"), keys | words)
        spelled += [f"{relative}:{line}: {name!r}" for line, name in found if relative != "kernel_names.py"]
    assert spelled == []
    assert _spelled_names('"""torch-chunk"""\nx = {"conv-op": 1}\nSwitch(values={"torch-chunk": 2})\n', keys) == [
        (2, "conv-op")
    ]
