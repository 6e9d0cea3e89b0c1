"""The default model (Gemma 3 270M) compiled for 2 chips, TP and PP, gives the 1-chip greedy tokens (fp32)
and runs through `calculet run`."""

from __future__ import annotations

import pytest

from calculet.calbin.manifest import read_manifest
from calculet.runtime.chips import chip_configs, open_device
from decoding import greedy_together

pytestmark = pytest.mark.slow

PROMPTS = [[2, 818, 5279, 563, 506], [2, 9259, 1902, 236787] * 4]
STEPS = 8


@pytest.mark.parametrize("partition", ["tp", "pp"])
def test_default_model_on_two_chips_equals_one(default_calbin_fp32, default_calbin_two_chips, partition):
    one = open_device(default_calbin_fp32)
    reference = greedy_together(one, PROMPTS, STEPS)
    one.close()
    out = default_calbin_two_chips(partition)
    assert read_manifest(out).partition.scheme == partition
    device = open_device(out, chip_configs(2))
    try:
        assert greedy_together(device, PROMPTS, STEPS) == reference
        assert device.collectives.total.bytes > 0
    finally:
        device.close()
