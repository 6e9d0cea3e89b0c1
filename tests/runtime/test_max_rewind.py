"""`Program.max_rewind`: how far back from a lane's end its KV can be reused (the prefix cache's bound).

A lane cut back by max_rewind positions (Lanes.rewind) and continued with new tokens gives what a
fresh lane fed the same tokens gives, even after the writes that eat into a ring: a padded prefill
chunk and a decode step the lane sat out. Cut back further, a sliding-window layer's ring no longer
holds the window the next token reads, and the logits differ: the bound is not a formality.
"""

from __future__ import annotations

import numpy as np
import pytest

from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions
from calculet.errors import RequestError
from calculet.runtime.device import Device
from calculet.runtime.jobs import DecodeJob, PrefillJob
from decoding import prefill

WINDOW, CHUNKS = 16, (12, 24)


@pytest.fixture(scope="module", params=["cpu", "portable"])
def device(request, tmp_path_factory):
    import tiny_models

    hf = tiny_models.make_tiny_model("gemma3", tmp_path_factory.mktemp("hf"), seed=3, sliding_window=WINDOW,
                                     max_position_embeddings=2048)
    options = CompileOptions(lanes=3, context=256, prefill_chunks=CHUNKS, golden=False, weights="fp32",
                             target=request.param)
    path = compile_calbin(str(hf), tmp_path_factory.mktemp("calbin") / "m.calbin", options, log=lambda _m: None)
    d = Device()
    d.configure(d.load(path))
    yield d
    d.close()


def _ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 300, size=n).tolist()


def test_max_rewind_is_the_ring_less_the_window(device):
    assert device.program.max_rewind == WINDOW + max(CHUNKS) - WINDOW == 24


@pytest.mark.parametrize("extra, same", [(0, True), (3, False)])
def test_a_lane_cut_back_by_max_rewind_continues_like_a_fresh_one(device, extra, same):
    history, suffix = _ids(80, 1), _ids(20, 2)
    a, b, c = (device.lanes.allocate() for _ in range(3))
    try:
        prefill(device, a, history[:75])
        device.run(PrefillJob(a, tuple(history[75:80])), 30)   # 5 tokens on the 12-token graph: 7 padded
        prefill(device, b, _ids(3, 9))
        device.run(DecodeJob((b,), (5,)), 30)                    # lane a sits out: its next row is written
        n = device.lanes.length(a)
        k = n - device.program.max_rewind - extra
        device.lanes.rewind(a, k)
        reused = prefill(device, a, suffix)
        fresh = prefill(device, c, history[:k] + suffix)
        err = float(np.abs(reused - fresh).max())
        assert (err < 1e-4) if same else (err > 1e-3), err
    finally:
        for lane in (a, b, c):
            device.lanes.free(lane)


def test_a_lane_whose_ring_never_wrapped_continues_from_any_length(device):
    """Lanes.reach: a lane whose content covered at most the ring's rows (40 here) still holds every
    position, so cut back much further than max_rewind it continues like a fresh lane (the prefix
    cache resumes such lanes anywhere)."""
    ring = device.program.manifest.kv.ring
    history, suffix = _ids(30, 5), _ids(30, 6)
    a, b, c = (device.lanes.allocate() for _ in range(3))
    try:
        prefill(device, a, history)                              # 24 + 12-token graphs: 6 rows padded
        prefill(device, b, _ids(3, 9))
        device.run(DecodeJob((b,), (5,)), 30)                    # lane a sits out: row 30 is written
        assert device.lanes.reach(a) == 31 <= ring == 40
        k = 3
        assert device.lanes.length(a) - k > device.program.max_rewind
        device.lanes.rewind(a, k)
        reused = prefill(device, a, suffix)                      # and on past the ring's 40 rows
        fresh = prefill(device, c, history[:k] + suffix)
        assert float(np.abs(reused - fresh).max()) < 1e-4
    finally:
        for lane in (a, b, c):
            device.lanes.free(lane)


def test_rewind_past_the_lane_length_is_refused(device):
    lane = device.lanes.allocate()
    try:
        prefill(device, lane, _ids(5, 4))
        with pytest.raises(RequestError, match=r"0\.\.5"):
            device.lanes.rewind(lane, 6)
    finally:
        device.lanes.free(lane)
