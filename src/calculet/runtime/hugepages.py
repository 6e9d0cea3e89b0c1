"""Back the process's resident weight memory with 2 MiB transparent huge pages (Linux).

A decode step streams every weight once, so its time is memory reads, and on 4 KiB pages each
4 KiB of weights is a TLB entry: the ~850 MB the default model's sessions hold (prepacked weights,
ONNX Runtime's arenas) span ~210,000 pages, far past any TLB. ONNX Runtime allocates with malloc,
and on a kernel whose THP mode is `madvise` (the common default) malloc'd memory stays on 4 KiB
pages. Once the sessions are open and warm, `collapse()` asks the kernel to rebuild every large
anonymous mapping that is (nearly) all resident on huge pages, `madvise(MADV_COLLAPSE)` (Linux 6.1+;
it works whatever the THP mode, except `never`), after `MADV_HUGEPAGE`, so the range stays eligible.

Measured (benchmarks/RESULTS.md, 2026-12-05 (4)): 1-lane decode steps ~9 % faster on an Intel Xeon
with AMX (~6 % on its AVX2-only kernels), 8-lane steps and prefill unchanged there (8-lane 3 % faster
on the AVX2 kernels); served, 1 stream 1.04x; peak RSS unchanged. Only mappings at least
`MIN_RESIDENT` resident are touched, so a KV buffer that is mostly unwritten (a long context's
lanes) is not filled in: collapsing adds at most the missing tenth of a mapping it takes.

One job: pick the ranges from /proc/self/smaps and advise them. Best effort: an unsupported kernel,
a non-Linux OS or a failed call gives a report that says so, never an error (the pages are only a
speed-up). DeviceConfig.hugepages = "off" (`serve --hugepages off`) skips it.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
from dataclasses import dataclass

HUGE_PAGE = 2 << 20
MIN_RESIDENT = 0.9          # a mapping must be this resident (Rss / size) to be collapsed
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25
MODES = ("collapse", "off")  # DeviceConfig.hugepages
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ (\d+)\s*(.*)$")


@dataclass(frozen=True)
class Range:
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class HugePageReport:
    ranges: int = 0            # ranges advised
    collapsed_bytes: int = 0   # bytes now on huge pages (ranges whose collapse succeeded)
    seconds: float = 0.0
    skipped: str = ""          # why nothing was done, or why part failed ("" when all went through)

    def line(self) -> str:
        """One log line: what moved and how long it took, or why nothing did."""
        if not self.ranges:
            return f"huge pages: {self.skipped or 'no large resident mapping left on 4 KiB pages'}"
        done = f"{self.collapsed_bytes / 2**20:.0f} MiB of weights and buffers on 2 MiB pages ({self.seconds:.1f} s)"
        return done + (f"; {self.skipped}" if self.skipped else "")


def resident_ranges(smaps: str, min_bytes: int = HUGE_PAGE, min_resident: float = MIN_RESIDENT) -> list[Range]:
    """The 2 MiB-aligned parts of every private, writable, anonymous mapping (the heap included) of at
    least `min_bytes` whose resident share is at least `min_resident` and that is not already mostly on
    huge pages (a second device's load redoes only its own), from /proc/PID/smaps text."""
    out, current = [], None
    for line in smaps.splitlines():
        header = _HEADER.match(line)
        if header:
            start, end, perms, inode, name = int(header[1], 16), int(header[2], 16), header[3], int(header[4]), header[5]
            anonymous = inode == 0 and name in ("", "[heap]") and perms[:2] == "rw" and perms[3] == "p"
            current = {"start": start, "end": end, "Rss": 0, "AnonHugePages": 0} if anonymous and end - start >= min_bytes else None
            if current is not None:
                out.append(current)
        elif current is not None and line.startswith(("Rss:", "AnonHugePages:")):
            key, value = line.split()[:2]
            current[key[:-1]] = int(value) * 1024
    ranges = []
    for m in out:
        first, last = -(-m["start"] // HUGE_PAGE) * HUGE_PAGE, m["end"] // HUGE_PAGE * HUGE_PAGE
        resident, huge = m["Rss"], m["AnonHugePages"]
        if last > first and resident >= min_resident * (m["end"] - m["start"]) and huge < min_resident * resident:
            ranges.append(Range(first, last))
    return ranges


def collapse(min_bytes: int = HUGE_PAGE) -> HugePageReport:
    """Advise and collapse this process's resident anonymous mappings onto huge pages (best effort)."""
    if not sys.platform.startswith("linux"):
        return HugePageReport(skipped=f"not on Linux ({sys.platform}): nothing done")
    if kernel_version() < (6, 1):
        return HugePageReport(skipped=f"this kernel ({os.uname().release}) has no MADV_COLLAPSE (Linux 6.1+): nothing done")
    mode = thp_mode()
    if mode == "never":
        return HugePageReport(skipped="the kernel's transparent huge pages are off "
                                      "(/sys/kernel/mm/transparent_hugepage/enabled: never)")
    t0 = time.perf_counter()
    try:
        with open("/proc/self/smaps") as f:
            ranges = resident_ranges(f.read(), min_bytes)
    except OSError as exc:
        return HugePageReport(skipped=f"cannot read /proc/self/smaps: {exc}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done, failed = 0, {}
    for r in ranges:
        libc.madvise(r.start, r.size, MADV_HUGEPAGE)
        if libc.madvise(r.start, r.size, MADV_COLLAPSE) == 0:
            done += r.size
        else:   # e.g. EINVAL for a mapping the kernel deems not THP-eligible: the others still go
            code = ctypes.get_errno()
            failed[code] = failed.get(code, 0) + 1
    why = "; ".join(f"{n} range(s) not collapsed: {os.strerror(code)}" for code, n in failed.items())
    return HugePageReport(len(ranges), done, time.perf_counter() - t0, why)


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of a Linux release string such as "6.18.44-fc" (this kernel's by default)."""
    found = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def thp_mode() -> str:
    """The kernel's THP mode (always, madvise, never), "unknown" where the file is absent."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            chosen = re.search(r"\[(\w+)\]", f.read())
    except OSError:
        return "unknown"
    return chosen[1] if chosen else "unknown"
