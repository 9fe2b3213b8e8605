#!/usr/bin/env bash
# Set up and run the test suite: Debian's chromium for the web UI test, venv + install with the test
# extra, ruff (lint and format check: CI fails on either), pytest.
# Usage (from the repository root):  bash scripts/test.sh [--fast] [pytest args]
#   --fast: the edit loop, `-m "not slow"`: leaves out the tests marked slow (those that start
#   llamafactory-cli, torchrun, a browser or another Python process) but the serving smoke test
#   (tests/serving/test_serving_smoke.py, where .venv-vllm exists); CI runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."

marks=()
if [ "${1:-}" = "--fast" ]; then
  marks=(-m "not slow")
  shift
fi

if [ ${#marks[@]} -eq 0 ] && [ -z "${ZEBRA_SKIP_BROWSER_TESTS:-}" ] && ! { command -v chromium && command -v chromedriver; } >/dev/null; then
  bash scripts/install_browser.sh || echo "warning: could not install chromium/chromedriver; the web UI test will fail (set ZEBRA_SKIP_BROWSER_TESTS=1 to skip it)" >&2
fi

VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# shellcheck disable=SC1091
source "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e ".[test]"

ruff check .
ruff format --check .
# The C++ CPU kernels, once per install (a few minutes), as a step of its own: the tests expect them to build
# on this machine and would otherwise build them inside the first test that runs a kernel.
llamafactory-zebra build-kernels
# Tiny models: one intra-op thread per process is fastest, and the multi-process tests (torchrun workers
# beside pytest) would otherwise oversubscribe the cores. Set OMP_NUM_THREADS to override.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# A process that aborts (SIGABRT, e.g. a torchrun rank) prints its Python stacks: the test's output shows
# where it was, not only "terminate called".
export PYTHONFAULTHANDLER=${PYTHONFAULTHANDLER:-1}
# Two pytest workers (ZEBRA_TEST_WORKERS=0 for one process): most tests are one single-threaded process
# that waits on imports, subprocesses and disk much of the time. Whole files go to one worker, so a
# module's fixtures (the trained distillation teacher, the converted models) are built once.
python -m pytest -q -n "${ZEBRA_TEST_WORKERS:-2}" --dist loadfile "${marks[@]}" "$@"

# vLLM serving (tests_vllm/, every test an engine start, so not in --fast): its own venv, since vLLM 0.32
# needs transformers>=5.16.1 and LLaMA-Factory 0.9.5 pins <=5.6. scripts/vllm_env.sh returns at once
# when the venv is current.
if [ ${#marks[@]} -eq 0 ]; then
  bash scripts/vllm_env.sh
  .venv-vllm/bin/python -m pytest tests_vllm -q -p no:cacheprovider
  # The API drift test against vLLM's CUDA wheel (0.33, docs/serving.md's tested versions), where that venv
  # exists: CI does not build it (several GB of CUDA wheels, past its 40-minute budget); make it with
  # `ZEBRA_VLLM_GPU=cuda bash scripts/vllm_env.sh .venv-vllm-cuda`.
  cuda_venv=${ZEBRA_VLLM_CUDA_VENV:-.venv-vllm-cuda}
  if [ -x "$cuda_venv/bin/python" ]; then
    "$cuda_venv/bin/python" -m pytest tests_vllm/test_vllm_seams.py -q -p no:cacheprovider
  else
    echo "skipped: the vLLM API drift test against the CUDA wheel (no $cuda_venv)"
  fi
fi
