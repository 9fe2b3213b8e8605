"""The Triton latent decode (``ops/latent_attention/triton_decode.py``) under Triton's CPU interpreter,
against the plain reference.

One subprocess (this file run as a script: ``TRITON_INTERPRET=1`` must precede the first triton import,
and ``triton_interpreter.interpreter`` closes the interpreter's bf16 gaps) runs every case and writes the
relative error and the kernels launched; the tests assert that both kernels ran and the error bounds:

- fp32: ``FP32_TOLERANCE`` (the interpreter's dots are IEEE fp32; a GPU's too, the kernel asks for it);
- bf16 caches: ``BF16_TOLERANCE``, the kernel multiplies in bf16 (the softmax weights rounded to bf16 for
  the second product) where the reference computes in fp32 from the same bf16 rows (measured 1e-3-4e-3).

Cases: the small shapes of ``testing/latent_cache.SHAPES`` (odd head counts, MQA, scales and none, row
padding) in the block-16 and block-528 layouts (lengths on both sides of page borders, NaN in every row
no request owns), with three splits (a 1-token request leaves two of them empty) and with the default
split count, and the released head shapes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the Triton decode kernel needs triton (in the `test` extra)")
pytest.importorskip("numpy", reason="Triton's interpreter needs numpy (in the `test` extra)")

FP32_TOLERANCE = 1e-5
BF16_TOLERANCE = 1e-2
DTYPES = ("fp32", "bf16")
SMALL = ("gqa_scaled", "gqa_unscaled", "mqa_odd_heads", "one_head")
CASES = [
    *(f"{shape}-{layout}-{dtype}-{splits}" for shape in SMALL for layout in ("block16", "block528")
      for dtype in DTYPES for splits in ("3", "default")),
    *(f"released-block16-{dtype}-default" for dtype in DTYPES),
]  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from repo_paths import HELPERS, REPO

    out = tmp_path_factory.mktemp("latent_triton") / "results.json"
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HELPERS), str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, str(Path(__file__)), str(out), *CASES],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    for case, result in results.items():  # shown with -s or -rA
        print(f"{case}: {result['error']:.1e}")
    return results


@pytest.mark.parametrize("case", CASES)
def test_triton_decode_matches_the_reference(results, case):
    result = results[case]
    assert result["kernels"] == {"_split_kernel": 1, "_merge_kernel": 1}, result["kernels"]
    assert result["shape"] == result["expected_shape"] and result["dtype"] == result["expected_dtype"]
    assert not result["nan"]
    tolerance = FP32_TOLERANCE if "-fp32-" in case else BF16_TOLERANCE
    assert result["error"] < tolerance, f"{case}: {result['error']:.2e}"


def run_case(case: str) -> dict:
    """Run one case (``shape-layout-dtype-splits``) and return what the test asserts on."""
    import torch
    from triton_interpreter import interpreter

    from llamafactory_zebra.ops.latent_attention import latent_decode_reference
    from llamafactory_zebra.ops.latent_attention.triton_decode import latent_decode_triton
    from llamafactory_zebra.testing.latent_cache import LAYOUTS, RELEASED, SHAPES, make_problem

    shape, layout, dtype_name, splits = case.split("-")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    block_size, lengths = LAYOUTS[layout] if shape != "released" else (16, [1, 33, 70])
    problem = make_problem(RELEASED if shape == "released" else SHAPES[shape], lengths, block_size, dtype=dtype)
    s = problem.shapes
    gen = torch.Generator().manual_seed(7)
    query = 2 * torch.randn(len(lengths), s.heads, s.nope_dim + s.rope_dim, generator=gen, dtype=torch.float64)
    q_latent, q_rope = problem.absorb(query)
    inputs = (q_latent.to(dtype).contiguous(), q_rope.to(dtype).contiguous(), problem.cache, problem.block_table)
    inputs += (problem.seq_lens, 0.3, s.kv_heads, s.scales_offset)
    interpreter.launched.clear()
    out = latent_decode_triton(*inputs, num_splits=None if splits == "default" else int(splits))
    kernels = dict(interpreter.launched)
    expected = latent_decode_reference(*inputs)
    error = (out.double() - expected.double()).norm() / expected.double().norm()
    return {
        "error": float(error),
        "kernels": kernels,
        "nan": bool(out.isnan().any()),
        "shape": list(out.shape),
        "expected_shape": list(expected.shape),
        "dtype": str(out.dtype),
        "expected_dtype": str(expected.dtype),
    }


if __name__ == "__main__":
    from triton_interpreter import interpreter

    interpreter.enable()  # before anything imports triton
    out_path, *cases = sys.argv[1:]
    Path(out_path).write_text(json.dumps({case: run_case(case) for case in cases}, indent=1))
