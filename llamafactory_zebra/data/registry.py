"""The 1M-context SFT recipe's datasets, as LLaMA-Factory ``dataset_info.json`` entries.

LLaMA-Factory resolves every name in ``dataset:`` through ``dataset_dir/dataset_info.json``; the
entries below are merged under the user's own file (see ``integration/datasets.py``), so these
names work from any ``dataset_dir`` and appear in the web UI. Each hub entry has a ``*_sample``
twin that reads a few hand-written rows in the same public schema from ``data/samples/``; the twins
run the same converters offline (tests, ``data inspect`` demos, trying a YAML before a download).

A user entry may start from a registry entry with ``"zebra_base": "<name>"`` and override fields,
e.g. ``{"zebra_base": "openmathinstruct2_1m", "num_samples": 200000}`` to cap one dataset.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

# The recipe's public datasets hold rows its converters refuse by design (unfinished reasoning traces,
# empty answers); their entries opt into skipping them, counted in the log (data/row_policy.py).
SKIP_KEY = "skip_invalid_rows"
SAMPLES_DIR = Path(__file__).resolve().parent / "samples"
BASE_KEY = "zebra_base"
SAMPLE_SUFFIX = "_sample"

# Column and tag mappings shared by entries of the same public schema.
_ROLE_CONTENT_MESSAGES = {
    "formatting": "sharegpt",
    "columns": {"messages": "messages"},
    "tags": {
        "role_tag": "role",
        "content_tag": "content",
        "user_tag": "user",
        "assistant_tag": "assistant",
        "system_tag": "system",
    },
}
_OPENMATH = {"formatting": "alpaca", "columns": {"prompt": "problem", "response": "generated_solution"}}
_OPENTHOUGHTS = {
    "formatting": "zebra_openthoughts",
    "columns": {"messages": "conversations", "system": "system"},
    "tags": {"role_tag": "from", "content_tag": "value", "user_tag": "user", "assistant_tag": "assistant"},
}
_OPENR1 = {**_ROLE_CONTENT_MESSAGES, "formatting": "zebra_reasoning_messages"}
_CHATQA2 = {"formatting": "zebra_chatqa2", "columns": {"prompt": "question", "response": "answer"}}

# name -> (hub id, subset, split, schema, sample file or None)
_RECIPE: dict[str, tuple[str, str | None, str, dict[str, Any], str | None]] = {
    "sftdatasetv3": ("JunxiongWang/sftdatasetv3", None, "train", _ROLE_CONTENT_MESSAGES, "sftdatasetv3.jsonl"),
    "openmathinstruct2": ("nvidia/OpenMathInstruct-2", None, "train", _OPENMATH, "openmathinstruct2.jsonl"),
    "openmathinstruct2_1m": ("nvidia/OpenMathInstruct-2", None, "train_1M", _OPENMATH, None),
    "openmathinstruct2_2m": ("nvidia/OpenMathInstruct-2", None, "train_2M", _OPENMATH, None),
    "openmathinstruct2_5m": ("nvidia/OpenMathInstruct-2", None, "train_5M", _OPENMATH, None),
    "openthoughts114k_math": (
        "open-r1/OpenThoughts-114k-math",
        None,
        "train",
        _OPENTHOUGHTS,
        "openthoughts114k_math.jsonl",
    ),
    "openthoughts114k": (
        "open-thoughts/OpenThoughts-114k",
        "default",
        "train",
        _OPENTHOUGHTS,
        "openthoughts114k.jsonl",
    ),
    "openr1_math_220k": ("open-r1/OpenR1-Math-220k", "default", "train", _OPENR1, "openr1_math_220k.jsonl"),
    "openr1_math_220k_extended": ("open-r1/OpenR1-Math-220k", "extended", "train", _OPENR1, None),
    "openr1_math_220k_all": ("open-r1/OpenR1-Math-220k", "all", "train", _OPENR1, None),
    "chatqa2_long_sft": ("nvidia/ChatQA2-Long-SFT-data", "long_sft", "train", _CHATQA2, "chatqa2_long_sft.jsonl"),
    "chatqa2_narrativeqa_131k": (
        "nvidia/ChatQA2-Long-SFT-data",
        "NarrativeQA_131072",
        "train",
        _CHATQA2,
        "chatqa2_narrativeqa_131k.jsonl",
    ),
}


def _hub_entry(hub_id: str, subset: str | None, split: str, schema: dict[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"hf_hub_url": hub_id, "split": split, SKIP_KEY: True}
    if subset is not None:
        entry["subset"] = subset
    entry.update(copy.deepcopy(schema))
    return entry


def _sample_entry(file_name: str, schema: dict[str, Any]) -> dict[str, Any]:
    # An absolute file_name: LLaMA-Factory joins it onto dataset_dir, which keeps absolute paths as they are.
    return {"file_name": str(SAMPLES_DIR / file_name), SKIP_KEY: True, **copy.deepcopy(schema)}


def registry_dataset_info() -> dict[str, dict[str, Any]]:
    """All registry entries (hub datasets, then their offline ``*_sample`` twins), as fresh copies."""
    info = {name: _hub_entry(hub, subset, split, schema) for name, (hub, subset, split, schema, _) in _RECIPE.items()}
    for name, (_, _, _, schema, sample) in _RECIPE.items():
        if sample is not None:
            info[name + SAMPLE_SUFFIX] = _sample_entry(sample, schema)
    return info


def resolve_bases(user_info: dict[str, Any], source: str) -> dict[str, Any]:
    """Expands ``zebra_base`` references in user entries; ``source`` names the file in errors."""
    registry = registry_dataset_info()
    resolved: dict[str, Any] = {}
    for name, entry in user_info.items():
        if not isinstance(entry, dict) or BASE_KEY not in entry:
            resolved[name] = entry
            continue
        base = entry[BASE_KEY]
        if base not in registry:
            raise ValueError(
                f"{source}: dataset '{name}' has {BASE_KEY}={base!r}, which is not a registry dataset. "
                f"Known: {', '.join(sorted(registry))}."
            )
        merged = copy.deepcopy(registry[base])
        merged.update({key: value for key, value in entry.items() if key != BASE_KEY})
        resolved[name] = merged
    return resolved


def merge_dataset_info(user_info: dict[str, Any], source: str) -> dict[str, Any]:
    """User entries first (they win on a name clash), then the registry names the user did not define."""
    merged = resolve_bases(user_info, source)
    for name, entry in registry_dataset_info().items():
        merged.setdefault(name, entry)
    return merged
