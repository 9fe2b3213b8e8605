"""The fla side of the seam door (``kernels/fla_seams.py``) and the ROCm autotune cap it carries.

fla's autotune configs depend on the GPU's shared memory (``fla.utils.check_shared_mem``); on a CPU every
check fails, as on MI300X's 64 KiB (every AMD Instinct GPU is below the 166,912 B they test for), so the
configs this machine's fla builds are the ones an MI300X gets: the facts ``known_issues.py`` states are
checked here on them.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from repo_paths import HELPERS

pytest.importorskip("fla", reason="fla (pip fla-core, in the `test` extra) is not installed")

from llamafactory_zebra.kernels import FAKE_STACK_ENV_VAR, fla_seams  # noqa: E402
from llamafactory_zebra.seam import drift, is_wrapped, original, unwrap  # noqa: E402

MI300X = {"device": "rocm", "capability": [9, 4], "arch": "gfx942", "name": "AMD Instinct MI300X",
          "versions": {"fla-core": "0.6.0", "pytorch-triton-rocm": "3.5.0"}}  # fmt: skip


def _stages(kernel) -> set[int]:
    while not hasattr(kernel, "configs"):
        kernel = kernel.fn
    return {config.num_stages for config in kernel.configs}


def _module(record):
    import importlib

    return importlib.import_module(record.module)


@pytest.mark.parametrize("record", fla_seams.FLA_SEAMS, ids=lambda record: record.attribute)
def test_the_kernels_are_the_ones_the_workaround_was_written_against(record):
    assert drift(record) is None


def test_on_amd_sized_shared_memory_only_compile_time_loops_tune_three_stages_or_more():
    """The established half of ``fla-rocm-autotune-stages``: the state recurrences (loops over chunks, the
    shape the hang was reported for) tune at most 2 stages; the backward kernels that tune 3 and 4 are these."""
    stages = {record.attribute: _stages(original(_module(record), record.attribute)) for record in fla_seams.FLA_SEAMS}
    assert {name: stages[name] for name in fla_seams.STATE_RECURRENCE} == {
        "chunk_gated_delta_rule_fwd_kernel_h_blockdim64": {1, 2},
        "chunk_gated_delta_rule_bwd_kernel_dhu_blockdim64": {1},
    }
    assert {name for name, found in stages.items() if max(found) > 3} == {
        "chunk_bwd_kernel_dqkwg",
        "chunk_bwd_kernel_dv_local",
        "recompute_w_u_fwd_kernel",
        "prepare_wy_repr_bwd_kernel",
    }


@pytest.fixture
def capped(monkeypatch):
    """Install the cap as the ops would on a (faked) machine, and take it off afterwards."""
    installed = {}

    def install(stack: dict, max_stages: str | None = None):
        monkeypatch.setenv(FAKE_STACK_ENV_VAR, json.dumps(stack))
        if max_stages is None:
            monkeypatch.delenv("ZEBRA_FLA_MAX_STAGES", raising=False)
        else:
            monkeypatch.setenv("ZEBRA_FLA_MAX_STAGES", max_stages)
        fla_seams.install_stage_cap()
        found = {r.attribute: (_module(r), is_wrapped(_module(r), r.attribute)) for r in fla_seams.FLA_SEAMS}
        installed.update({name: module for name, (module, wrapped) in found.items() if wrapped})
        return {name for name, (_, wrapped) in found.items() if wrapped}

    yield install
    for name, module in installed.items():
        unwrap(module, name)


def test_on_rocm_the_state_recurrences_are_capped_and_nothing_else(capped):
    assert capped(MI300X) == set(fla_seams.STATE_RECURRENCE)
    assert capped(MI300X) == set(fla_seams.STATE_RECURRENCE)  # idempotent
    for record in fla_seams.FLA_SEAMS:
        module = _module(record)
        kernel, upstream = getattr(module, record.attribute), original(module, record.attribute)
        if record.attribute in fla_seams.STATE_RECURRENCE:
            assert kernel is not upstream and _stages(kernel) == _stages(upstream) <= {1, 2}  # no change on 0.6
        else:
            assert kernel is upstream


def test_the_switch_caps_every_kernel_of_the_table_and_off_caps_none(capped):
    cuda = {"device": "cuda", "capability": [9, 0], "versions": {"fla-core": "0.6.0"}}
    assert capped(cuda) == set()
    assert capped(MI300X, "off") == set()
    assert capped(cuda, "2") == {record.attribute for record in fla_seams.FLA_SEAMS}
    for record in fla_seams.FLA_SEAMS:
        module = _module(record)
        assert _stages(getattr(module, record.attribute)) == {
            min(n, 2) for n in _stages(original(module, record.attribute))
        }
    with pytest.raises(ValueError, match="ZEBRA_FLA_MAX_STAGES='two' is not valid"):
        capped(cuda, "two")


# Triton's interpreter ignores num_stages, so this checks the other half: a capped copy of fla's autotuners still
# launches fla's kernels and computes what they compute (forward and backward), against the PyTorch path.
CAPPED_RUN = textwrap.dedent(
    """
    import os
    from triton_interpreter import interpreter
    interpreter.enable()
    import torch
    from llamafactory_zebra.kernels import fla_seams
    from llamafactory_zebra.ops import chunk_gated_delta_rule
    from llamafactory_zebra.seam import is_wrapped

    def run():
        gen = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(1, 40, 2, 16, generator=gen, requires_grad=True) for _ in range(3))
        g = (-torch.rand(1, 40, 2, generator=gen)).requires_grad_()
        beta = torch.rand(1, 40, 2, generator=gen).requires_grad_()
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        o.square().sum().backward()
        return torch.cat([o.flatten(), *(t.grad.flatten() for t in (q, k, v, g, beta))])

    os.environ["ZEBRA_GDN_BACKEND"] = "fla"
    fla = run()
    wrapped = all(is_wrapped(__import__(r.module, fromlist=["_"]), r.attribute) for r in fla_seams.FLA_SEAMS)
    launched = sum(interpreter.launched.values())
    os.environ["ZEBRA_GDN_BACKEND"] = "torch"
    reference = run()
    error = float((fla - reference).norm() / reference.norm())
    print(f"RESULT wrapped={wrapped} launched={launched} error={error:.2e}")
    """
)


@pytest.mark.slow  # a Python process under Triton's interpreter
def test_capped_kernels_still_compute_the_gated_delta_rule(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "1", "ZEBRA_FLA_MAX_STAGES": "2", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HELPERS), env.get("PYTHONPATH")]))
    env.pop(FAKE_STACK_ENV_VAR, None)
    result = subprocess.run([sys.executable, "-c", CAPPED_RUN], env=env, capture_output=True, text=True, timeout=900)
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line is not None, result.stderr[-3000:]
    fields = dict(part.split("=") for part in line.split()[1:])
    assert fields["wrapped"] == "True" and int(fields["launched"]) > 0
    assert float(fields["error"]) < 1e-4
