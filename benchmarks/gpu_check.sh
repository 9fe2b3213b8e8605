#!/usr/bin/env bash
# GPU checks of llamafactory_zebra.ops, for a machine with a CUDA/ROCm GPU and fla (pip `fla-core`).
#   1. op tests, including tests/test_ops_fla_gpu.py (fla kernels vs the PyTorch path; skipped elsewhere);
#   2. the GDN benchmark on the GPU with fla as an extra column.
# Finishes well within 10 minutes on one modern GPU (each step has its own time limit).
# Usage: bash benchmarks/gpu_check.sh [extra bench_gdn.py arguments]
set -euo pipefail
cd "$(dirname "$0")/.."

python - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu_check.sh: no CUDA/ROCm GPU visible to torch")
try:
    import fla
except ImportError:
    sys.exit("gpu_check.sh: fla is not importable; pip install fla-core")
print(f"torch {torch.__version__}, fla {getattr(fla, '__version__', '?')}, {torch.cuda.get_device_name()}")
PY

timeout 300 python -m pytest -q -rs -p no:cacheprovider \
    tests/test_ops_fla_gpu.py tests/test_ops_gated_delta_rule.py tests/test_ops_causal_conv1d.py tests/test_ops_packing.py

timeout 270 python benchmarks/bench_gdn.py --device cuda --lengths 2048 8192 32768 --repeats 3 "$@"
