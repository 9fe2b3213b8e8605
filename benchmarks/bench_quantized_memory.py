"""Memory of a bitsandbytes 4-bit (NF4) and 8-bit Zebra against the same checkpoint loaded in bf16.

The model is the released 7MLA21GDN shape (hidden 2048, vocab 151936, untied lm_head, MLA and GDN heads
as released) cut to ``--layers`` decoder layers with the released plan's first layers (layer 1 of each
four is MLA); 8 layers (1.1 B parameters, 2.2 GB in bf16) fit the 4 GB a process may use on the CI
machine. The released 28 layers are seven repeats of the same 4-layer block, so the footprint at 28
layers follows exactly from two measured depths that differ by whole blocks (printed as extrapolated).
Random bf16 weights are saved once per depth; each variant then loads that checkpoint in a fresh
interpreter (``subprocess_points``) through ``AutoModelForCausalLM.from_pretrained``.

Columns: transformers' ``get_memory_footprint()`` (parameters + buffers), the process's peak RSS rise
over load + one forward of 64 tokens (CPU, where bitsandbytes' 4-bit kernel repacks weights on first
use), and the modules left as plain ``nn.Linear`` (``_keep_in_fp32_modules`` + transformers' lm_head).

    python benchmarks/bench_quantized_memory.py --layers 4 8
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

PRESET = "qwen3-1.7b-7mla21gdn-1m"
VARIANTS = ("bf16", "8bit", "4bit-nf4")


def write_checkpoint(path: Path, layers: int) -> int:
    import torch

    from llamafactory_zebra import ZebraConfig, ZebraForCausalLM

    base = ZebraConfig.from_preset(PRESET)
    config = ZebraConfig.from_preset(PRESET, num_hidden_layers=layers, layer_types=base.layer_types[:layers])
    torch.manual_seed(0)
    with torch.device("meta"):
        model = ZebraForCausalLM(config)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.02)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def _status_gb(field: str) -> float:
    """A ``/proc/self/status`` memory line in GB. ``VmHWM`` (peak RSS) starts afresh at exec, unlike
    ``ru_maxrss``, which a child inherits from the parent that wrote the checkpoint."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024 / 1e9


def measure(path: str, variant: str) -> dict:
    """One variant in this (fresh) interpreter: load, footprint, peak RSS, one forward."""
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    import llamafactory_zebra  # noqa: F401  (the start-up hook would too, where this package is installed)

    torch.set_num_threads(1)
    kwargs = {"dtype": torch.bfloat16}
    if variant == "8bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    elif variant == "4bit-nf4":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
        )
    before = _status_gb("VmRSS")
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs).eval()
    load_s = time.perf_counter() - start
    kept = sorted(
        ".".join(name.split(".")[-2:]) if ".layers." in name else name
        for name, module in model.named_modules()
        if type(module) is torch.nn.Linear
    )
    tokens = torch.randint(0, model.config.vocab_size, (1, 64))
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(tokens, use_cache=False).logits
    forward_s = time.perf_counter() - start
    return {
        "variant": variant,
        "footprint_gb": model.get_memory_footprint() / 1e9,
        "peak_rss_gb": _status_gb("VmHWM") - before,
        "load_s": load_s,
        "forward_s": forward_s,
        "finite": bool(torch.isfinite(logits).all()),
        "kept": sorted(set(kept)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[4, 8], help="multiples of 4")
    parser.add_argument("--point", nargs=2, metavar=("CHECKPOINT", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        print(json.dumps(measure(*args.point)))
        return

    from subprocess_points import run_point

    footprints = {}
    print(
        "| layers | parameters | variant | footprint GB | vs bf16 | peak RSS rise GB | load s | forward (64 tokens) s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for layers in args.layers:
        with tempfile.TemporaryDirectory() as tmp:
            parameters = write_checkpoint(Path(tmp), layers)
            rows = [run_point(__file__, ["--point", tmp, variant]) for variant in VARIANTS]
        for row in rows:
            assert row["finite"], row
            footprints[layers, row["variant"]] = row["footprint_gb"]
            print(
                f"| {layers} | {parameters / 1e9:.2f} B | {row['variant']} | {row['footprint_gb']:.3f} "
                f"| {row['footprint_gb'] / rows[0]['footprint_gb']:.2f}x | {row['peak_rss_gb']:.2f} "
                f"| {row['load_s']:.1f} | {row['forward_s']:.2f} |"
            )
    print(f"kept unquantised (plain nn.Linear) in the 4-bit load: {', '.join(rows[-1]['kept'])}")
    low, high = min(args.layers), max(args.layers)
    if high > low:
        extrapolated = {
            v: footprints[low, v] + (28 - low) / (high - low) * (footprints[high, v] - footprints[low, v])
            for v in VARIANTS
        }
        print("| 28 (extrapolated) | | variant | footprint GB | vs bf16 |")
        for variant, value in extrapolated.items():
            print(f"| 28 | | {variant} | {value:.3f} | {value / extrapolated['bf16']:.2f}x |")


if __name__ == "__main__":
    main()
