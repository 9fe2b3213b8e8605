"""Which MLA convention fits a checkpoint's weights: perplexity on plain English under each candidate.

The RoPE pairing and the placement of the MLA norms are not written in AMD's released files (see
``docs/architecture.md``); a wrong guess loads without any error and gives a worse model. The right
convention makes ordinary prose far more predictable than a wrong one, so ``verify`` scores the shipped
text (``verify_text.py``) under each plausible convention on the same loaded weights — switching only
what ``ZebraMLA`` reads at run time — and reports which one wins, or that none wins clearly (an
untrained model predicts no English, so every convention scores the same).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError

from ..attention_policy import SDPA
from ..configuration_zebra import MLA_NORM_NONE, ZebraConfig
from ..kernels import this_machine
from ..kernels.run_dtype import run_dtype
from ..layers.mla import ZebraMLA
from .keys import checkpoint_keys
from .layout import RELEASED_HYBRID_CONFIG, RELEASED_LAYOUT, checkpoint_layout, load_checkpoint_config
from .verify_text import VERIFY_TEXT


@dataclass(frozen=True)
class Convention:
    rope_interleave: bool
    mla_norm: str

    @property
    def rope_label(self) -> str:
        return "interleaved (2j, 2j+1)" if self.rope_interleave else "half-split (j, j+d/2)"

    @property
    def norm_label(self) -> str:
        return self.mla_norm if self.mla_norm != MLA_NORM_NONE else "none (norm weights unused)"


@dataclass(frozen=True)
class Score:
    convention: Convention
    perplexity: float


def configured_convention(config: ZebraConfig) -> Convention:
    return Convention(config.rope_interleave, config.mla_norm)


def candidate_conventions(config: ZebraConfig) -> list[Convention]:
    """Both RoPE pairings × the placements the checkpoint's keys allow: the one the keys name, or none.

    Each ``mla_norm`` value names its own weight keys, so the keys pin the norm *kind*; what remains
    uncertain is whether those norms act at all as placed (``none`` runs the same weights without them).
    """
    norms = [config.mla_norm] + ([MLA_NORM_NONE] if config.mla_norm != MLA_NORM_NONE else [])
    rope = [config.rope_interleave, not config.rope_interleave]
    return [Convention(interleave, norm) for interleave in rope for norm in norms]


def use_convention(model: torch.nn.Module, convention: Convention) -> None:
    """Switch every MLA layer of a loaded model to ``convention`` (weights untouched)."""
    for module in model.modules():
        if isinstance(module, ZebraMLA):
            module.rope_interleave = convention.rope_interleave
            module.mla_norm = convention.mla_norm


@torch.inference_mode()
def perplexity(model: torch.nn.Module, input_ids: torch.Tensor) -> float:
    loss = model(input_ids=input_ids, labels=input_ids, use_cache=False).loss
    return math.exp(loss.float().item())


def score_conventions(model: torch.nn.Module, input_ids: torch.Tensor) -> list[Score]:
    """Perplexity under each candidate, best first; the model is left in its configured convention."""
    config = model.config
    scores = []
    for convention in candidate_conventions(config):
        use_convention(model, convention)
        scores.append(Score(convention, perplexity(model, input_ids)))
    use_convention(model, configured_convention(config))
    return sorted(scores, key=lambda s: s.perplexity)


def verification_tokens(tokenizer, max_tokens: int) -> torch.Tensor:
    ids = tokenizer(VERIFY_TEXT, add_special_tokens=False)["input_ids"][:max_tokens]
    if len(ids) < 16:
        raise ValueError(f"the verification text gives only {len(ids)} tokens with this tokenizer")
    return torch.tensor([ids])


# The next convention must score at least this much worse than the best for a verdict: between the spread
# of untrained models (all four at chance) and the lead of a trained one. The measured spreads it sits
# between: docs/architecture.md, "MLA conventions".
DECISIVE_MARGIN = 1.05

OK, MISMATCH, NOT_LOADABLE, INCONCLUSIVE = 0, 1, 2, 3


def render(scores: list[Score], configured: Convention, model_dir: str, vocab_size: int) -> tuple[str, int]:
    """The table and the verdict, with its exit status: ``OK`` when the configured convention has the
    lowest perplexity by ``DECISIVE_MARGIN``, ``MISMATCH`` when another one does, ``INCONCLUSIVE`` when
    the best two are closer than that."""
    lines = [f"{'RoPE pairs':<24}{'MLA norms':<28}{'perplexity':>12}{'× best':>9}"]
    best = scores[0].perplexity
    for score in scores:
        mark = "  <- config" if score.convention == configured else ""
        lines.append(
            f"{score.convention.rope_label:<24}{score.convention.norm_label:<28}"
            f"{score.perplexity:>12.2f}{score.perplexity / best:>9.2f}{mark}"
        )
    margin = scores[1].perplexity / best if len(scores) > 1 else float("inf")
    if margin < DECISIVE_MARGIN:
        lines.append(
            f"INCONCLUSIVE: the best two conventions are within {margin:.3f}× of each other (a verdict needs "
            f"{DECISIVE_MARGIN:.2f}×); the best perplexity is {best:.1f} against {vocab_size} for guessing "
            "uniformly over the vocabulary — an untrained or damaged model cannot tell the conventions apart."
        )
        return "\n".join(lines), INCONCLUSIVE
    winner = scores[0].convention
    if winner == configured:
        lines.append(f"OK: the configured convention fits best; the next one is {margin:.2f}× worse.")
        return "\n".join(lines), OK
    lines.append("MISMATCH: another convention fits these weights better than the configured one.")
    lines.extend(_fix_hints(winner, configured, model_dir))
    return "\n".join(lines), MISMATCH


class CheckpointNotLoadable(Exception):
    """The directory, its weights or its tokenizer cannot be read; the message names which and why."""


def load_checkpoint(model_dir: str, dtype: torch.dtype) -> tuple[torch.nn.Module, Any]:
    """The model (sdpa, eval mode) and tokenizer of ``model_dir``, or ``CheckpointNotLoadable``.

    Every weight file's header is read first, so a truncated or corrupt shard is named before
    transformers would fail inside its loader without the file name.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not os.path.exists(model_dir):
        raise CheckpointNotLoadable(f"{model_dir}: no such directory")
    if checkpoint_layout(model_dir) is None:
        raise CheckpointNotLoadable(
            f"{model_dir}: not a Zebra checkpoint (expected a config.json with model_type "
            f"{ZebraConfig.model_type!r}, or AMD's released layout with a {RELEASED_HYBRID_CONFIG})"
        )
    try:
        checkpoint_keys(model_dir)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # Through transformers' Auto classes (the package registered Zebra with them on import), with the
        # config read by this package (a released directory's config.json describes Qwen3): this package
        # sits below the model, which reads released directories through it.
        config = load_checkpoint_config(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=dtype, attn_implementation=SDPA)
    except (OSError, ValueError, StrictDataclassError) as error:
        raise CheckpointNotLoadable(str(error)) from error
    return model.eval(), tokenizer


def verify_checkpoint(model_dir: str, dtype_name: str = "auto", max_tokens: int = 512) -> tuple[str, int]:
    """The report ``llamafactory-zebra verify`` prints and its exit status (``OK``, ``MISMATCH``, ``INCONCLUSIVE``)."""
    dtype = getattr(torch, run_dtype(dtype_name, this_machine()))  # the machine the model runs on, never a fake
    started = time.monotonic()
    model, tokenizer = load_checkpoint(model_dir, dtype)
    try:
        input_ids = verification_tokens(tokenizer, max_tokens)
    except ValueError as error:
        raise CheckpointNotLoadable(f"{model_dir}: {error}") from error
    if this_machine().has_gpu:
        model, input_ids = model.cuda(), input_ids.cuda()
    scores = score_conventions(model, input_ids)
    table, status = render(scores, configured_convention(model.config), model_dir, model.config.vocab_size)
    header = f"{model_dir}: {input_ids.shape[1]} tokens, {dtype}, {time.monotonic() - started:.0f} s"
    return f"{header}\n{table}", status


def _fix_hints(winner: Convention, configured: Convention, model_dir: str) -> list[str]:
    hints = []
    if winner.rope_interleave != configured.rope_interleave:
        hints.append(f"  set rope_interleave: {str(winner.rope_interleave).lower()}")
    if winner.mla_norm != configured.mla_norm:
        hints.append(
            f"  the checkpoint's {configured.mla_norm} norm weights do not act where mla_norm "
            f"'{configured.mla_norm}' places them; see 'MLA norms' in docs/architecture.md for the one-line change"
        )
    if checkpoint_layout(model_dir) == RELEASED_LAYOUT:
        hints.append(
            "  (released layout: run `llamafactory-zebra import` and edit the native config.json, "
            "and please report it — the plugin reads AMD's layout with these defaults)"
        )
    else:
        hints.append(f"  in {os.path.join(model_dir, 'config.json')}")
    return hints
