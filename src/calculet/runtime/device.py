"""Device: the strict runtime API over one ONNX Runtime execution provider.

    device = Device(DeviceConfig("cpu"))
    program = device.load("model.calbin")          # verify manifest + sizes (full_hash=True: SHA-256)
    device.configure(program)                      # sessions, KV lanes, IO bindings
    lane = device.lanes.allocate()
    h = device.submit(PrefillJob(lane, tokens))    # returns at once
    result = device.wait(h, timeout=5.0)           # logits + phase timings, or a typed error

Jobs run one at a time on a worker thread, in submission order. Every failure becomes a
`CalculetError` delivered through `wait`; nothing here exits the process.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time

import numpy as np

from calculet.errors import CalculetError, DeviceError, ModelError, RequestError
from calculet.runtime.bindings import BodyBinding, HeadBinding
from calculet.runtime.chunking import graph_for
from calculet.runtime.faults import FaultPlan
from calculet.runtime.jobs import DecodeJob, JobHandle, JobResult, PhaseTimings, PrefillJob
from calculet.runtime.lanes import Lanes
from calculet.runtime.program import DeviceConfig, Program

# How long a caller waits for one device job before counting it as failed (engine, `calculet run`,
# golden checks): generous, since the first job on a large model and a slow CPU can take minutes.
JOB_TIMEOUT_S = 600.0


class Device:
    def __init__(self, config: DeviceConfig | None = None, faults: FaultPlan | None = None):
        self.config = config or DeviceConfig()
        self.faults = faults if faults is not None else FaultPlan.from_env()
        self.program: Program | None = None
        self.lanes: Lanes | None = None
        self._bindings: dict[tuple[str, int], BodyBinding] = {}
        self._heads: dict[int, HeadBinding] = {}
        self._queue: queue.Queue[JobHandle | None] = queue.Queue()
        self._ids = itertools.count()
        self._worker: threading.Thread | None = None
        self.expert_load: np.ndarray | None = None  # --expert-stats calbins: tokens per [sparse layer, expert]
        self.healthy = False

    # --- set-up --------------------------------------------------------------------------
    def load(self, path, full_hash: bool = False) -> Program:
        return Program(path, full_hash=full_hash)

    def configure(self, program: Program) -> None:
        program.open_sessions(self.config)
        self.program = program
        self.lanes = Lanes(program.manifest.kv)
        self._bindings, self._heads = {}, {}
        if self._worker is None:
            self._worker = threading.Thread(target=self._loop, name="calculet-device", daemon=True)
            self._worker.start()
        self._warm_up()
        self.expert_load = None  # the warm-up's routing is not load
        self.healthy = True

    def _warm_up(self) -> None:
        """Run every graph once, on this thread before any job exists, so the first request does not
        pay for first-run allocations. Bypasses fault injection; leaves every lane free and empty."""
        lanes, program = self.lanes, self.program
        taken = [lanes.allocate() for _ in range(lanes.count)]
        try:
            for g in program.prefill_graphs:
                self._prefill(PrefillJob(taken[0], (0,) * g.tokens), 0.0)
                lanes.clear(taken[0])
            for g in program.decode_graphs:
                self._decode(tuple(taken[: g.lanes]), (0,) * g.lanes, 0.0, full_logits=True)
        finally:
            lanes.reset_all()

    def reset(self) -> None:
        """After a device error: rebuild sessions and bindings, forget every lane."""
        self.healthy = False
        program = self.program
        if program is None:
            raise ModelError("not_configured", "reset() before configure(): load and configure a calbin first")
        program.open_sessions(self.config)
        self.lanes.reset_all()
        self._bindings, self._heads = {}, {}
        self.healthy = True

    def close(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join(timeout=5)
            self._worker = None

    # --- jobs ----------------------------------------------------------------------------
    def submit(self, job: PrefillJob | DecodeJob) -> JobHandle:
        """Queue a job and return at once. Request errors found now are raised now."""
        if self.program is None:
            raise ModelError("not_configured", "submit() before configure(): load and configure a calbin first")
        self._check_tokens(job.tokens)
        if isinstance(job, PrefillJob):
            if not job.tokens:
                raise RequestError("empty_prompt", "a prefill job needs at least one token")
            self._check_lane(job.lane)
        else:
            if not job.lanes or len(job.lanes) != len(job.tokens):
                raise RequestError("bad_job", f"a decode job needs one token per lane, got {len(job.lanes)} lanes and {len(job.tokens)} tokens")
            if len(set(job.lanes)) != len(job.lanes):
                raise RequestError("bad_job", f"decode job lanes must be distinct, got {job.lanes}")
            for lane in job.lanes:
                self._check_lane(lane)
        handle = JobHandle(job=job, id=next(self._ids), submitted_at=time.perf_counter())
        self._queue.put(handle)
        return handle

    def wait(self, handle: JobHandle, timeout: float | None = None) -> JobResult:
        if not handle._done.wait(timeout):
            raise DeviceError("wait_timeout", f"job {handle.id} ({handle.job.kind}) did not finish within {timeout} s")
        if handle._error is not None:
            raise handle._error
        return handle._result

    def run(self, job, timeout: float | None = None) -> JobResult:
        return self.wait(self.submit(job), timeout)

    # --- worker --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            handle = self._queue.get()
            if handle is None:
                return
            started = time.perf_counter()
            try:
                result = self._execute(handle.job, queued=started - handle.submitted_at)
                handle._finish(result=result)
            except CalculetError as exc:
                if isinstance(exc, DeviceError):
                    self.healthy = False
                handle._finish(error=exc)
            except Exception as exc:  # an execution-provider failure: never let it kill the worker
                self.healthy = False
                handle._finish(error=DeviceError("device_run_failed", f"{handle.job.kind} job failed on the device: {exc}"))

    def _execute(self, job, queued: float) -> JobResult:
        if self.faults is not None and self.faults.should_fail(job.kind):
            raise DeviceError("injected_fault", f"injected {job.kind} failure ({self.faults.kind}:{self.faults.after})")
        if isinstance(job, PrefillJob):
            return self._prefill(job, queued)
        return self._decode(job.lanes, job.tokens, queued, job.full_logits)

    def _prefill(self, job: PrefillJob, queued: float) -> JobResult:
        lanes, program = self.lanes, self.program
        start, n, context = lanes.length(job.lane), len(job.tokens), lanes.context
        if start + n > context:
            raise RequestError("context_overflow", f"lane {job.lane}: {start} tokens + {n} new exceed the context of {context}")
        size = graph_for(n, start, program.chunk_sizes, context)
        if size is None:
            if n == 1:  # at the very end of the context only the decode graph's single-token write fits
                return self._decode((job.lane,), job.tokens, queued, job.full_logits)
            raise RequestError("chunk_does_not_fit", f"{n} tokens at position {start} fit no prefill graph "
                               f"(chunks {program.chunk_sizes}, context {context}); split them with plan_chunks")
        t0 = time.perf_counter()
        b = self._binding(f"prefill_{size}", job.lane)
        ids = b.inputs["input_ids"]
        ids.fill(0)
        ids[0, :n] = job.tokens
        b.inputs["seqlens_k"][0] = start + size - 1
        if "total_seq_len" in b.inputs:  # in-place bodies only
            b.inputs["total_seq_len"][...] = start + size
        b.inputs["last_index"][0] = n - 1
        t1 = time.perf_counter()
        b.run(head=job.want_logits)
        if not b.in_place:
            lanes.write_new([job.lane], [start], [n], b.new_kv["new_keys"], b.new_kv["new_values"])
        self._count_experts(b, slice(0, n))
        t2 = time.perf_counter()
        if job.want_logits:
            result = self._fetch(b.head, [0], job.full_logits, queued, t1 - t0, t2 - t1, t2, f"prefill_{size}", size)
        else:
            result = JobResult(None, PhaseTimings(queued, t1 - t0, t2 - t1, 0.0, f"prefill_{size}", size))
        lanes.advance(job.lane, n)
        return result

    def _decode(self, job_lanes: tuple[int, ...], tokens: tuple[int, ...], queued: float, full_logits: bool) -> JobResult:
        lanes, context = self.lanes, self.lanes.context
        for lane in job_lanes:
            if lanes.length(lane) >= context:
                raise RequestError("context_overflow", f"lane {lane} is full: {lanes.length(lane)} tokens = the context of {context}")
        t0 = time.perf_counter()
        graph = self.program.decode_graph_for(max(job_lanes) + 1)
        b = self._binding(graph.name, 0)
        ids, seqlens = b.inputs["input_ids"], b.inputs["seqlens_k"]
        ids.fill(0)
        # Rows of this graph not in the job still get a write: aim it at their next free position,
        # which the lane's next real step overwrites (free lanes: position 0).
        for lane in range(graph.lanes):
            seqlens[lane] = min(lanes.length(lane), context - 1) if lanes.in_use(lane) else 0
        rows = list(job_lanes)
        ids[rows, 0] = tokens
        if "total_seq_len" in b.inputs:
            b.inputs["total_seq_len"][...] = int(seqlens.max()) + 1
        t1 = time.perf_counter()
        b.run()
        if not b.in_place:
            lanes.write_new(rows, [lanes.length(lane) for lane in rows], [1] * len(rows),
                            b.new_kv["new_keys"][:, rows], b.new_kv["new_values"][:, rows])
        self._count_experts(b, rows)
        t2 = time.perf_counter()
        result = self._fetch(b.head, rows, full_logits, queued, t1 - t0, t2 - t1, t2, graph.name, graph.lanes)
        for lane in job_lanes:
            lanes.advance(lane, 1)
        return result

    def _count_experts(self, b, rows) -> None:
        """Tokens routed to each expert, summed over this job's real rows (calbins compiled with
        --expert-stats only): `expert_load` [sparse layers, experts] accumulates since configure()."""
        if b.expert_mask is None:
            return
        counts = b.expert_mask[:, rows].sum(axis=1, dtype=np.int64)
        self.expert_load = counts if self.expert_load is None else self.expert_load + counts

    def _fetch(self, head: HeadBinding, rows: list[int], full_logits: bool, queued: float, prep: float, infer: float,
               t_done: float, graph: str, computed: int) -> JobResult:
        """Copy this job's rows out of the head's output buffers (the next job reuses them).

        With a sampling head, full rows are copied only when asked for, and the head's exact candidate
        values are written into them: a coarse head leaves coarse values in its logits output."""
        out = head.outputs
        topk_ids = out["topk_ids"][rows] if "topk_ids" in out else None
        topk_values = out["topk_values"][rows] if "topk_values" in out else None
        logits = None
        if full_logits or topk_ids is None:
            logits = out["logits"][rows]
            if topk_ids is not None:
                np.put_along_axis(logits, topk_ids, topk_values, axis=1)
        fetch = time.perf_counter() - t_done
        return JobResult(logits, PhaseTimings(queued, prep, infer, fetch, graph, computed), topk_ids, topk_values)

    # --- helpers -------------------------------------------------------------------------
    def _head(self, rows: int) -> HeadBinding:
        if rows not in self._heads:
            graph = self.program.head_graphs[rows]
            self._heads[rows] = HeadBinding(self.program.sessions[graph.name], graph)
        return self._heads[rows]

    def _binding(self, graph_name: str, first_lane: int) -> BodyBinding:
        key = (graph_name, first_lane)
        if key not in self._bindings:
            graph = self.program.graph(graph_name)
            self._bindings[key] = BodyBinding(self.program.sessions[graph_name], graph, self.lanes, first_lane,
                                              self._head(graph.lanes))
        return self._bindings[key]

    def _check_lane(self, lane: int) -> None:
        if not 0 <= lane < self.lanes.count:
            raise RequestError("bad_lane", f"lane {lane} is out of range 0..{self.lanes.count - 1}")
        if not self.lanes.in_use(lane):
            raise RequestError("lane_not_allocated", f"lane {lane} is not allocated; call lanes.allocate() first")

    def _check_tokens(self, tokens) -> None:
        vocab = self.program.vocab_size
        for t in tokens:
            if not 0 <= t < vocab:
                raise RequestError("bad_token", f"token id {t} is outside the vocabulary 0..{vocab - 1}")
