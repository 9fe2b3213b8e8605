"""Sequence parallelism under DeepSpeed ZeRO-3 (CPU, gloo): loss and full gradients equal one process.

SP = world (2 processes) and SP 2 x DP 2 (4 processes), with DeepSpeed's ``parallel_state_sp`` as
``mpu`` and its ZeRO-3 gradient partitioning (``sp_workers/zero3.py``).
"""

import pytest
from sp_workers.harness import launch, worst
from sp_workers.zero3 import zero3_worker

FP32_TOLERANCE = 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_zero3_loss_and_gradients_match_one_process(world):
    errors = worst(launch(zero3_worker, world, 2))
    assert errors.pop("zero3_grad_scale") > 1e-2
    assert errors == {key: pytest.approx(0.0, abs=FP32_TOLERANCE) for key in errors}, errors
