#!/usr/bin/env bash
# GPU validation of llamafactory-zebra, run once on a machine with one CUDA or ROCm GPU.
# One process (tools/gpu_check.py), so fla's Triton kernels compile and autotune once and later rows
# reuse them; each row is printed the moment it finishes and has its own time limit, so a lease that
# ends early still returns every finished row. Rows: versions, the resolved kernels (training and
# inference) and any known-broken combination; parity of the GDN chunk / recurrent / conv ops and one MLA
# layer at Zebra's real shapes (bf16 fast path vs fp32 PyTorch, over the bf16 PyTorch path's own error);
# the 28-layer Zebra against a same-width Qwen3-1.7B training step at 8k and 32k, Zebra alone at 128k;
# the decode step at 1k and 32k context. Row limits add up to 445 s: the table fits 480 s, compilation included.
# Needs: pip install -e '.[gpu,test]' (fla-core, liger-kernel; flash-attn if you have a build).
# Then the latent-decode row (tools/gpu_check_latent.py, at most 2 more minutes): the Triton latent MLA
# decode against the PyTorch reference at the released shapes, fp32 and bf16, and its time against sdpa
# over expanded K/V.
# Then the vLLM row (tools/gpu_check_vllm.py, in the vLLM venv of scripts/vllm_env.sh, at most 4 more
# minutes): bf16 log-prob parity with the HF model within 3x bf16's own noise, and output tokens/s. It
# says "not run" when there is no vLLM venv (VLLM_PYTHON, default .venv-vllm/bin/python).
# Usage: bash tools/gpu_check.sh [--peak-tflops N] [--budget-scale X]
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

timeout 480 python -u tools/gpu_check.py "$@"
status=$?
[ "$status" -eq 124 ] && echo "| gpu_check | TIMEOUT | the whole table passed 480 s; the rows above are complete |"

latent_status=0
timeout 120 python -u tools/gpu_check_latent.py || latent_status=$?
[ "$latent_status" -eq 124 ] && echo "| latent decode (Triton) | TIMEOUT | over its 120 s limit |"
[ "$latent_status" -gt 2 ] && [ "$latent_status" -ne 124 ] && echo "| latent decode (Triton) | ERROR (exit $latent_status) | no row printed |"

VLLM_PYTHON=${VLLM_PYTHON:-.venv-vllm/bin/python}
if [ -x "$VLLM_PYTHON" ] && "$VLLM_PYTHON" -c "import vllm" >/dev/null 2>&1; then
  vllm_log=${TMPDIR:-/tmp}/gpu_check_vllm.log
  vllm_status=0
  timeout 240 "$VLLM_PYTHON" tools/gpu_check_vllm.py >"$vllm_log" 2>&1 || vllm_status=$?
  grep '^| vLLM' "$vllm_log" || echo "| vLLM | FAIL (exit $vllm_status) | no result: see $vllm_log |"
else
  echo "| vLLM | not run | no vLLM at $VLLM_PYTHON: bash scripts/vllm_env.sh (or set VLLM_PYTHON) |"
fi
exit "$status"
