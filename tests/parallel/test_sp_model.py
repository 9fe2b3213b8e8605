"""The tiny ZebraForCausalLM with sequence parallelism equals the one-process run (fp32, gloo).

Loss (token-weighted over the SP group) and every parameter's gradient, for SP = world (2 and 4) and
SP 2 x DP 2, with the plain and the fused (chunked) cross-entropy, and with gradient checkpointing at
SP 2; packed rows with borders inside
shards, on shard borders, across shards, and padding (see ``sp_workers/model.py``).
"""

import pytest
from sp_workers.harness import launch, worst
from sp_workers.model import model_worker

FP32_TOLERANCE = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_model_loss_and_gradients_match_one_process(world):
    errors = worst(launch(model_worker, world))
    scales = {key: errors.pop(key) for key in list(errors) if key.endswith("_grad_scale")}
    assert min(scales.values()) > 1e-2, f"gradients too small for the comparison to mean anything: {scales}"
    assert len(errors) == (6 if world == 2 else 8)
    assert errors == {key: pytest.approx(0.0, abs=FP32_TOLERANCE) for key in errors}, errors
