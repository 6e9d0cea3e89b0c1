"""benchmarks/stall_probe.py: decode steps are the gaps between consecutive decode completions only; a
window's machine figures are the differences of the samples around it; the sampler reads this machine."""

from __future__ import annotations

import os
import sys
from argparse import Namespace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import stall_probe  # noqa: E402


def _job(t, kind, infer=0.03):
    return (t, kind, f"{kind}_8", 0.001, 0.0001, infer, 0.0002)


def test_decode_steps_skip_gaps_with_a_prefill_between():
    jobs = [_job(1.00, "decode"), _job(1.04, "decode"), _job(1.20, "prefill"), _job(1.25, "decode"),
            _job(1.29, "decode"), _job(1.45, "decode", infer=0.15)]
    steps = stall_probe.decode_steps(jobs)
    assert [(round(s.t0, 2), round(s.t1, 2)) for s in steps] == [(1.00, 1.04), (1.25, 1.29), (1.29, 1.45)]
    assert steps[-1].infer == 0.15 and steps[-1].wall == pytest.approx(0.16)


def _sample(t, steal, idle, wait_ns, faults):
    return {"t": t, "cpus": {"cpu0": [0, 0, 0, idle, 0, 0, 0, steal], "cpu1": [0, 0, 0, idle, 0, 0, 0, 0]},
            "vm": {"pgfault": faults}, "threads": {"7:python": [0, wait_ns, 0]}}


def test_machine_delta_is_the_difference_of_the_samples_around_the_window():
    samples = [_sample(0.0, 5, 10, 0, 100), _sample(0.1, 5, 10, 0, 100), _sample(0.2, 12, 11, 4_000_000, 160),
               _sample(0.3, 12, 11, 4_000_000, 160)]
    d = stall_probe.machine_delta(samples, 0.12, 0.19)      # between 0.1 and 0.2
    assert d["span_ms"] == pytest.approx(100.0)
    assert d["cpu_ms"]["steal"] == pytest.approx(70.0)      # 7 ticks of 10 ms
    assert d["cpu_ms"]["idle"] == pytest.approx(20.0)       # one tick on each CPU
    assert d["vm"]["pgfault"] == 60 and d["wait_ms"]["7:python"] == pytest.approx(4.0)
    assert stall_probe.machine_delta(samples, 0.25, 0.5) is None   # past the last sample


def test_report_lists_a_slow_step_with_its_window():
    jobs = [_job(0.04 * i, "decode") for i in range(50)] + [_job(0.04 * 49 + 0.2, "decode", infer=0.19)]
    trace = stall_probe.Trace(jobs=jobs, gcs=[(1.97, 2.0, 2, 0)])
    samples = [_sample(0.0, 0, 0, 0, 0), _sample(1.9, 0, 0, 0, 0), _sample(2.3, 15, 0, 9_000_000, 0)]
    args = Namespace(streams=8, prompt_tokens=200, output_tokens=128, duration=2.0, slow_factor=2.0)
    text = stall_probe.report(trace, samples, args, 1, "# header")
    slow = [line for line in text.splitlines() if line.startswith("- ")]
    assert len(slow) == 1 and "200.0 ms" in slow[0] and "infer 190.0" in slow[0]
    assert "steal 150 ms" in slow[0] and "GC gen 2 30.0 ms" in slow[0] and "python 9.0 ms" in slow[0]


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="needs Linux's /proc")
def test_the_sampler_reads_this_machine():
    cpus, vm, threads = stall_probe._read_cpus(), stall_probe._read_vmstat(), stall_probe._read_threads(os.getpid())
    assert cpus and all(len(v) == 8 for v in cpus.values())
    assert "pgfault" in vm
    assert any(k.startswith(f"{os.getpid()}:") for k in threads)   # the main thread's tid is the pid
