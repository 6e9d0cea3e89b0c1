"""What else the machine did while one server was measured: CPU stolen by the hypervisor, and the CPU
time every other server process took (an idle server should take none).

    before = sample(pids)            # {label: pid} of every server that is up
    ...                              # measure one server
    load = since(before, sample(pids), measured="calculet")

Read from Linux's /proc/stat (the `steal` column: time the hypervisor ran someone else while this VM
wanted the CPU) and /proc/<pid>/stat (utime + stime of the whole process, all its threads). On a
2-core VM a round in which a tenth of the CPU was stolen is not a round of the servers' speed;
these figures let a reader tell a slow server from a busy machine. Elsewhere (no /proc) every
figure reads None.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Sample:
    cpu_ticks: tuple[int, ...] | None          # the `cpu` line of /proc/stat: user nice system idle iowait irq softirq steal
    process_s: dict[str, float | None] = field(default_factory=dict)   # label -> CPU seconds of its process so far


@dataclass(frozen=True)
class Load:
    """One measured run: shares of the machine's CPU time over its wall time, and the others' CPU."""
    measured: str
    steal: float | None                        # stolen / all CPU time, 0..1
    busy: float | None                         # not idle / all CPU time (steal excluded), 0..1
    others_s: dict[str, float | None]          # label -> CPU seconds another server took meanwhile

    def others_text(self, unit: str = " s", empty: str = "none") -> str:
        """'label 0.12 s, ...': the CPU seconds every other server took."""
        return ", ".join(f"{k} {'–' if v is None else f'{v:.2f}{unit}'}" for k, v in self.others_s.items()) or empty

    def line(self) -> str:
        return f"steal {percent(self.steal)}, busy {percent(self.busy)}, other servers' CPU: {self.others_text()}"

    def to_json(self) -> dict:
        return {"measured": self.measured, "steal": self.steal, "busy": self.busy, "others_s": self.others_s}


def percent(share: float | None) -> str:
    """A 0..1 share as '12.3%' ('–' when it could not be read)."""
    return "–" if share is None else f"{100 * share:.1f}%"


def _cpu_ticks(proc: Path) -> tuple[int, ...] | None:
    try:
        first = (proc / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    return tuple(int(x) for x in first[1:9]) if first and first[0] == "cpu" else None


def process_seconds(pid: int, proc: Path = Path("/proc")) -> float | None:
    """utime + stime of a process (all its threads), in seconds; None when it cannot be read."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()   # after "pid (comm) ": state is field 3, utime 14, stime 15
    return (int(fields[11]) + int(fields[12])) / _TICK


def sample(pids: dict[str, int], proc: Path = Path("/proc")) -> Sample:
    return Sample(_cpu_ticks(proc), {label: process_seconds(pid, proc) for label, pid in pids.items()})


def since(before: Sample, after: Sample, measured: str) -> Load:
    steal = busy = None
    if before.cpu_ticks and after.cpu_ticks:
        d = [b - a for a, b in zip(before.cpu_ticks, after.cpu_ticks)]
        total = sum(d)
        if total > 0:
            idle = d[3] + d[4]
            steal, busy = d[7] / total, (total - idle - d[7]) / total
    others = {}
    for label, t0 in before.process_s.items():
        t1 = after.process_s.get(label)
        if label != measured:
            others[label] = None if t0 is None or t1 is None else round(t1 - t0, 3)
    return Load(measured, steal, busy, others)


def loads_markdown(loads: list[tuple[int, str, Load]]) -> str:
    """The machine during each measured run, as a markdown table: a busy or stolen CPU explains a bad round."""
    lines = ["## The machine during each measured run", "",
             "steal = CPU time the hypervisor gave to other guests; busy = the rest of the non-idle time (both "
             "shares of the machine's whole CPU over the run); other servers' CPU = what the idle side took meanwhile.", "",
             "| round | scenario | measured | steal | busy | other servers' CPU s |", "|---|---|---|---|---|---|"]
    for r, name, load in loads:
        lines.append(f"| {r} | {name} | {load.measured} | {percent(load.steal)} | {percent(load.busy)} | "
                     f"{load.others_text(unit='', empty='–')} |")
    return "\n".join(lines)
