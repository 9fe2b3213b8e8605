"""gpu_check's vLLM row, run in the vLLM venv (``scripts/vllm_env.sh``): bf16 parity with the HF model, tokens/s.

The model: a random Zebra of ~100M parameters with the released head shapes (``llamafactory_zebra/testing/serving_checkpoint.py``, the serving benchmarks' model),
in bf16. Parity: vLLM's bf16 log-prob of every prompt and greedy token (prompts of odd lengths, run as
one batch) against the transformers model in fp32 on the same tokens; the yardstick is bf16's own noise,
the same transformers model in bf16 against its fp32 self. PASS when vLLM's mean and max error are within
``TOLERANCE`` times that noise. Throughput: output tokens/s of one ``LLM.generate`` over 64 prompts of
256 token ids, 64 tokens out each (EOS ignored), eager mode (no CUDA graphs), start-up not counted.

    .venv-vllm/bin/python tools/gpu_check_vllm.py          # on the GPU machine (gpu_check.sh calls it)
    .venv-vllm/bin/python tools/gpu_check_vllm.py --cpu    # the same code on CPU, small sizes
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from llamafactory_zebra.testing.serving_checkpoint import build_checkpoint

TOLERANCE = 3.0
PROMPT_LENGTHS = (7, 97, 301)
GENERATED = 16


def reference_logprobs(model_dir: Path, sequences: list[list[int]], dtype: torch.dtype, device: str) -> list:
    """log p(token_t | tokens_<t) for t >= 1 of each sequence, from the transformers model, one at a time."""
    from llamafactory_zebra import ZebraForCausalLM

    model = ZebraForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    result = []
    with torch.no_grad():
        for ids in sequences:
            tokens = torch.tensor([ids], device=device)
            logits = model(input_ids=tokens).logits.float()
            logprobs = torch.log_softmax(logits[0, :-1], dim=-1)
            result.append(logprobs.gather(-1, tokens[0, 1:, None])[:, 0].cpu())
    del model
    return result


def vllm_run(model_dir: Path, args: argparse.Namespace) -> tuple[list[list[int]], list, float, int]:
    from vllm import LLM, SamplingParams

    # Eager: compiling and capturing CUDA graphs would not fit gpu_check.sh's time limit.
    llm = LLM(str(model_dir), dtype="bfloat16", max_model_len=1024, enforce_eager=True, gpu_memory_utilization=0.5)
    vocab = llm.get_tokenizer().vocab_size
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]
    params = SamplingParams(max_tokens=GENERATED, temperature=0.0, ignore_eos=True, logprobs=0, prompt_logprobs=0)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    sequences, served = [], []
    for prompt, output in zip(prompts, outputs, strict=True):
        generated = list(output.outputs[0].token_ids)
        ids = prompt + generated
        prompt_part = [
            entry[token].logprob for entry, token in zip(output.prompt_logprobs[1:], prompt[1:], strict=True)
        ]
        generated_part = [
            entry[token].logprob for entry, token in zip(output.outputs[0].logprobs, generated, strict=True)
        ]
        sequences.append(ids)
        served.append(torch.tensor(prompt_part + generated_part))

    throughput_prompts = [
        torch.randint(0, vocab, (args.prompt_tokens,), generator=generator).tolist() for _ in range(args.num_prompts)
    ]
    params = SamplingParams(max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True)
    started = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in throughput_prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - started
    produced = sum(len(o.outputs[0].token_ids) for o in outputs)
    del llm
    return sequences, served, seconds, produced


def errors(values: list, reference: list) -> tuple[float, float]:
    diffs = torch.cat([(v - r).abs() for v, r in zip(values, reference, strict=True)])
    return diffs.mean().item(), diffs.max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU with small sizes (tests the row)")
    parser.add_argument("--num-prompts", type=int)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--output-tokens", type=int)
    args = parser.parse_args()
    args.num_prompts = args.num_prompts or (4 if args.cpu else 64)
    args.output_tokens = args.output_tokens or (8 if args.cpu else 64)
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check_vllm: no GPU visible to torch (--cpu runs the same code on CPU)")

    with tempfile.TemporaryDirectory(prefix="gpu_check_vllm_") as tmp:
        model_dir = Path(tmp) / "zebra"
        parameters = build_checkpoint(model_dir, "bfloat16")["parameters"]
        sequences, served, seconds, produced = vllm_run(model_dir, args)
        fp32 = reference_logprobs(model_dir, sequences, torch.float32, device)
        bf16 = reference_logprobs(model_dir, sequences, torch.bfloat16, device)
    served_mean, served_max = errors(served, fp32)
    floor_mean, floor_max = errors(bf16, fp32)
    passed = served_mean <= TOLERANCE * floor_mean and served_max <= TOLERANCE * floor_max
    print(
        f"| vLLM bf16 parity | {'PASS' if passed else 'FAIL'} | {parameters / 1e6:.0f}M Zebra, prompts "
        f"{'/'.join(map(str, PROMPT_LENGTHS))} + {GENERATED} greedy, abs(log-prob - HF fp32): vLLM mean "
        f"{served_mean:.4f} max {served_max:.4f}; HF bf16 (noise) mean {floor_mean:.4f} max {floor_max:.4f}; "
        f"tolerance {TOLERANCE:g}x noise |"
    )
    print(
        f"| vLLM throughput | {produced / seconds:.0f} output tokens/s | LLM.generate, {args.num_prompts} prompts x "
        f"{args.prompt_tokens} tokens, {args.output_tokens} out, bf16: {produced} tokens in {seconds:.1f} s |"
    )
    if not passed:
        sys.exit(1)


if __name__ == "__main__":
    main()
