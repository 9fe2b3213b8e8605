"""The attention policy: which attention implementations exist for Zebra's MLA and who accepts which.

One table, asked by everything else: the model (how packed rows reach the kernel), sequence parallelism, the
distillation teacher, the memory planner, the training guards, the planner's YAML reader and ``llamafactory-zebra
doctor``. A rule module like ``packing.py``: it imports nothing of the package, so every folder may ask it.
Which packed-row kernel a call runs is the kernel registry's ``attention`` op (``kernels/registry.py``'s entries,
``kernels.packed_attention``).

Names are transformers' ``attn_implementation`` values. How packed rows (several samples in one row,
``packing.py``) run on each:

- ``flash_attention_2`` / ``flash_attention_3``: FlashAttention's varlen kernel with the samples' borders
  (``packing.flash_varlen_kwargs``), no mask;
- ``sdpa``: PyTorch's own kernels with the same borders and no mask (``ops/packed_attention.py``):
  compiled ``flex_attention`` with a block mask built from the borders on CUDA/ROCm GPUs, one causal
  ``scaled_dot_product_attention`` call per sample elsewhere (``ZEBRA_PACKED_SDPA`` forces one, or the
  dense mask: ``kernels/switches.py``). Memory grows linearly with the row;
- ``eager``: the dense ``[B, 1, T, T]`` block-causal mask (``packing.block_causal_mask``). eager is the
  plain reference the other paths are tested against, and it builds ``T x T`` scores anyway.

Any other ``attn_implementation`` someone registered with transformers also gets the dense mask.
"""

from __future__ import annotations

EAGER = "eager"
SDPA = "sdpa"
FLASH_ATTENTION_2 = "flash_attention_2"
FLASH_ATTENTION_3 = "flash_attention_3"

ATTENTION_IMPLEMENTATIONS = (EAGER, SDPA, FLASH_ATTENTION_2, FLASH_ATTENTION_3)
FLASH_ATTENTION_BACKENDS = (FLASH_ATTENTION_2, FLASH_ATTENTION_3)

# What the memory planner models (``planning/activations.py``): kernels that save q, k, v, output and
# log-sum-exp for backward. eager keeps a T x T score matrix per head.
PLANNER_ATTENTION = (FLASH_ATTENTION_2, SDPA)
# What the Ulysses wrapper (``parallel/attention.py``) keeps exact on whole rows.
SEQUENCE_PARALLEL_ATTENTION = (EAGER, SDPA, FLASH_ATTENTION_2, FLASH_ATTENTION_3)
# ... and what ``sequence_parallel_size`` training accepts: eager's whole-row T x T weights per head are
# what a long run cannot afford.
SEQUENCE_PARALLEL_TRAINING_ATTENTION = (SDPA, FLASH_ATTENTION_2, FLASH_ATTENTION_3)
# What the distillation teacher (any transformers model) runs with packed rows kept apart
# (``distill/teacher.py``: varlen borders for FlashAttention, a 4-D additive mask otherwise).
DISTILL_TEACHER_ATTENTION = (EAGER, SDPA, FLASH_ATTENTION_2, FLASH_ATTENTION_3)

# As LLaMA-Factory's ``flash_attn``, with the ``attn_implementation`` it gives a Zebra model: ``auto``
# keeps transformers' default (sdpa), and ``fa2`` falls back to sdpa when flash-attn is not installed.
LLAMAFACTORY_FA2 = "fa2"
LLAMAFACTORY_FLASH_ATTN = {"auto": SDPA, "disabled": EAGER, "sdpa": SDPA, LLAMAFACTORY_FA2: FLASH_ATTENTION_2}
# LLaMA-Factory values Zebra cannot run with, and why.
REFUSED_FLASH_ATTN = {
    "fa3": 'LLaMA-Factory 0.9.5 raises "Unknown attention type" for it when it loads the model, after the dataset '
    "is tokenised; use flash_attn: fa2 on GPUs (FlashAttention-2's varlen path keeps packed samples apart) or sdpa",
}


def flash_attn_value(flash_attn: object) -> str:
    """LLaMA-Factory's ``flash_attn`` as its string value: the parsed arguments hold its ``AttentionFunction``
    enum, a YAML read by the plugin's tools a string.

    >>> from enum import Enum
    >>> flash_attn_value(Enum("AttentionFunction", {"FA2": "fa2"}).FA2), flash_attn_value("sdpa")
    ('fa2', 'sdpa')
    """
    return str(getattr(flash_attn, "value", flash_attn))


def attn_implementation_for(flash_attn: object) -> str:
    """The ``attn_implementation`` a Zebra model gets from LLaMA-Factory's ``flash_attn`` (a string or its enum).

    >>> attn_implementation_for("fa2"), attn_implementation_for("auto")
    ('flash_attention_2', 'sdpa')
    >>> attn_implementation_for("fa3")
    Traceback (most recent call last):
    ...
    ValueError: flash_attn: fa3 is not supported for Zebra: LLaMA-Factory 0.9.5 raises "Unknown attention type" ...
    """
    value = flash_attn_value(flash_attn)
    if value in REFUSED_FLASH_ATTN:
        raise ValueError(f"flash_attn: {value} is not supported for Zebra: {REFUSED_FLASH_ATTN[value]}")
    if value not in LLAMAFACTORY_FLASH_ATTN:
        raise ValueError(f"flash_attn: {value!r} is not one of {', '.join(LLAMAFACTORY_FLASH_ATTN)}")
    return LLAMAFACTORY_FLASH_ATTN[value]


def sequence_parallel_accepts_flash_attn(flash_attn: object) -> bool:
    """Whether ``sequence_parallel_size`` training takes LLaMA-Factory's ``flash_attn`` value. A refused
    value (``fa3``) passes here: the guards refuse it with its own reason.

    >>> [sequence_parallel_accepts_flash_attn(v) for v in ("auto", "sdpa", "fa2", "fa3", "disabled")]
    [True, True, True, True, False]
    """
    value = flash_attn_value(flash_attn)
    return value in REFUSED_FLASH_ATTN or LLAMAFACTORY_FLASH_ATTN.get(value) in SEQUENCE_PARALLEL_TRAINING_ATTENTION


def distill_teacher_attention(student_attention: str | None) -> str:
    """The ``attn_implementation`` the teacher loads with: the student's when the teacher can keep packed
    samples apart with it, else sdpa.

    >>> distill_teacher_attention("flash_attention_2"), distill_teacher_attention(None)
    ('flash_attention_2', 'sdpa')
    >>> distill_teacher_attention("flex_attention")
    'sdpa'
    """
    return student_attention if student_attention in DISTILL_TEACHER_ATTENTION else SDPA
