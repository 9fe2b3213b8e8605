"""Switch Triton to its CPU interpreter, with the two gaps that stop fla's kernels there closed.

``TRITON_INTERPRET=1`` must be set before triton is first imported, so this runs at the top of a fresh
process (the checks run in a subprocess of the test). Triton 3.8's interpreter differs from compiled
Triton in two ways that fla trips over; both are closed here, each the narrowest change that gives
the interpreter compiled Triton's behaviour, neither touches fla's or Liger's code:

1. Autotuning: the autotuner times every config through the active GPU driver, and the interpreter
   has none ("0 active drivers"). All configs of a kernel compute the same function (they differ in
   block sizes, warps and stages only), so the first config is used, as Triton does for a kernel with
   a single config.
2. Loop induction variables: in compiled Triton the variable of a ``for i in range(n)`` /
   ``tl.range`` loop is an int32 tensor; the interpreter runs the loop in Python and yields ``int``,
   so fla's ``i_t.to(tl.int64)`` (``fla/ops/common/chunk_delta_h.py`` since fla 0.4) raises
   ``AttributeError: 'int' object has no attribute 'to'``. The rewriter that already turns every
   assignment into a tensor is extended to turn such loop variables into tensors too
   (``tl.static_range`` loops keep Python ints, as compiled Triton keeps them constexpr).

3. bfloat16 arithmetic: the interpreter stores bf16 as its raw ``uint16`` bits and converts them
   only in casts, so ``tl.dot`` of bf16 blocks (fla's chunk kernels feed bf16 to the tensor cores)
   and bf16 element-wise math and sums (``tl.sum`` keeps bf16) add and multiply bit patterns
   (overflow warnings, results ~1e10). Here bf16
   operands are widened to fp32 (exact), the op runs in fp32, and a bf16 result is rounded back to
   nearest-even — what a GPU's bf16 ALU and tensor core do (fp32 accumulation for ``tl.dot``).

``launched`` counts interpreted kernel launches by kernel name, so a check can prove that the Triton
kernels ran rather than a PyTorch fallback.
"""

from __future__ import annotations

import ast
import collections
import os
import sys

import numpy as np

launched: collections.Counter[str] = collections.Counter()


def _is_dynamic_range(node: ast.expr) -> bool:
    """``range(...)`` or ``tl.range(...)`` (not ``tl.static_range``) as written in a kernel's source."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id == "range") or (
        isinstance(func, ast.Attribute) and func.attr == "range"
    )


def enable() -> None:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set; call enable() first")
    os.environ["TRITON_INTERPRET"] = "1"
    from triton.runtime import autotuner, interpreter

    autotuner.Autotuner.prune_configs = lambda self, kwargs: self.configs[:1]

    class _TensorLoopVariables(interpreter.ASTTransformer):
        def visit_For(self, node: ast.For) -> ast.For:
            self.generic_visit(node)
            if _is_dynamic_range(node.iter) and isinstance(node.target, ast.Name):
                as_tensor = ast.parse(f"{node.target.id} = interpreter_semantic.to_tensor({node.target.id}, False)")
                node.body.insert(0, as_tensor.body[0])
            return node

    interpreter.FunctionRewriter.ast_transformer = _TensorLoopVariables()
    _emulate_bf16_arithmetic(interpreter)

    run = interpreter.InterpretedFunction.run

    def counting_run(self, *args, **kwargs):
        launched[self.fn.__name__] += 1
        return run(self, *args, **kwargs)

    interpreter.InterpretedFunction.run = counting_run


def _emulate_bf16_arithmetic(interpreter) -> None:
    import triton.language as tl

    builder, handle = interpreter.InterpreterBuilder, interpreter.TensorHandle

    def widen(x):
        if x.dtype.scalar != tl.bfloat16:
            return x
        return handle((x.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def narrow(x):
        if x.dtype.scalar != tl.float32:
            return x
        bits = x.data.astype(np.float32).view(np.uint32)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return handle(rounded.astype(np.uint16), tl.bfloat16)

    def in_fp32(method):
        def run(self, *operands, **kwargs):
            if not any(isinstance(x, handle) and x.dtype.scalar == tl.bfloat16 for x in operands):
                return method(self, *operands, **kwargs)
            widened = [widen(x) if isinstance(x, handle) else x for x in operands]
            out = method(self, *widened, **kwargs)
            return narrow(out) if out.dtype.scalar == tl.float32 and method.__name__ != "create_dot" else out

        run.__name__ = method.__name__
        return run

    for name in ("binary_op", "unary_op", "create_fma", "create_dot"):
        setattr(builder, name, in_fp32(getattr(builder, name)))

    def reduce_in_fp32(method):
        def run(self, input):
            if input.dtype.scalar != tl.bfloat16:
                return method(self, input)
            wide = tl.core.tensor(widen(input.handle), input.type.with_element_ty(tl.float32))
            out = method(self, wide)
            outs = out if isinstance(out, list) else [out]
            narrowed = [tl.core.tensor(narrow(o.handle), o.type.with_element_ty(tl.bfloat16)) for o in outs]
            return narrowed if isinstance(out, list) else narrowed[0]

        return run

    interpreter.ReduceOps.sum = reduce_in_fp32(interpreter.ReduceOps.sum)
    interpreter.ScanOps.cumsum = reduce_in_fp32(interpreter.ScanOps.cumsum)
