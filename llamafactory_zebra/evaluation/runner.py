"""Generate answers for the RULER-style samples and score them, per task × length and per depth × length.

Works on any causal LM with ``generate``: prompts are rendered by a ``PromptFormat`` (LLaMA-Factory's
chat template when one is given), batched with left padding, prefilled in chunks by transformers'
``prefill_chunk_size`` and decoded greedily through the model's own cache — for Zebra the hybrid
cache and its MLA decode path, the same one ``llamafactory-cli chat`` uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from .haystack import Haystack
from .prefill import chunked_prefill
from .scoring import mean_percent, score_sample
from .tasks import DEPTH_TASKS, Sample, TaskOptions, depth_grid, generate_samples

# Answer budgets per task (RULER's, shortened for niah where values are 7 digits).
TOKENS_TO_GENERATE = {
    "passkey": 16,
    "niah_single": 32,
    "niah_multikey": 32,
    "niah_multivalue": 64,
    "variable_tracking": 30,
    "common_words": 120,
    "qa_synthetic": 32,
}


class PromptFormat:
    """Turns a sample into prompt ids: one user turn through ``template`` (LLaMA-Factory's), then the
    answer prefix, so the model's first generated tokens are the answer itself."""

    def __init__(self, tokenizer: Any, template: Any | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template

    def encode_text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def ids(self, sample: Sample) -> list[int]:
        if self.template is None:
            prompt = self.encode_text(sample.prompt + "\n")
        else:
            messages = [{"role": "user", "content": sample.prompt}, {"role": "assistant", "content": ""}]
            prompt, _ = self.template.encode_oneturn(self.tokenizer, messages)
        return list(prompt) + self.encode_text(sample.answer_prefix)


@dataclass
class EvalSettings:
    tasks: Sequence[str]
    lengths: Sequence[int]
    samples: int = 20
    depths: int = 10
    seed: int = 42
    prefill_chunk_size: int = 8192
    batch_size: int = 1
    max_new_tokens: int | None = None
    options: TaskOptions = field(default_factory=TaskOptions)

    def new_tokens(self, task: str) -> int:
        return self.max_new_tokens or TOKENS_TO_GENERATE[task]


@dataclass
class SampleResult:
    sample: Sample
    prompt_tokens: int
    prediction: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        s = self.sample
        return {
            "task": s.task,
            "length": s.length,
            "index": s.index,
            "depth": s.depth,
            "prompt_tokens": self.prompt_tokens,
            "answers": list(s.answers),
            "prediction": self.prediction,
            "score": self.score,
        }


@torch.no_grad()
def generate_answers(
    model: nn.Module, tokenizer: Any, prompts: Sequence[list[int]], max_new_tokens: int, prefill_chunk_size: int
) -> list[str]:
    """Greedy answers for a batch of prompt ids (left-padded into one tensor)."""
    longest = max(map(len, prompts))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(prompts):
        input_ids[row, longest - len(ids) :] = torch.tensor(ids)
        attention_mask[row, longest - len(ids) :] = 1
    device = next(model.parameters()).device
    output = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        prefill_chunk_size=prefill_chunk_size if longest > prefill_chunk_size else None,
        pad_token_id=pad_id,
    )
    return tokenizer.batch_decode(output[:, longest:], skip_special_tokens=True)


def run_tasks(
    model: nn.Module,
    tokenizer: Any,
    prompt_format: PromptFormat,
    haystack: Haystack,
    settings: EvalSettings,
    progress: bool = True,
) -> list[SampleResult]:
    """Every sample of every task × length, answered and scored."""
    results: list[SampleResult] = []
    depths = depth_grid(settings.depths)
    for length in settings.lengths:
        for task in settings.tasks:
            # Prompt plus answer budget fill the length, as in RULER.
            new_tokens = settings.new_tokens(task)
            samples = generate_samples(
                task,
                length,
                settings.samples,
                lambda sample, extra=new_tokens: len(prompt_format.ids(sample)) + extra,
                haystack,
                seed=settings.seed,
                depths=depths,
                options=settings.options,
            )
            bar = tqdm(total=len(samples), desc=f"{task} @ {length}", disable=not progress, leave=False)
            for start in range(0, len(samples), settings.batch_size):
                batch = samples[start : start + settings.batch_size]
                prompts = [prompt_format.ids(sample) for sample in batch]
                answers = generate_answers(model, tokenizer, prompts, new_tokens, settings.prefill_chunk_size)
                for sample, prompt, answer in zip(batch, prompts, answers, strict=True):
                    score = score_sample(answer, sample.answers, sample.metric)
                    results.append(SampleResult(sample, len(prompt), answer, score))
                bar.update(len(batch))
            bar.close()
    return results


def summarize(results: Sequence[SampleResult], settings: EvalSettings) -> dict[str, Any]:
    """Mean score (percent) per task × length, the mean over tasks per length, and the depth heatmaps (all depth
    tasks together, and each alone)."""
    scores = {
        task: {
            str(length): mean_percent(r.score for r in results if r.sample.task == task and r.sample.length == length)
            for length in settings.lengths
        }
        for task in settings.tasks
    }
    average = {
        str(length): mean_percent(
            scores[task][str(length)] / 100 for task in settings.tasks if scores[task][str(length)] is not None
        )
        for length in settings.lengths
    }
    heatmap_tasks = [task for task in settings.tasks if task in DEPTH_TASKS]
    return {
        "scores": scores,
        "average": average,
        "depth_heatmap": depth_heatmap(results, heatmap_tasks, settings),
        # One grid per task too: a mean over tasks hides which one the model can do (passkey beside niah).
        "depth_heatmaps": {task: depth_heatmap(results, [task], settings) for task in heatmap_tasks},
    }


def depth_heatmap(results: Sequence[SampleResult], tasks: Sequence[str], settings: EvalSettings) -> dict[str, Any]:
    """Mean score (percent) of ``tasks``' samples per needle depth × length."""
    depths = depth_grid(settings.depths)
    grid = [
        [
            mean_percent(
                r.score
                for r in results
                if r.sample.task in tasks
                and r.sample.length == length
                and r.sample.depth is not None
                and math.isclose(r.sample.depth, depth)
            )
            for length in settings.lengths
        ]
        for depth in depths
    ]
    return {"tasks": list(tasks), "depths": depths, "lengths": list(settings.lengths), "scores": grid}


@torch.no_grad()
def perplexity_curve(
    model: nn.Module, input_ids: torch.Tensor, chunk_size: int, bins: int = 32, progress: bool = True
) -> dict[str, list[float]]:
    """Perplexity of a long document by position: mean next-token NLL over ``bins`` equal windows.

    The document is read by chunked prefill, so memory stays that of one chunk whatever its length.
    """
    ids = input_ids.reshape(1, -1)
    nll = torch.empty(ids.shape[1] - 1, dtype=torch.float64)
    bar = tqdm(total=ids.shape[1], desc="perplexity", disable=not progress, leave=False, unit="tok")

    def on_chunk(start: int, logits: torch.Tensor) -> None:
        targets = ids[0, start + 1 : start + 1 + logits.shape[1]].to(logits.device)
        losses = nn.functional.cross_entropy(logits[0, : targets.shape[0]].float(), targets, reduction="none")
        nll[start : start + targets.shape[0]] = losses.double().cpu()
        bar.update(logits.shape[1])

    device = next(model.parameters()).device
    chunked_prefill(model, ids.to(device), chunk_size=chunk_size, on_chunk=on_chunk)
    bar.close()
    window = math.ceil(nll.shape[0] / bins)
    ends, ppl = [], []
    for start in range(0, nll.shape[0], window):
        piece = nll[start : start + window]
        ends.append(start + piece.shape[0] + 1)
        ppl.append(float(piece.mean().exp()))
    return {"position": ends, "perplexity": ppl, "overall": float(nll.mean().exp())}
