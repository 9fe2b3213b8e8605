"""``llamafactory-zebra import``: a native Zebra checkpoint (``model_type: zebra``) from a released one.

The weights are checked against the architecture the translated config describes (``inventory.parameter_names``)
before anything is written, then hard-linked (or copied) next to the native ``config.json``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..inventory import parameter_names
from .keys import checkpoint_keys, safetensors_files, verify_keys
from .layout import RELEASED_HYBRID_CONFIG, TOKENIZER_AND_GENERATION_FILES, load_released_config


def import_released_checkpoint(source: str | Path, output: str | Path, link: bool = True) -> Path:
    """Write a native Zebra checkpoint (``model_type: zebra`` config) next to the released weights."""
    source, output = Path(source), Path(output)
    if not (source / RELEASED_HYBRID_CONFIG).is_file():
        raise FileNotFoundError(f"{source}: no {RELEASED_HYBRID_CONFIG}; this is not a released Zebra directory")
    config = load_released_config(source)
    verify_keys(checkpoint_keys(source), parameter_names(config), str(source))
    output.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(output)
    weight_files = safetensors_files(source) + sorted(source.glob("*.safetensors.index.json"))
    for file in weight_files:
        _link_or_copy(file, output / file.name, link)
    for name in TOKENIZER_AND_GENERATION_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, output / name)
    with open(output / "zebra_import.json", "w", encoding="utf-8") as f:
        json.dump({"imported_from": str(source.resolve()), "layout": "released"}, f, indent=2)
    return output


def _link_or_copy(source: Path, target: Path, link: bool) -> None:
    if target.exists():
        target.unlink()
    if link:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copy2(source, target)
