#!/usr/bin/env bash
# GPU validation of llamafactory-zebra, run once on a machine with one CUDA or ROCm GPU.
# Prints one table (benchmarks/gpu_check.py): versions; fla kernels vs the PyTorch path
# (tests/test_ops_fla_gpu.py); one packed bf16 training step with the GPU backends vs the PyTorch
# backends; tokens/s, MFU and peak memory vs the planner of the tiny and a 2-layer real-width Zebra at
# 8k and 32k tokens. (fla vs PyTorch kernel timings: python benchmarks/bench_gdn.py --device cuda.)
# Needs: pip install -e '.[gpu,test]' (fla-core, flash-attn). Each step has its own time limit; the
# whole script stays under 10 minutes (first fla calls compile and autotune Triton kernels).
# Then the vLLM row (benchmarks/gpu_check_vllm.py, in the vLLM venv of scripts/vllm_env.sh, at most 4 more
# minutes): bf16 log-prob parity with the HF model within 3x bf16's own noise, and output tokens/s. It
# says "not run" when there is no vLLM venv (VLLM_PYTHON, default .venv-vllm/bin/python).
# Usage: bash benchmarks/gpu_check.sh [--peak-tflops N]   (N: dense bf16 peak if the GPU is not known)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

timeout 570 python benchmarks/gpu_check.py "$@"

VLLM_PYTHON=${VLLM_PYTHON:-.venv-vllm/bin/python}
if [ -x "$VLLM_PYTHON" ] && "$VLLM_PYTHON" -c "import vllm" >/dev/null 2>&1; then
  vllm_log=${TMPDIR:-/tmp}/gpu_check_vllm.log
  status=0
  timeout 240 "$VLLM_PYTHON" benchmarks/gpu_check_vllm.py >"$vllm_log" 2>&1 || status=$?
  grep '^| vLLM' "$vllm_log" || echo "| vLLM | FAIL (exit $status) | no result: see $vllm_log |"
else
  echo "| vLLM | not run | no vLLM at $VLLM_PYTHON: bash scripts/vllm_env.sh (or set VLLM_PYTHON) |"
fi
