"""Tests of the vLLM model plugin (``llamafactory_zebra/serving/vllm``). They run in the serving venv
(``scripts/vllm_env.sh``: vLLM CPU + this package, no LLaMA-Factory), never under ``tests/conftest.py``:

    cd REPO && OMP_NUM_THREADS=1 VENV/bin/python -m pytest tests_vllm -q -p no:cacheprovider

Each module starts one engine (tens of seconds on 2 cores) and runs every case it can on it.
"""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

pytest.importorskip("vllm", reason="tests_vllm runs in the vLLM serving venv (scripts/vllm_env.sh)")
