"""benchmarks/vs_llamacpp/machine_load.py: the steal and busy shares of a measured run, and the CPU time
another (supposedly idle) server process took meanwhile."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "vs_llamacpp"))
from machine_load import Sample, loads_markdown, process_seconds, sample, since  # noqa: E402


def test_shares_come_from_the_cpu_line_deltas():
    #                 user nice system idle iowait irq softirq steal
    before = Sample((100, 0, 50, 1000, 10, 0, 0, 5), {"main/llama.cpp": 1.0, "main/calculet": 2.0})
    after = Sample((160, 0, 70, 1100, 10, 0, 0, 25), {"main/llama.cpp": 1.5, "main/calculet": 9.0})
    load = since(before, after, "main/calculet")
    assert load.steal == pytest.approx(20 / 200)
    assert load.busy == pytest.approx(80 / 200)
    assert load.others_s == {"main/llama.cpp": 0.5}   # the measured server is not an "other"
    assert "steal 10.0%" in load.line() and "main/llama.cpp 0.50 s" in load.line()


def test_unreadable_figures_read_none():
    load = since(Sample(None, {"a": None, "b": 1.0}), Sample(None, {"a": None, "b": 2.0}), "b")
    assert load.steal is None and load.busy is None and load.others_s == {"a": None}
    assert process_seconds(2 ** 22 + 12345) is None        # no such process
    assert "–" in loads_markdown([(1, "streams", load)])


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_busy_process_shows_its_cpu_time():
    burner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    try:
        time.sleep(0.1)
        before = sample({"burner": burner.pid})
        time.sleep(0.8)
        load = since(before, sample({"burner": burner.pid}), "someone else")
    finally:
        burner.wait()
    assert load.others_s["burner"] > 0.3        # it spun for most of the 0.8 s
    assert 0 <= load.steal <= 1 and 0 < load.busy <= 1
