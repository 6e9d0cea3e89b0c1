"""The memory plan is true: what the runtime really allocates equals what the calbin's plan states."""

from __future__ import annotations

import pytest

from calculet.calbin.graphspec import PREFILL
from calculet.calbin.memory_plan import STAGING_SLOTS
from calculet.runtime.device import Device
from calculet.runtime.jobs import DecodeJob, PrefillJob


@pytest.mark.parametrize("target, kv_dtype", [("cpu", "fp32"), ("portable", "fp32"), ("cpu", "fp16"),
                                              ("portable", "fp16")])
def test_runtime_allocates_what_the_plan_states(tiny_model_dir, tmp_path, target, kv_dtype):
    """Guards against a plan that describes buffers the runtime never allocates (the old ping/pong
    regions), and against one that forgets the second staging set two jobs in flight need: after
    every graph has run on every lane it can, in both staging slots, the KV arrays, the mapped
    weights and each graph's IO-binding arrays add up to the plan's numbers exactly. With --kv-dtype
    fp16 the KV arrays (and a portable graph's new K/V staging) are float16 on both sides."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    options = CompileOptions(lanes=3, context=32, prefill_chunks=(4, 8), decode_lanes=(1, 2), target=target,
                             weights="fp32", golden=False, kv_dtype=kv_dtype)
    path = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "m.calbin", options, log=lambda _m: None)
    d = Device()
    d.configure(d.load(path))
    try:
        plan = d.program.manifest.memory_plan
        lanes = [d.lanes.allocate() for _ in range(d.lanes.count)]
        for slot in range(STAGING_SLOTS):
            for lane in lanes:                      # every prefill graph on every first lane
                for size in d.program.chunk_sizes:
                    d.run(PrefillJob(lane, tuple(range(5, 5 + size)), want_logits=False, slot=slot), 30)
                d.lanes.clear(lane)
            for n in (1, 2, 3):                     # every decode graph (and its head)
                d.run(DecodeJob(tuple(lanes[:n]), tuple(range(7, 7 + n)), slot=slot), 30)

        assert d.lanes.nbytes == plan.kv.total_bytes
        assert {a.dtype.name for a in d.lanes.buffers} == {plan.kv.dtype} == {options.kv_numpy_dtype}
        assert d.program._weights.nbytes == plan.weights_bytes
        staging = {s.graph: s for s in plan.staging}
        assert set(staging) == {g.name for g in d.program.graphs}
        made: dict[str, list[int]] = {}
        for (name, _lane, _slot), b in d._bindings.items():
            made.setdefault(name, []).append(sum(a.nbytes for a in (*b.inputs.values(), *b.new_kv.values())))
        for (_rows, _slot), h in d._heads.items():
            made.setdefault(h.graph.name, []).append(h.hidden.nbytes + sum(a.nbytes for a in h.outputs.values()))
        for g in d.program.graphs:
            s = staging[g.name]
            assert made[g.name] == [s.binding_bytes] * len(made[g.name]), g.name
            want = STAGING_SLOTS * (d.lanes.count if g.type == PREFILL else 1)
            assert len(made[g.name]) == s.bindings == want, g.name
        assert plan.total_bytes == plan.weights_bytes + plan.kv.total_bytes + sum(s.total_bytes for s in plan.staging)
    finally:
        d.close()
