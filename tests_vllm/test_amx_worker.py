"""A Zebra whose first layer is MLA, served in bf16 in vLLM's engine-core worker process on a CPU with AMX.

vLLM's CPU attention runs AMX instructions without asking Linux for the tile state; in a worker whose
first AMX user is that kernel (MLA at layer 0: attention runs before any oneDNN bf16 GEMM asked), it died
with SIGILL (exit code -4). The plugin asks in every process it loads in (``serving/vllm/amx.py``). The
engine core runs in its own process here (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), as under ``vllm serve``;
the parity tests run it in-process with a GDN first layer, which never met the crash. Only a CPU with AMX
tiles can show it: elsewhere the test is skipped, saying so.
"""

import os
import subprocess
import sys

import pytest
import torch

from llamafactory_zebra.testing.vllm_parity import check_within_bf16_noise, zebra_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not torch.cpu._is_amx_tile_supported(),
        reason="needs a CPU with AMX tiles (amx_tile in lscpu's flags: Intel Sapphire Rapids or later)",
    ),
]

CHILD = """
import json, sys
from vllm import LLM, SamplingParams

if __name__ == "__main__":
    llm = LLM(sys.argv[1], dtype="bfloat16", enforce_eager=True, max_model_len=128, skip_tokenizer_init=True)
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, logprobs=1, prompt_logprobs=1,
                            detokenize=False)
    prompt = [int(t) for t in sys.argv[2].split(",")]
    output = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
    generated = list(output.outputs[0].token_ids)
    values = [output.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))]
    values += [output.outputs[0].logprobs[j][t].logprob for j, t in enumerate(generated)]
    print("RESULT", json.dumps({"generated": generated, "logprobs": values}), flush=True)
"""


def test_a_first_layer_mla_zebra_is_served_in_the_worker_process(tmp_path):
    import json

    from llamafactory_zebra.testing.vllm_parity import Served

    model = zebra_model(
        seed=4, num_hidden_layers=3, layer_types=["mla", "gdn", "mla"], hidden_size=256, num_attention_heads=4,
        mla_norm="lora",
    )  # fmt: skip
    model.save_pretrained(tmp_path)
    prompt = [5, 77, 301]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), ",".join(map(str, prompt))],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, (
        f"vLLM exited with {result.returncode} (-4: SIGILL in a worker):\n{result.stderr[-4000:]}"
    )
    served = json.loads(lines[0].removeprefix("RESULT "))
    print(check_within_bf16_noise(model, [Served(prompt, served["generated"], served["logprobs"])]))
