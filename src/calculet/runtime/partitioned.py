"""A partitioned calbin on several chips: per-chip programs, KV and workers, driven by the schedules.

    program = load_program(path)            # Program, or PartitionedProgram when the manifest has a partition
    device.configure(program)               # one Program (sessions) + one Lanes (its KV share) per chip

The device sees the same interface as for one chip (entry points, `body_binding`, `head_binding`),
so its jobs, lanes bookkeeping, fencing and timings are unchanged. A `ScheduleBinding` stands in
for a body graph's IO binding: `run()` walks the schedule (calbin/partition.py),

    segment 0 ─ collective 0 ─ segment 1 ─ ... ─ last segment ─▶ head (on the head chip)

running the graphs of one segment concurrently, one worker thread per chip (a segment with one
graph runs on the caller's thread), and moving every tensor between chips through `Collectives`.
Host inputs (input_ids, seqlens_k, total_seq_len, last_index) are host arrays every chip graph
reads; a chip's KV lives in its own `Lanes` (its layers, its KV heads), bound by global layer name.
Lane bookkeeping (which lanes are in use, their lengths) stays with the device's own `Lanes`, which
holds no KV for a partitioned program.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from calculet.calbin.graphspec import PRESENT_PREFIX
from calculet.calbin.manifest import read_manifest
from calculet.calbin.partition import HOST_INPUTS, Schedule
from calculet.errors import ModelError
from calculet.runtime.bindings import HeadBinding
from calculet.runtime.collectives import Collectives
from calculet.runtime.lanes import Lanes
from calculet.runtime.program import Program

_KV = re.compile(r"^(past|present)_(key|value)\.(\d+)$")


def load_program(path, full_hash: bool = False) -> Program:
    if read_manifest(path).partition is not None:
        return PartitionedProgram(path, full_hash=full_hash)
    return Program(path, full_hash=full_hash)


class PartitionedProgram(Program):
    """The whole model's entry points (the top manifest) over one sub-calbin Program per chip."""

    def __init__(self, path, full_hash: bool = False):
        super().__init__(path, full_hash=full_hash)     # verifies every file, the chips' included
        self.partition = self.manifest.partition
        self.parts = [Program(self.path / c.folder, chip_part=True) for c in self.partition.chips]
        self.chip_lanes: list[Lanes] = []
        self.collectives = Collectives(len(self.parts))
        self._pools: list[ThreadPoolExecutor] = []

    @property
    def chip_count(self) -> int:
        return len(self.parts)

    def chip_memory(self) -> list:
        from calculet.runtime.chips import ChipMemory
        return [ChipMemory.of(i, p.manifest) for i, p in enumerate(self.parts)]

    def chip_plans(self) -> tuple:
        return tuple(p.manifest.memory_plan for p in self.parts)

    def open_sessions(self, chips) -> None:
        t0 = time.perf_counter()
        for part, chip in zip(self.parts, chips):
            part.open_sessions(chip.device_config())
        self.sessions = {f"chip{i}/{name}": s for i, p in enumerate(self.parts) for name, s in p.sessions.items()}
        self.chip_lanes = [Lanes(p.manifest.kv) for p in self.parts]
        if not self._pools:
            self._pools = [ThreadPoolExecutor(1, thread_name_prefix=f"calculet-chip-{i}") for i in range(len(self.parts))]
        self.load_seconds = time.perf_counter() - t0

    def renew_kv(self):
        old = self.chip_lanes
        self.chip_lanes = [Lanes(p.manifest.kv) for p in self.parts]
        return old

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=False)
        self._pools = []

    def make_lanes(self) -> Lanes:
        """Bookkeeping only: lanes and lengths; the KV lives on the chips."""
        return Lanes(replace(self.manifest.kv, num_layers=0, layer_lengths=()))

    def head_binding(self, rows: int, device: str = "cpu", device_id: int = 0) -> HeadBinding:
        """On the head chip; chips keep host KV (partitioned calbins are cpu-target), so `device` is cpu."""
        graph = self.head_graphs[rows]
        part = self.parts[self.partition.head_chip]
        return HeadBinding(part.sessions[graph.name], part.graph(graph.name))

    def body_binding(self, name: str, lanes, first_lane: int, head: HeadBinding) -> "ScheduleBinding":
        return ScheduleBinding(self, self.partition.schedule(name), self.graph(name), first_lane, head)


class _Run:
    """One chip graph of a segment with its IO binding."""

    def __init__(self, chip: int, session):
        self.chip = chip
        self.session = session
        self.io = session.io_binding()
        self.keep = []

    def bind(self, name: str, array: np.ndarray, output: bool = False):
        import onnxruntime as ort

        value = ort.OrtValue.ortvalue_from_numpy(array)
        self.keep.append(value)
        (self.io.bind_ortvalue_output if output else self.io.bind_ortvalue_input)(name, value)
        return value

    def run(self) -> None:
        self.session.run_with_iobinding(self.io)


class ScheduleBinding:
    """A logical body graph's binding over the chips (the device uses it like a BodyBinding)."""

    in_place = True
    new_kv: dict = {}
    expert_mask = None

    def __init__(self, program: PartitionedProgram, schedule: Schedule, graph, first_lane: int, head: HeadBinding):
        self.program, self.schedule, self.head = program, schedule, head
        self.inputs = {t.name: np.zeros(t.shape, t.dtype) for t in graph.inputs if t.name in HOST_INPUTS}
        rows = slice(first_lane, first_lane + graph.lanes)
        carries: dict[tuple[int, str, int], np.ndarray] = {}   # (chip, name stem, segment parity) -> array
        inbox: dict[tuple[int, str], np.ndarray] = {}           # (chip, input name) -> array a collective writes
        self.segments: list[list[_Run]] = []
        for k, segment in enumerate(schedule.segments):
            before = schedule.collectives[k - 1] if k else None
            runs = []
            for chip, name in segment.runs:
                part = program.parts[chip]
                gs = part.graph(name)
                run = _Run(chip, part.sessions[name])
                for t in gs.inputs:
                    kv = _KV.match(t.name)
                    if t.name in HOST_INPUTS:
                        run.bind(t.name, self.inputs[t.name])
                    elif kv:
                        value = run.bind(t.name, self._kv_view(chip, kv, rows))
                        run.io.bind_ortvalue_output(f"{PRESENT_PREFIX}{kv.group(2)}.{kv.group(3)}", value)
                    elif before is not None and t.name == before.dst and chip in before.targets:
                        run.bind(t.name, inbox.setdefault((chip, t.name), np.zeros(t.shape, t.dtype)))
                    elif t.name.endswith("_in") and (chip, t.name[:-3], (k - 1) % 2) in carries:
                        run.bind(t.name, carries[(chip, t.name[:-3], (k - 1) % 2)])
                    else:
                        raise ModelError("bad_partition", f"chip {chip} graph {name!r} input {t.name!r}: no host input, "
                                                          f"KV buffer, collective or earlier output feeds it")
                for t in gs.outputs:
                    if t.name.startswith(PRESENT_PREFIX):
                        continue              # bound with its past_* buffer
                    if t.name == "hidden":
                        run.bind(t.name, head.hidden, output=True)
                    elif t.name.endswith("_out"):
                        key = (chip, t.name[:-4], k % 2)
                        run.bind(t.name, carries.setdefault(key, np.zeros(t.shape, t.dtype)), output=True)
                    else:
                        raise ModelError("bad_partition", f"chip {chip} graph {name!r}: output {t.name!r} has no destination")
                runs.append(run)
            self.segments.append(runs)
        # Each collective reads its sources' outputs of the segment before it and writes its targets' inputs.
        self.moves = []
        for k, c in enumerate(schedule.collectives):
            stem = c.src[:-4] if c.src.endswith("_out") else c.src
            srcs = [carries[(chip, stem, k % 2)] for chip in c.sources]
            dsts = [inbox[(chip, c.dst)] for chip in c.targets]
            self.moves.append((c, srcs, dsts))

    def _kv_view(self, chip: int, kv: re.Match, rows: slice) -> np.ndarray:
        lanes = self.program.chip_lanes[chip]
        layer = int(kv.group(3))
        local = self.program.partition.chips[chip].layers.index(layer)
        return (lanes.keys if kv.group(2) == "key" else lanes.values)[local][rows]

    def run(self, head: bool = True) -> None:
        coll = self.program.collectives
        for k, runs in enumerate(self.segments):
            if len(runs) == 1:
                runs[0].run()
            else:
                for f in [self.program._pools[r.chip].submit(r.run) for r in runs]:
                    f.result()
            if k < len(self.moves):
                c, srcs, dsts = self.moves[k]
                if c.kind == "send":
                    coll.send(srcs[0], dsts[0], c.sources[0], c.targets[0])
                elif c.kind == "broadcast":
                    coll.broadcast(srcs[0], dsts)
                elif c.kind == "reduce":
                    coll.reduce(srcs, dsts[0])
                else:
                    coll.all_reduce(srcs, dsts)
        if head:
            self.head.run()
        coll.end_step()

