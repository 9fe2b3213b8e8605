#!/usr/bin/env bash
# GPU validation of llamafactory-zebra, run once on a machine with one CUDA or ROCm GPU.
# Prints one table (benchmarks/gpu_check.py): versions; fla kernels vs the PyTorch path
# (tests/test_ops_fla_gpu.py); one packed bf16 training step with the GPU backends vs the PyTorch
# backends; tokens/s, MFU and peak memory vs the planner of the tiny and a 2-layer real-width Zebra at
# 8k and 32k tokens. (fla vs PyTorch kernel timings: python benchmarks/bench_gdn.py --device cuda.)
# Needs: pip install -e '.[gpu,test]' (fla-core, flash-attn). Each step has its own time limit; the
# whole script stays under 10 minutes (first fla calls compile and autotune Triton kernels).
# Usage: bash benchmarks/gpu_check.sh [--peak-tflops N]   (N: dense bf16 peak if the GPU is not known)
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

timeout 570 python benchmarks/gpu_check.py "$@"
