"""How close the planner's activation formulas come to measured memory of the tiny Zebra model on CPU.

Baseline: the measurement (``llamafactory_zebra.planning.measure``) of one bf16 training step of
``ZebraForCausalLM`` with ``ZebraConfig.from_preset("tiny")`` — saved-for-backward bytes and the peak
of CPU allocations during forward + backward. Predicted: ``activation_estimate`` for the kernels that
run on CPU (torch SDPA's flash kernel, this package's PyTorch delta rule, the chunked or unfused loss)
plus the parameter gradients backward allocates. The ratio column is predicted / measured.

    OMP_NUM_THREADS=1 python benchmarks/bench_plan_activations.py [--lengths 512 1024 2048 4096]
"""

from __future__ import annotations

import argparse

import torch

from llamafactory_zebra.configuration_zebra import ZebraConfig
from llamafactory_zebra.modeling_zebra import ZebraForCausalLM
from llamafactory_zebra.planning.activations import Kernels, activation_estimate
from llamafactory_zebra.planning.measure import measure_step

SETUPS = (
    ("unfused loss, no checkpointing", False, False),
    ("unfused loss, checkpointing", True, False),
    ("fused loss, no checkpointing", False, True),
    ("fused loss, checkpointing", True, True),
)


def tiny_model(gradient_checkpointing: bool, fused: bool) -> tuple[ZebraConfig, ZebraForCausalLM]:
    config = ZebraConfig.from_preset("tiny")
    config._attn_implementation = "sdpa"
    model = ZebraForCausalLM(config).to(torch.bfloat16).train()
    if fused:
        model.enable_fused_cross_entropy("chunked")
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model.enable_input_require_grads()
    return config, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)

    header = (
        f"{'setup':<32} {'tokens':>6} {'saved MB':>9} {'pred':>8} {'ratio':>6} {'peak MB':>8} {'pred':>8} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for label, checkpointing, fused in SETUPS:
        config, model = tiny_model(checkpointing, fused)
        kernels = Kernels(attention="sdpa", gdn="torch", loss="chunked" if fused else "logits")
        parameter_grads = sum(p.numel() * p.element_size() for p in model.parameters())
        for length in args.lengths:
            ids = torch.randint(0, config.vocab_size, (1, length))
            measured = measure_step(model, {"input_ids": ids, "labels": ids})
            estimate = activation_estimate(config, length, 2, kernels, checkpointing)
            saved = estimate.layers_saved + estimate.model_saved
            peak = estimate.peak + parameter_grads
            print(
                f"{label:<32} {length:>6} {measured.saved / 1e6:>9.2f} {saved / 1e6:>8.2f} {saved / measured.saved:>6.3f}"
                f" {measured.peak / 1e6:>8.2f} {peak / 1e6:>8.2f} {peak / measured.peak:>6.3f}"
            )


if __name__ == "__main__":
    main()
