"""Device jobs of one engine step, kept `in_flight` deep: ping/pong execution.

    in_flight 1   submit j0 ─ wait j0 ─ host: sample/emit j0 ─ submit j1 ─ wait j1 ─ host ...
                  (the device idles while the host works: immediate wait)
    in_flight 2   submit j0 (slot 0), j1 (slot 1) ─ wait j0 ─ host: sample/emit j0 while the device
                  runs j1 ─ submit j2 (slot 0) ─ wait j1 ─ host: j1 while the device runs j2 ...

A step's jobs come decode first, then the prefill chunks, so with two in flight the host samples,
detokenizes and streams the decode rows while the device prefills the next chunk. Each job names a
staging slot (runtime: its own IO-binding arrays per slot); a slot is given to a new job only after
the job that last held it was handed back and the caller resumed this iterator, so the worker never
writes into buffers of a result the host may still be reading.

After a device error no further job is submitted; the ones already in flight are still waited for
(the device must be quiet before it is reset). A job past the timeout fences the stuck worker off.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Iterator

from calculet.errors import CalculetError, DeviceError
from calculet.runtime.jobs import STAGING_SLOTS, Job, JobResult

IN_FLIGHT = (1, 2)


@dataclass(frozen=True)
class StepJob:
    kind: str                  # "decode" | "prefill"
    job: Job
    seqs: tuple                # the sequences whose tokens this job computes
    work: object = None        # the scheduler's PrefillWork for a prefill chunk


class JobPipeline:
    def __init__(self, device, in_flight: int, job_timeout_s: float):
        if in_flight not in IN_FLIGHT or in_flight > STAGING_SLOTS:
            raise ValueError(f"--in-flight must be 1 or 2, got {in_flight}")
        self.device = device
        self.in_flight = in_flight
        self.job_timeout_s = job_timeout_s

    def run(self, items: list[StepJob]) -> Iterator[tuple[StepJob, JobResult | CalculetError]]:
        """Each item's outcome, in order: its JobResult, or the error that failed it. Items not yet
        submitted when a device error happened are not handed back (they did not run)."""
        todo, pending = deque(items), deque()
        slot, broken = 0, False
        while todo or pending:
            while todo and not broken and len(pending) < self.in_flight:
                item = todo.popleft()
                try:
                    pending.append((item, self.device.submit(replace(item.job, slot=slot))))
                    slot = (slot + 1) % self.in_flight
                except CalculetError as exc:
                    broken = broken or isinstance(exc, DeviceError)
                    yield item, exc
            if not pending:
                break
            item, handle = pending.popleft()
            try:
                outcome = self.device.wait(handle, self.job_timeout_s)
            except CalculetError as exc:
                if exc.code == "wait_timeout":   # hung: fence the worker off (fails the jobs queued behind it)
                    self.device.fence()
                    exc = DeviceError("job_timeout", f"a {item.kind} job ran past the job timeout of "
                                      f"{self.job_timeout_s:g} s (--job-timeout); the stuck device worker was replaced")
                broken = broken or isinstance(exc, DeviceError) or not self.device.healthy
                outcome = exc
            yield item, outcome
