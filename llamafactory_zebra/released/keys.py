"""The weight keys of a checkpoint directory, read from the safetensors headers (no tensor is loaded).

AMD's files do not say which RMSNorms the MLA layers carry; the key names do (``detect_mla_norm``).
transformers only warns about missing or unexpected weights; a Zebra checkpoint whose keys do not
match the architecture is always a mistake (wrong layer plan, wrong model), so ``verify_keys`` rejects
it with the offending names, and ``check_loaded_weights`` does the same for what ``from_pretrained`` loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from safetensors import SafetensorError, safe_open
from torch.nn import Module

from ..configuration_zebra import MLA_NORM_LORA, MLA_NORM_QK_HEAD, MLA_NORMS, ZebraConfig

# What to do about a missing weight that has one usual cause (``check_loaded_weights``).
MISSING_KEY_FIXES = {
    "lm_head.weight": "A Zebra's lm_head is untied (tie_word_embeddings: false) and is not initialised at random: "
    "save the checkpoint with its lm_head.weight — for a source whose embeddings were tied, a copy of "
    "model.embed_tokens.weight, as `llamafactory-zebra convert` writes it",
}


def safetensors_files(path: str | Path) -> list[Path]:
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no *.safetensors weight files")
    return files


def checkpoint_keys(path: str | Path) -> set[str]:
    keys: set[str] = set()
    for file in safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as handle:
                keys.update(handle.keys())
        except SafetensorError as error:
            raise ValueError(f"{file}: not a readable safetensors file ({error})") from None
    return keys


def mla_norm_keys(config: ZebraConfig, mla_norm: str) -> set[str]:
    """The norm weights of one MLA layer (names below ``model.layers.{i}.mla.``) for a placement."""
    if mla_norm == MLA_NORM_QK_HEAD:
        return {"q_norm.weight", "k_norm.weight"}
    if mla_norm == MLA_NORM_LORA:
        return {"kv_a_layernorm.weight"} | ({"q_a_layernorm.weight"} if config.q_lora_rank is not None else set())
    return set()


def detect_mla_norm(path: str | Path, config: ZebraConfig) -> str | None:
    """Which ``mla_norm`` the weights in ``path`` were saved with (``None`` when there are no weights).

    Every MLA layer must carry the same projections as ``config`` plus exactly one placement's norms;
    anything else is an error listing the expected and the found MLA keys.
    """
    if not list(Path(path).glob("*.safetensors")) or not config.mla_layers:
        return None
    keys = checkpoint_keys(path)
    expected = {norm: mla_weight_names(config, norm) for norm in MLA_NORMS}
    placements = set()
    for index in config.mla_layers:
        prefix = f"model.layers.{index}.mla."
        found = {key[len(prefix) :] for key in keys if key.startswith(prefix)}
        matches = [norm for norm, names in expected.items() if names == found]
        if not matches:
            options = "; ".join(f"mla_norm {norm!r}: {', '.join(sorted(names))}" for norm, names in expected.items())
            raise ValueError(
                f"{path}: the MLA keys of layer {index} fit no known layout.\n"
                f"  found: {', '.join(sorted(found)) or '(none)'}\n  expected one of — {options}"
            )
        placements.add(matches[0])
    if len(placements) > 1:
        raise ValueError(f"{path}: the MLA layers carry different norms ({', '.join(sorted(placements))})")
    return placements.pop()


def mla_weight_names(config: ZebraConfig, mla_norm: str) -> set[str]:
    """The weights of one MLA layer (names below ``model.layers.{i}.mla.``) for a norm placement.

    The one list of parameter names written outside the model, because it is needed below it: the model
    reads a released directory through this package, so this package cannot build the model to ask it.
    ``tests/model/test_inventory.py`` checks it against ``inventory.parameter_shapes`` for every placement.
    """
    projections = ["kv_a_proj_with_mqa", "out_proj"] + (["q_proj"] if config.q_lora_rank is None else ["q_a_proj"])
    names = {f"{name}.weight" for name in projections}
    if config.attention_bias:
        names |= {f"{name}.bias" for name in projections}
    names |= {"kv_b_proj.weight"} | ({"q_b_proj.weight"} if config.q_lora_rank is not None else set())
    return names | mla_norm_keys(config, mla_norm)


def verify_keys(found: set[str], expected: set[str], where: str) -> None:
    missing, unexpected = sorted(expected - found), sorted(found - expected)
    if missing or unexpected:
        lines = [f"{where}: the weights do not match the Zebra architecture described by its config"]
        if missing:
            lines.append(f"  missing ({len(missing)}): {', '.join(missing[:8])}{' …' if len(missing) > 8 else ''}")
        if unexpected:
            lines.append(
                f"  unexpected ({len(unexpected)}): {', '.join(unexpected[:8])}{' …' if len(unexpected) > 8 else ''}"
            )
        lines.append("  check that hybrid_config.json's mla_layers and dimensions belong to these weights")
        raise ValueError("\n".join(lines))


def check_loaded_weights(path: object, model: Module, info: Mapping[str, object]) -> None:
    """Refuse weights that do not match the layer plan, from transformers' loading ``info``: a missing key (which
    transformers would initialise at random) or an unexpected one under the model's own modules (a layer the plan
    lacks). A key outside them belongs to a wrapper that saved into the same file (trl's value head) and is left to
    transformers, which reports it. The message names the keys and, where there is one, the fix."""
    own_modules = {name.split(".", 1)[0] for name in model.state_dict()}
    problems = {
        "missing_keys": sorted(info.get("missing_keys") or ()),
        "unexpected_keys": sorted(
            key for key in info.get("unexpected_keys") or () if key.split(".", 1)[0] in own_modules
        ),
    }
    if any(problems.values()):
        details = "; ".join(
            f"{kind} ({len(keys)}): {', '.join(map(str, keys[:8]))}" for kind, keys in problems.items() if keys
        )
        fixes = "".join(f". {MISSING_KEY_FIXES[key]}" for key in problems["missing_keys"] if key in MISSING_KEY_FIXES)
        raise ValueError(f"{path}: weights do not match the Zebra config: {details}{fixes}")
