"""The training pipeline (``integration/training.py``): one list of steps over one run object, every override of
an upstream argument a named step that says why."""

import types

from training_runs import training_run

from llamafactory_zebra.integration.guards import keep_packing_masks_2d
from llamafactory_zebra.integration.steps import run_steps
from llamafactory_zebra.integration.training import TRAINING_STEPS


def _run(config, **model):
    model_args = types.SimpleNamespace(block_diag_attn=True, **model)
    return training_run(model_args, config=config)


def test_every_step_says_why_and_the_overrides_are_named():
    assert all(step.name and step.why for step in TRAINING_STEPS)
    assert len({step.name for step in TRAINING_STEPS}) == len(TRAINING_STEPS)
    overrides = {step.overrides for step in TRAINING_STEPS if step.overrides}
    assert {"model_args.block_diag_attn", "training_args.resume_from_checkpoint"} <= overrides
    names = [step.name for step in TRAINING_STEPS]
    # The kernels stop a run before the guard rails; the masks are 2-D before the guards read the arguments.
    assert names.index("kernels") < names.index("2-D packing masks") < names.index("guard rails")


def test_the_mask_override_applies_to_zebra_checkpoints_only():
    zebra, other = _run(types.SimpleNamespace(model_type="zebra")), _run(None)
    run_steps(tuple(step for step in TRAINING_STEPS if step.apply is keep_packing_masks_2d), zebra)
    keep_packing_masks_2d(other)
    assert zebra.model.block_diag_attn is False and other.model.block_diag_attn is True
