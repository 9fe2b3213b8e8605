"""The fast lane's one look at serving: one small Zebra, one prompt, vLLM (in its own venv, a child
process) against the transformers model, so a layer change that breaks vLLM parity fails here and not
an hour later in ``tests_vllm/``. Skipped, with the reason, where ``.venv-vllm`` does not exist
(``scripts/vllm_env.sh`` makes it). The helpers are ``llamafactory_zebra/testing/vllm_parity.py``'s."""

import json
import os
import subprocess

import pytest
from repo_paths import REPO

from llamafactory_zebra.testing.vllm_parity import agreement, prompts, reference_logprobs, zebra_model

VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"

PROMPT_LENGTH = 12
NEW_TOKENS = 4
FP32_TOLERANCE = 1e-3  # tests_vllm/test_parity_fp32.py's

SERVE = """
import json, sys
from llamafactory_zebra.testing.vllm_parity import serve, start_engine, stop_engine
path, prompt, new_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
if __name__ == "__main__":
    llm = start_engine(path, "float32", max_num_seqs=1, max_model_len=64)
    (served,) = serve(llm, [prompt], new_tokens)
    stop_engine(llm)
    print("SERVED " + json.dumps({"generated": served.generated, "logprobs": served.logprobs}), flush=True)
"""


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no .venv-vllm (bash scripts/vllm_env.sh sets it up)")
def test_vllm_serves_one_prompt_as_the_transformers_model_computes_it(tmp_path):
    from llamafactory_zebra.testing.vllm_parity import Served

    model = zebra_model(seed=0, mla_norm="qk_head", rope_interleave=True)
    model.save_pretrained(tmp_path)
    (prompt,) = prompts([PROMPT_LENGTH], model.config.vocab_size)
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this child: one process to start
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    result = subprocess.run(
        [str(VLLM_PYTHON), "-c", SERVE, str(tmp_path), json.dumps(prompt), str(NEW_TOKENS)],
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
        cwd=REPO,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("SERVED ")]
    assert result.returncode == 0 and lines, result.stdout[-2000:] + result.stderr[-4000:]
    served = Served(prompt, **json.loads(lines[-1].removeprefix("SERVED ")))
    assert len(served.generated) == NEW_TOKENS
    exact = reference_logprobs(model, served.prompt + served.generated, model.dtype)
    result = agreement(served, exact)
    assert result.max < FP32_TOLERANCE, result
    assert max(result.greedy_gaps) < FP32_TOLERANCE, result.greedy_gaps
