"""GDN and MLA layers split over 2 and 4 gloo processes equal the one-process layers (fp64).

Forward outputs, input gradients and parameter gradients, for packed rows whose sample borders fall
inside shards, on shard borders, across several shards, with samples shorter than the conv halo and
shards shorter than the halo (see ``sp_workers/mixers.py`` for the layouts).
"""

import pytest
from sp_workers.harness import launch, worst
from sp_workers.mixers import mixers_worker

FP64_TOLERANCE = 1e-10


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_mixers_match_one_process(world):
    errors = worst(launch(mixers_worker, world))
    scale = errors.pop("gdn_out_scale")
    assert scale > 1e-3, "the GDN output is too small for the comparison to mean anything"
    assert errors == {key: pytest.approx(0.0, abs=FP64_TOLERANCE) for key in errors}, errors
