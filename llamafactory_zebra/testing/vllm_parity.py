"""Building small Zebra checkpoints, serving them with vLLM, and measuring vLLM's log-probs against the
transformers model (``ZebraForCausalLM``) run on the same tokens. Shared by ``tests_vllm/`` (the vLLM venv), the fast
lane's serving smoke test and ``tests_vllm/lora_reference.py`` (the training venv); vLLM is imported only inside the
functions that serve."""

from __future__ import annotations

import copy
import gc
import os
import subprocess
import sys
from dataclasses import dataclass

import torch

from llamafactory_zebra.configuration_zebra import ZebraConfig
from llamafactory_zebra.modeling_zebra import ZebraForCausalLM

# The released MLA/GDN head shapes (MLA q/k 64 + 64, v 128, latent 256; GDN key 256, value 512) at a
# small width: few layers, hidden 128, vocab 512.
RELEASED_HEADS_SMALL = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["gdn", "mla", "gdn", "mla"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "q_lora_rank": 96,
    "kv_lora_rank": 256,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "gdn_num_heads": 1,
    "gdn_head_dim": 256,
    "gdn_expand_v": 2,
    "max_position_embeddings": 1024,
    # Weights large enough that the next-token distributions are far from uniform (std 0.02 leaves every
    # log-prob near -log(vocab), where any implementation "agrees").
    "initializer_range": 0.1,
    "bos_token_id": None,
    "eos_token_id": None,
}


def zebra_model(seed: int = 0, **overrides) -> ZebraForCausalLM:
    """fp32 model with random weights; every RMSNorm weight is perturbed so a misplaced norm shows."""
    torch.manual_seed(seed)
    model = ZebraForCausalLM(ZebraConfig(**{**RELEASED_HEADS_SMALL, **overrides})).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.3 * torch.randn_like(param))
    return model


def prompts(lengths: list[int], vocab: int, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


def reference_logprobs(model: ZebraForCausalLM, tokens: list[int], dtype: torch.dtype) -> torch.Tensor:
    """``[T, vocab]`` fp32 log-probs of the next token after each position (one forward, no cache)."""
    if dtype != next(model.parameters()).dtype:
        model = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        logits = model(torch.tensor([tokens]), use_cache=False).logits[0]
    return logits.float().log_softmax(-1)


@dataclass
class Served:
    prompt: list[int]
    generated: list[int]
    logprobs: list[float]  # vLLM's log-prob of every prompt token after the first, then of every generated one


def start_engine(path, dtype: str, **kwargs):
    from vllm import LLM

    options = {
        "dtype": dtype,
        "enforce_eager": True,
        "max_model_len": 512,
        "skip_tokenizer_init": True,
        "max_num_seqs": 16,
        "seed": 0,
    }
    options.update(kwargs)
    return LLM(str(path), **options)


def stop_engine(llm) -> None:
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def serve(llm, prompt_list: list[list[int]], max_tokens: int, **generate_options) -> list[Served]:
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=1, prompt_logprobs=1, detokenize=False
    )
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompt_list], params, use_tqdm=False, **generate_options)
    served = []
    for prompt, output in zip(prompt_list, outputs, strict=True):
        completion = output.outputs[0]
        generated = list(completion.token_ids)
        values = [output.prompt_logprobs[i][prompt[i]].logprob for i in range(1, len(prompt))]
        values += [completion.logprobs[j][token].logprob for j, token in enumerate(generated)]
        served.append(Served(prompt, generated, values))
    return served


@dataclass
class Agreement:
    mean: float
    max: float
    greedy_gaps: list[float]  # per generated token: reference log-prob of its argmax minus that of vLLM's token


def agreement(served: Served, reference: torch.Tensor) -> Agreement:
    """vLLM's log-probs against a reference ``[T, vocab]`` computed on the prompt + vLLM's generated tokens."""
    tokens = served.prompt + served.generated
    expected = reference[torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])]
    errors = (torch.tensor(served.logprobs) - expected).abs()
    start = len(served.prompt) - 1
    steps = reference[start : start + len(served.generated)]
    gaps = (steps.max(-1).values - steps[torch.arange(len(served.generated)), torch.tensor(served.generated)]).tolist()
    return Agreement(errors.mean().item(), errors.max().item(), gaps)


def errors_between(reference: torch.Tensor, other: torch.Tensor, tokens: list[int]) -> tuple[float, float]:
    """Mean and max |Δ log-prob| of the observed tokens between two reference runs (the noise floor)."""
    index = torch.arange(len(tokens) - 1), torch.tensor(tokens[1:])
    delta = (reference[index] - other[index]).abs()
    return delta.mean().item(), delta.max().item()


def load_failures(paths: list) -> list[str]:
    """Start an engine on each path, in one child process (one vLLM import), the engine core in-process;
    return what each start raised. A start that succeeds is an error."""
    code = (
        "import os, sys\n"
        "os.environ['VLLM_ENABLE_V1_MULTIPROCESSING'] = '0'\n"
        "from vllm import LLM\n"
        "if __name__ == '__main__':\n"
        "    for path in sys.argv[1:]:\n"
        "        try:\n"
        "            LLM(path, dtype='float32', enforce_eager=True, max_model_len=128, skip_tokenizer_init=True,\n"
        "                distributed_executor_backend='uni')\n"
        "        except Exception as error:\n"
        "            print('REFUSED', path, '::', str(error).replace(chr(10), ' '), flush=True)\n"
        "        else:\n"
        "            print('STARTED', path, flush=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, *map(str, paths)], capture_output=True, text=True, timeout=600
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith(("REFUSED", "STARTED"))]
    assert len(lines) == len(paths), result.stdout[-2000:] + result.stderr[-4000:]
    return lines


def check_within_bf16_noise(model: ZebraForCausalLM, served_list: list[Served], multiple: float = 3.0) -> str:
    """vLLM-bf16's |Δ log-prob| against the fp32 model stays within ``multiple`` × transformers-bf16's own
    (mean and max over all tokens of all prompts); each greedy token is the argmax or a near-tie."""
    vllm_errors, floor_errors, gaps = [], [], []
    for served in served_list:
        tokens = served.prompt + served.generated
        exact = reference_logprobs(model, tokens, torch.float32)
        result = agreement(served, exact)
        vllm_errors.append((result.mean, result.max))
        floor_errors.append(errors_between(exact, reference_logprobs(model, tokens, torch.bfloat16), tokens))
        gaps += result.greedy_gaps
    vllm_mean = sum(m for m, _ in vllm_errors) / len(vllm_errors)
    floor_mean = sum(m for m, _ in floor_errors) / len(floor_errors)
    vllm_max, floor_max = max(m for _, m in vllm_errors), max(m for _, m in floor_errors)
    summary = (
        f"bf16 |Δlogprob| vs fp32: vLLM mean {vllm_mean:.4f} max {vllm_max:.4f}; "
        f"transformers bf16 mean {floor_mean:.4f} max {floor_max:.4f}; largest greedy gap {max(gaps):.4f}"
    )
    assert floor_mean > 0, summary
    assert vllm_mean <= multiple * floor_mean, summary
    assert vllm_max <= multiple * floor_max, summary
    # A near-tie: the reference's argmax beats vLLM's token by no more than bf16's own noise.
    assert max(gaps) <= 2 * floor_max, summary
    return summary


# vLLM's model runners, by the value of the switch that forces each (``serving/vllm/runner.py``).
RUNNERS = {"V1": "0", "V2": "1"}
RUNNER_ENV_VAR = "VLLM_USE_V2_MODEL_RUNNER"
_REFUSAL_PROBE = """
import sys
from vllm.engine.arg_utils import EngineArgs
try:
    EngineArgs(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=512,
               skip_tokenizer_init=True).create_engine_config()
except Exception as error:  # vLLM's refusal, whatever its type (pydantic wraps a ValueError)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    print("REFUSED", type(error).__name__ + ": " + " ".join(lines).split(" [type=")[0])
"""


def runner_refusal(path, runner: str) -> str | None:
    """vLLM's own reason for refusing to build an engine for the checkpoint at ``path`` under ``runner`` (``V1``
    or ``V2``, forced by ``VLLM_USE_V2_MODEL_RUNNER``), or None when it builds the configuration: asked of vLLM in
    a fresh interpreter (vLLM reads the switch once per process), never assumed."""
    env = {**os.environ, RUNNER_ENV_VAR: RUNNERS[runner]}
    result = subprocess.run(
        [sys.executable, "-c", _REFUSAL_PROBE, str(path)], env=env, capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        return f"the probe exited with {result.returncode}: {result.stderr.strip().splitlines()[-1:]}"
    refused = [line for line in result.stdout.splitlines() if line.startswith("REFUSED ")]
    return refused[0].removeprefix("REFUSED ") if refused else None
