"""Rows longer than ``cutoff_len``: LLaMA-Factory cuts them without a word; say so before training starts.

Why: LLaMA-Factory's supervised processors truncate every row to ``cutoff_len`` (``infer_seqlen``) and drop
the turns past it, and the only trace is a count in ``llamafactory-zebra data inspect``. A long-context run
whose needles or answers are cut off learns nothing, so the dataset seam (``integration/datasets.py``) warns
before tokenisation with the count and the fix. Lengths are counted as the processor counts them: the
run's template (``Template.encode_multiturn``) on the converted rows, at most :data:`CHECKED_ROWS` of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datasets import Dataset
    from llamafactory.data.template import Template
    from llamafactory.hparams import DataArguments
    from transformers import PreTrainedTokenizer

# Rows encoded for the check: every row of a quickstart-sized dataset, a bounded cost on the recipe's.
CHECKED_ROWS = 5000


def row_tokens(
    template: Template,
    tokenizer: PreTrainedTokenizer,
    messages: list[dict[str, str]],
    system: str | None = None,
    tools: str | None = None,
) -> int:
    """Tokens LLaMA-Factory's supervised processor makes of one conversation before truncation.

    The one count of a row's length (the cutoff check and the retrieval SFT generator both size rows with
    it): the template's ``encode_multiturn`` pairs, plus the EOS token the processor appends after the last
    turn when the template has ``efficient_eos`` (``SupervisedDatasetProcessor._encode_data_example`` counts
    it before it truncates).
    """
    pairs = template.encode_multiturn(tokenizer, messages, system, tools)
    return sum(len(source) + len(target) for source, target in pairs) + int(bool(template.efficient_eos))


def over_cutoff_message(
    dataset: Dataset, data_args: DataArguments, template: Template, tokenizer: PreTrainedTokenizer
) -> str | None:
    """The warning for rows longer than what a training row holds, or ``None`` when every checked row fits.

    ``data_args.cutoff_len`` is what the processor truncates at: with ``packing`` LLaMA-Factory has already
    taken one token off the YAML's value (``DataArguments.__post_init__``).
    """
    limit = data_args.cutoff_len
    checked = min(len(dataset), CHECKED_ROWS)
    rows = (dataset[index] for index in range(checked))
    # Rows the processor itself drops (no single response, e.g. a prediction set) are not its to truncate.
    lengths = {
        index: row_tokens(template, tokenizer, row["_prompt"] + row["_response"], row["_system"], row["_tools"])
        for index, row in enumerate(rows)
        if len(row["_prompt"]) % 2 == 1 and len(row["_response"]) == 1
    }
    over = [index for index, length in lengths.items() if length > limit]
    if not over:
        return None
    longest = max(lengths.values())
    packing = bool(data_args.packing)
    yaml_value = limit + int(packing)
    needed = longest + int(packing)
    held = f"{limit} tokens (cutoff_len {yaml_value}{', less the one token packing keeps' if packing else ''})"
    scope = f"{checked} rows" + (f" checked of {len(dataset)}" if checked < len(dataset) else "")
    return (
        f"{len(over)} of {scope} are longer than a training row holds, {held}; LLaMA-Factory truncates them "
        f"silently (rows {', '.join(map(str, over[:5]))}{', ...' if len(over) > 5 else ''}, up to "
        f"{longest} tokens): what is cut off (a needle, an answer) is never trained. Set cutoff_len: {needed} "
        f"or shorten those rows; `llamafactory-zebra data inspect` reports them per dataset."
    )
