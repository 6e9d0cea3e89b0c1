"""Device: the strict runtime API over one ONNX Runtime execution provider.

    device = Device(DeviceConfig("cpu"))
    program = device.load("model.calbin")          # verify manifest + sizes (full_hash=True: SHA-256)
    device.configure(program)                      # sessions, KV lanes, IO bindings
    lane = device.lanes.allocate()
    h = device.submit(PrefillJob(lane, tokens))    # returns at once
    result = device.wait(h, timeout=5.0)           # logits + phase timings, or a typed error

Jobs run one at a time on a worker thread, in submission order. Every failure becomes a
`CalculetError` delivered through `wait`; nothing here exits the process. Each job's `slot` picks
one of STAGING_SLOTS sets of IO bindings (ping and pong), so a caller can keep two jobs in flight
and read one's result while the other runs; bindings are created on a slot's first use.

A worker stuck in a job (a hung execution provider) cannot be stopped, so it is fenced off instead:
`fence()` starts a new epoch with a fresh worker, queue, KV buffers and bindings, and fails every job
of the old epoch. The old worker keeps what it had; if its job ever returns, the result is dropped
under the commit lock (lane lengths, staged K/V and fetched rows are written only while the worker's
epoch is current), and its in-place KV writes land in the buffers it was given, which no lane uses
any more. Corrupt output (NaN or +inf logits) is a device error, never sampled.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from calculet.errors import CalculetError, DeviceError, ModelError, RequestError
from calculet.runtime.bindings import BodyBinding, HeadBinding  # noqa: F401  (the bindings' types)
from calculet.runtime.chunking import graph_for
from calculet.runtime.faults import FaultPlan
from calculet.runtime.hugepages import collapse as collapse_hugepages
from calculet.runtime.jobs import STAGING_SLOTS, DecodeJob, JobHandle, JobResult, PhaseTimings, PrefillJob
from calculet.runtime.lanes import Lanes
from calculet.runtime.program import DeviceConfig, Program

log = logging.getLogger("calculet.runtime")
# How long a caller waits for one device job before counting it as failed (engine, `calculet run`,
# golden checks): generous, since the first job on a large model and a slow CPU can take minutes.
JOB_TIMEOUT_S = 600.0


class _Fenced(Exception):
    """Raised in a worker whose epoch has ended: its job's effects are dropped."""


@dataclass
class _Worker:
    epoch: int
    jobs: queue.Queue
    thread: threading.Thread | None = None
    current: JobHandle | None = None      # the job it is running, if any
    kept: tuple = ()                      # a fenced worker's sessions, bindings and KV buffers, alive until it ends


class Device:
    def __init__(self, config: DeviceConfig | None = None, faults: FaultPlan | None = None, chips: tuple = ()):
        """chips: the `runtime.chips.ChipConfig`s this device runs on. Default: one chip from `config`,
        or for a partitioned calbin as many as it was compiled for, sharing the cores
        (`chips.chip_configs`). Chips given explicitly must match the calbin's count."""
        from calculet.runtime.chips import ChipConfig

        self.config = config or DeviceConfig()
        self._chips_given = bool(chips)
        self.chips = tuple(chips) or (ChipConfig(0, self.config.provider, self.config.provider_options,
                                                 self.config.threads),)
        if config is None and chips:
            self.config = self.chips[0].device_config()
        self.faults = faults if faults is not None else FaultPlan.from_env()
        self.program: Program | None = None
        self.lanes: Lanes | None = None
        self._bindings: dict[tuple[str, int, int], BodyBinding] = {}   # (graph, first lane, slot)
        self._heads: dict[tuple[int, int], HeadBinding] = {}            # (rows, slot)
        self._ids = itertools.count()
        self.expert_load: np.ndarray | None = None  # --expert-stats calbins: tokens per [sparse layer, expert]
        self._commit = threading.Lock()       # held while a job writes lane state; fence() takes it to end an epoch
        self._epoch = 0
        self._worker: _Worker | None = None
        self._fenced: list[_Worker] = []      # stuck workers of ended epochs
        self._local = threading.local()       # .epoch: the epoch of the worker running on this thread
        self.fences = 0                       # how many times a stuck worker was fenced off
        self.hugepages = None                 # runtime.hugepages.HugePageReport of the last configure (None: off)
        self.healthy = False

    # --- set-up --------------------------------------------------------------------------
    def load(self, path, full_hash: bool = False) -> Program:
        from calculet.runtime.partitioned import load_program
        return load_program(path, full_hash=full_hash)

    def configure(self, program: Program) -> None:
        self._inject_load_fault()
        self._open_sessions(program)
        self.program = program
        self.lanes = program.make_lanes()
        self._bindings, self._heads = {}, {}
        if self._worker is None:
            self._start_worker()
        self._warm_up()
        if self.config.hugepages == "collapse":   # after the warm-up: the arenas' buffers exist by now
            self.hugepages = collapse_hugepages()
            log.info("%s", self.hugepages.line())
        self.expert_load = None  # the warm-up's routing is not load
        if self.collectives is not None:
            self.collectives.reset()  # nor are its collectives traffic
        self.healthy = True

    def _open_sessions(self, program) -> None:
        """Sessions on this device's chips, after checking each chip's share against its memory budget."""
        from calculet.runtime.chips import check_budget, chip_configs

        if program.chip_count != len(self.chips) and not self._chips_given:
            # No chips named: a partitioned calbin gets as many as it was compiled for, sharing the cores.
            self.chips = chip_configs(program.chip_count, self.config.provider, self.config.provider_options)
        if program.chip_count != len(self.chips):
            raise ModelError("chip_count_mismatch", f"{program.path}: compiled for {program.chip_count} chip(s), "
                                                    f"this device has {len(self.chips)}; give it exactly "
                                                    f"{program.chip_count} chip(s) or recompile with --chips {len(self.chips)}")
        for memory, chip in zip(program.chip_memory(), self.chips):
            check_budget(memory, chip)
        if program.chip_count == 1:  # unnamed: the device's own config (profile_dir and all), as before chips
            program.open_sessions(self.chips[0].device_config() if self._chips_given else self.config)
        else:
            program.open_sessions(self.chips)

    @property
    def collectives(self):
        """The collectives of a partitioned calbin (runtime/collectives.py), None on one chip."""
        return getattr(self.program, "collectives", None)

    def _warm_up(self) -> None:
        """Run every graph once, on this thread before any job exists, so the first request does not
        pay for first-run allocations. Bypasses fault injection; leaves every lane free and empty."""
        lanes, program = self.lanes, self.program
        taken = [lanes.allocate() for _ in range(lanes.count)]
        try:
            for g in program.prefill_graphs:
                self._prefill(PrefillJob(taken[0], (0,) * g.tokens), 0.0)
                # back to length 0 without zeroing: rows past a lane's length are never read (masked), and
                # zeroing lane 0's full-context buffers made 200 MiB of untouched KV resident at 32k
                lanes.rewind(taken[0], 0)
            for g in program.decode_graphs:
                self._decode(tuple(taken[: g.lanes]), (0,) * g.lanes, 0.0, full_logits=True, slot=0)
        finally:
            lanes.reset_all()

    def reset(self) -> None:
        """After a device error: rebuild sessions and bindings, forget every lane."""
        self.healthy = False
        program = self.program
        if program is None:
            raise ModelError("not_configured", "reset() before configure(): load and configure a calbin first")
        self._inject_load_fault()
        self._open_sessions(program)
        self.lanes.reset_all()
        self._bindings, self._heads = {}, {}
        self.healthy = True

    def fence(self) -> None:
        """The worker is stuck (a job ran past its deadline): end its epoch, fail every job it holds or
        has queued (code job_fenced), and start a fresh worker with fresh KV buffers and bindings.
        Call reset() afterwards for fresh sessions. Lanes stay allocated; their contents are gone."""
        old = self._worker
        with self._commit:
            self._epoch += 1
            old.kept = (self.program.sessions, getattr(self.program, "_values", None), self._bindings, self._heads,
                        self.lanes.store, self.program.renew_kv())
            self._fenced.append(old)
            self.fences += 1
            self.healthy = False
            self.lanes.renew_buffers()
            self._bindings, self._heads = {}, {}
            self._start_worker()
        error = DeviceError("job_fenced", "the device worker was stuck and has been replaced; this job did not run")
        if old.current is not None:
            old.current._finish(error=error)
        old.jobs.put(None)               # the old worker ends once (if ever) its job returns
        while True:
            try:
                handle = old.jobs.get_nowait()
            except queue.Empty:
                break
            if handle is None:
                old.jobs.put(None)
                break
            handle._finish(error=error)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.jobs.put(None)
            self._worker.thread.join(timeout=5)
            self._worker = None
        if self.program is not None:
            self.program.close()         # a partitioned program's chip worker threads
        if self.faults is not None:
            self.faults.release.set()    # let an injected hang end with the device

    # --- jobs ----------------------------------------------------------------------------
    def submit(self, job: PrefillJob | DecodeJob) -> JobHandle:
        """Queue a job and return at once. Request errors found now are raised now."""
        if self.program is None:
            raise ModelError("not_configured", "submit() before configure(): load and configure a calbin first")
        self._check_tokens(job.tokens)
        if not 0 <= job.slot < STAGING_SLOTS:
            raise RequestError("bad_job", f"staging slot {job.slot} is out of range 0..{STAGING_SLOTS - 1}")
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
        self._worker.jobs.put(handle)
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
    def _start_worker(self) -> None:
        worker = _Worker(self._epoch, queue.Queue())
        worker.thread = threading.Thread(target=self._loop, args=(worker,), name=f"calculet-device-{worker.epoch}",
                                         daemon=True)
        self._worker = worker
        worker.thread.start()

    def _loop(self, worker: _Worker) -> None:
        self._local.epoch = worker.epoch
        while True:
            handle = worker.jobs.get()
            if handle is None:
                break
            worker.current = handle
            started = time.perf_counter()
            try:
                result = self._execute(handle.job, queued=started - handle.submitted_at)
                handle._finish(result=result)
            except _Fenced:
                pass                     # fence() has failed this job already
            except CalculetError as exc:
                self._failed(worker, isinstance(exc, DeviceError))
                handle._finish(error=exc)
            except Exception as exc:  # an execution-provider failure: never let it kill the worker
                self._failed(worker, True)
                handle._finish(error=DeviceError("device_run_failed", f"{handle.job.kind} job failed on the device: {exc}"))
            worker.current = None
        if worker in self._fenced:
            self._fenced.remove(worker)  # its sessions and buffers can go now

    def _failed(self, worker: _Worker, device_error: bool) -> None:
        if device_error and worker.epoch == self._epoch:   # a fenced worker's failure says nothing about the device now
            self.healthy = False

    @contextmanager
    def _committing(self):
        """Hold while writing lane state after a graph ran: a worker whose epoch has ended writes nothing."""
        with self._commit:
            epoch = getattr(self._local, "epoch", None)   # None: configure()'s warm-up on the caller's thread
            if epoch is not None and epoch != self._epoch:
                raise _Fenced
            yield

    def _execute(self, job, queued: float) -> JobResult:
        fault = self.faults.take(job.kind) if self.faults is not None else None
        if fault is not None:
            if fault.action == "fail":
                raise DeviceError("injected_fault", f"injected {job.kind} failure ({fault})")
            if fault.action == "alloc":
                raise RuntimeError(f"[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Failed to allocate memory (injected, {fault})")
            if fault.action == "hang":
                self.faults.wait_released()
            elif fault.action == "delay":
                time.sleep(fault.delay_s)
        if isinstance(job, PrefillJob):
            result = self._prefill(job, queued)
        else:
            result = self._decode(job.lanes, job.tokens, queued, job.full_logits, job.slot)
        if fault is not None and fault.action in ("nan", "inf"):
            _corrupt(result, np.nan if fault.action == "nan" else np.inf)
        _check_finite(result, job.kind)
        return result

    def _inject_load_fault(self) -> None:
        fault = self.faults.take("load") if self.faults is not None else None
        if fault is not None and fault.action == "delay":
            time.sleep(fault.delay_s)
        elif fault is not None:
            raise DeviceError("session_create_failed", f"cannot create the sessions: injected load failure ({fault})")

    def _prefill(self, job: PrefillJob, queued: float) -> JobResult:
        lanes, program = self.lanes, self.program
        start, n, context = lanes.length(job.lane), len(job.tokens), lanes.context
        if start + n > context:
            raise RequestError("context_overflow", f"lane {job.lane}: {start} tokens + {n} new exceed the context of {context}")
        size = graph_for(n, start, program.chunk_sizes, context)
        if size is None:
            if n == 1:  # at the very end of the context only the decode graph's single-token write fits
                return self._decode((job.lane,), job.tokens, queued, job.full_logits, job.slot)
            raise RequestError("chunk_does_not_fit", f"{n} tokens at position {start} fit no prefill graph "
                               f"(chunks {program.chunk_sizes}, context {context}); split them with plan_chunks")
        t0 = time.perf_counter()
        with self._committing():   # the binding (and so the KV buffers) of the current epoch, or none
            b = self._binding(f"prefill_{size}", job.lane, job.slot)
            ids = b.inputs["input_ids"]
            ids.fill(0)
            ids[0, :n] = job.tokens
            b.inputs["seqlens_k"][0] = start + size - 1
            if "total_seq_len" in b.inputs:  # in-place bodies only
                b.inputs["total_seq_len"][...] = start + size
            b.inputs["last_index"][0] = n - 1
        t1 = time.perf_counter()
        b.run(head=job.want_logits)
        with self._committing():
            if not b.in_place:
                lanes.write_new([0], [job.lane], [start], [n], b.new_kv["new_keys"], b.new_kv["new_values"])
            self._count_experts(b, slice(0, n))
            t2 = time.perf_counter()
            if job.want_logits:
                result = self._fetch(b.head, [0], job.full_logits, queued, t1 - t0, t2 - t1, t2, f"prefill_{size}", size)
            else:
                result = JobResult(None, PhaseTimings(queued, t1 - t0, t2 - t1, 0.0, f"prefill_{size}", size))
            lanes.advance(job.lane, n)
        return result

    def _decode(self, job_lanes: tuple[int, ...], tokens: tuple[int, ...], queued: float, full_logits: bool,
                slot: int) -> JobResult:
        lanes, context = self.lanes, self.lanes.context
        for lane in job_lanes:
            if lanes.length(lane) >= context:
                raise RequestError("context_overflow", f"lane {lane} is full: {lanes.length(lane)} tokens = the context of {context}")
        t0 = time.perf_counter()
        # The smallest decode graph whose window of lanes [first, first + graph.lanes) covers the job:
        # a lone request on lane 5 (lanes 0-4 kept warm by the prefix cache) runs the 1-lane graph on
        # lane 5's rows, not the 8-lane graph over lanes 0-7 (2.6x the step at context 32k).
        lo, hi = min(job_lanes), max(job_lanes)
        graph = self.program.decode_graph_for(hi - lo + 1)
        first = min(lo, lanes.count - graph.lanes)
        with self._committing():   # the binding (and so the KV buffers) of the current epoch, or none
            b = self._binding(graph.name, first, slot)
            ids, seqlens = b.inputs["input_ids"], b.inputs["seqlens_k"]
            ids.fill(0)
            # Rows of this graph not in the job still get a write: aim it at their next free position,
            # which the lane's next real step overwrites (free lanes: position 0; a free lane that keeps
            # its KV for the prefix cache: just past what it keeps).
            for row in range(graph.lanes):
                seqlens[row] = min(lanes.length(first + row), context - 1)
            rows = [lane - first for lane in job_lanes]   # the job's rows of this graph
            ids[rows, 0] = tokens
            if "total_seq_len" in b.inputs:
                b.inputs["total_seq_len"][...] = int(seqlens.max()) + 1
        t1 = time.perf_counter()
        b.run()
        with self._committing():
            if not b.in_place:
                lanes.write_new(rows, list(job_lanes), [lanes.length(lane) for lane in job_lanes], [1] * len(rows),
                                b.new_kv["new_keys"], b.new_kv["new_values"])
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
        values are written into them: a coarse head leaves coarse values in its logits output (and a
        multi-row one leaves them unscaled, with the row scales in `logits_scale`)."""
        out = head.outputs
        topk_ids = out["topk_ids"][rows] if "topk_ids" in out else None
        topk_values = out["topk_values"][rows] if "topk_values" in out else None
        logits = None
        if full_logits or topk_ids is None:
            logits = out["logits"][rows]
            if "logits_scale" in out:
                logits *= out["logits_scale"][rows]
            if topk_ids is not None:
                np.put_along_axis(logits, topk_ids, topk_values, axis=1)
        fetch = time.perf_counter() - t_done
        return JobResult(logits, PhaseTimings(queued, prep, infer, fetch, graph, computed), topk_ids, topk_values)

    # --- helpers -------------------------------------------------------------------------
    def _head(self, rows: int, slot: int) -> HeadBinding:
        if (rows, slot) not in self._heads:
            self._heads[(rows, slot)] = self.program.head_binding(rows, self.lanes.store.device,
                                                                  getattr(self.lanes.store, "device_id", 0))
        return self._heads[(rows, slot)]

    def _binding(self, graph_name: str, first_lane: int, slot: int) -> BodyBinding:
        key = (graph_name, first_lane, slot)
        if key not in self._bindings:
            graph = self.program.graph(graph_name)
            self._bindings[key] = self.program.body_binding(graph_name, self.lanes, first_lane,
                                                            self._head(graph.lanes, slot))
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


def _corrupt(result: JobResult, value: float) -> None:
    """Fault injection: the job's output as a broken kernel would leave it."""
    for array in (result.logits, result.topk_values):
        if array is not None:
            array[...] = value


def _check_finite(result: JobResult, kind: str) -> None:
    """NaN or +inf logits are a device failure, never sampled. One pass over the rows it fetched (the
    max propagates NaN and +inf; -inf alone is a legitimately banned token)."""
    for name, array in (("logits", result.logits), ("candidate logits", result.topk_values)):
        if array is not None and array.size and not np.isfinite(array.max(axis=-1)).all():
            raise DeviceError("bad_output", f"the {kind} job's {name} hold NaN or infinity: the device computed garbage; "
                              f"its requests fail and the device is reset")
