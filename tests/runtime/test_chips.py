"""Chips as execution slots: configs, thread split, memory budgets, and the collectives' counting."""

from __future__ import annotations

import numpy as np
import pytest

from calculet.errors import ModelError
from calculet.runtime.chips import ChipConfig, ChipMemory, check_budget, chip_configs, open_device, split_threads
from calculet.runtime.collectives import Collectives


def test_two_chips_on_two_cores_get_one_thread_each():
    assert split_threads(2, cores=2) == 1
    assert split_threads(3, cores=2) == 1          # never zero: a chip always has a thread
    assert split_threads(2, cores=8) == 4
    chips = chip_configs(2, cores=2, memory_budget_bytes=1000)
    assert [c.index for c in chips] == [0, 1]
    assert all(c.intra_op_threads == 1 and c.memory_budget_bytes == 1000 for c in chips)
    assert chips[1].device_config().threads == 1


@pytest.mark.parametrize("kwargs, word", [(dict(index=-1), "index"), (dict(provider="tpu"), "provider"),
                                          (dict(intra_op_threads=-2), "intra_op_threads"),
                                          (dict(memory_budget_bytes=-1), "memory_budget_bytes")])
def test_bad_chip_config_says_what_is_wrong(kwargs, word):
    with pytest.raises(ModelError) as e:
        ChipConfig(**kwargs)
    assert word in str(e.value)


def test_budget_error_names_every_number():
    memory = ChipMemory(1, weights=600, kv=300, staging=200)
    check_budget(memory, ChipConfig(1, memory_budget_bytes=1100))     # exactly fits
    check_budget(memory, ChipConfig(1))                                # no budget
    with pytest.raises(ModelError) as e:
        check_budget(memory, ChipConfig(1, memory_budget_bytes=1099))
    assert e.value.code == "chip_memory_exceeded"
    for number in ("chip 1", "600", "300", "200", "1100", "1099"):
        assert number in str(e.value)


def test_a_calbin_over_a_chips_budget_is_refused_at_configure(tiny_calbin):
    path = tiny_calbin("llama", chips=2, partition="pp")
    with pytest.raises(ModelError) as e:
        open_device(path, chip_configs(2, memory_budget_bytes=100_000))
    assert e.value.code == "chip_memory_exceeded" and "chip 0" in str(e.value)


def test_a_partitioned_calbin_needs_its_chip_count(tiny_calbin):
    with pytest.raises(ModelError) as e:
        open_device(tiny_calbin("llama", chips=2, partition="pp"), chip_configs(1))
    assert e.value.code == "chip_count_mismatch"


def test_collectives_move_and_count_bytes():
    coll = Collectives(2)
    a, b = np.arange(6, dtype=np.float32), np.zeros(6, np.float32)
    coll.send(a, b, 0, 1)
    assert (b == a).all()
    outs = [np.zeros(6, np.float32), np.zeros(6, np.float32)]
    coll.all_reduce([a, a * 2], outs)
    assert (outs[0] == a * 3).all() and (outs[1] == a * 3).all()
    coll.broadcast(a, [np.zeros(6, np.float32)])
    step = coll.end_step()
    assert step.calls == 3
    assert step.by_kind == {"send": (1, 24), "all_reduce": (1, 2 * 1 * 24), "broadcast": (1, 24)}
    assert step.bytes == 24 + 48 + 24 and step.seconds >= 0
    assert coll.end_step().calls == 0 and coll.total.bytes == 96
    gathered = coll.all_gather([a[:3], a[3:]])
    assert (gathered == a).all()
    got = coll.all_to_all([[a[:1], a[1:2]], [a[2:3], a[3:4]]])
    assert got[1][0] is not None and (got[1][0] == a[1:2]).all()
    with pytest.raises(ModelError):
        coll.send(a, b, 0, 2)
