"""runtime/hugepages.py: which mappings are moved onto 2 MiB pages (anonymous, private, writable, large,
mostly resident, not already huge), the real MADV_COLLAPSE on this kernel, and DeviceConfig.hugepages
reaching the device (greedy tokens unchanged, an unknown mode refused with the allowed ones)."""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re

import pytest

from calculet.errors import ModelError
from calculet.runtime.device import Device
from calculet.runtime.hugepages import HUGE_PAGE, HugePageReport, Range, collapse, kernel_version, resident_ranges, thp_mode
from calculet.runtime.program import DeviceConfig
from tests.runtime.test_device import _prompts, greedy_together

MiB = 1 << 20
# MADV_COLLAPSE's answers when memory is too fragmented to hand out a huge page (not this code's fault)
_NO_FREE_HUGE_PAGE = (os.strerror(errno.EAGAIN), os.strerror(errno.ENOMEM))


def _mapping(start: int, size: int, rss: int, perms: str = "rw-p", inode: int = 0, name: str = "", huge: int = 0) -> str:
    return (f"{start:x}-{start + size:x} {perms} 00000000 00:00 {inode} {name}\n"
            f"Size: {size // 1024} kB\nRss: {rss // 1024} kB\nAnonHugePages: {huge // 1024} kB\n")


def test_resident_ranges_picks_large_resident_anonymous_private_mappings():
    base = 0x7F0000000000
    smaps = "".join([
        _mapping(base + 4096, 16 * MiB, 16 * MiB),                              # taken, cut to 2 MiB bounds
        _mapping(base + 64 * MiB, 16 * MiB, 8 * MiB),                           # half resident: a sparse KV buffer
        _mapping(base + 128 * MiB, 16 * MiB, 16 * MiB, inode=42, name="/x.bin"),  # file-backed
        _mapping(base + 192 * MiB, 16 * MiB, 16 * MiB, perms="rw-s"),           # shared
        _mapping(base + 256 * MiB, 16 * MiB, 16 * MiB, perms="r--p"),           # read-only
        _mapping(base + 320 * MiB, 1 * MiB, 1 * MiB),                           # under 2 MiB
        _mapping(base + 384 * MiB, 8 * MiB, 8 * MiB, name="[heap]"),            # the heap: taken
        _mapping(base + 448 * MiB, 8 * MiB, 8 * MiB, huge=8 * MiB),             # already huge
        _mapping(base + 512 * MiB, 8 * MiB, 8 * MiB, name="[stack]"),           # not anonymous heap memory
    ])
    assert resident_ranges(smaps) == [Range(base + HUGE_PAGE, base + 16 * MiB),
                                      Range(base + 384 * MiB, base + 392 * MiB)]
    assert resident_ranges(smaps, min_resident=0.5)[1] == Range(base + 64 * MiB, base + 80 * MiB)


def test_report_lines_say_what_moved_or_why_not():
    assert HugePageReport(2, 64 * MiB, 0.25).line() == "64 MiB of weights and buffers on 2 MiB pages (0.2 s)"
    assert HugePageReport(2, 32 * MiB, 0.25, "1 range(s) not collapsed: Invalid argument").line().endswith(
        "; 1 range(s) not collapsed: Invalid argument")
    assert HugePageReport().line() == "huge pages: no large resident mapping left on 4 KiB pages"
    assert HugePageReport(skipped="not on Linux (darwin): nothing done").line() == "huge pages: not on Linux (darwin): nothing done"


def test_kernel_version_parses_release_strings():
    assert kernel_version("6.18.44-fc-v1252") == (6, 18)
    assert kernel_version("5.15.0-91-generic") == (5, 15)
    assert kernel_version("weird") == (0, 0)


def _anon_huge_bytes(address: int) -> int:
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if m and int(m[1], 16) <= address < int(m[2], 16):
            for entry in lines[i + 1:]:
                if entry.startswith("AnonHugePages:"):
                    return int(entry.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(kernel_version() < (6, 1) or thp_mode() == "never", reason="needs MADV_COLLAPSE and THP not off")
def test_collapse_moves_a_resident_buffer_onto_huge_pages():
    buf = mmap.mmap(-1, 32 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)   # as malloc maps large blocks
    try:
        buf.write(b"\x01" * len(buf))              # resident, on 4 KiB pages
        view = ctypes.c_char.from_buffer(buf)
        middle = ctypes.addressof(view) + 16 * MiB   # MADV_HUGEPAGE splits off the unaligned ends as mappings of their own
        del view
        assert _anon_huge_bytes(middle) == 0
        report = collapse()
        if _anon_huge_bytes(middle) == 0 and any(why in report.skipped for why in _NO_FREE_HUGE_PAGE):
            pytest.skip(f"the kernel found no free 2 MiB page: {report.skipped}")
        assert report.ranges >= 1 and report.collapsed_bytes >= 16 * MiB, report
        assert _anon_huge_bytes(middle) >= 16 * MiB  # at least the 2 MiB-aligned middle of the 32 MiB
        buf.seek(0)
        assert buf.read(4096) == b"\x01" * 4096     # the contents survive the move
        assert collapse().collapsed_bytes < report.collapsed_bytes   # already huge: not redone
    finally:
        buf.close()


def test_device_hugepages_mode_reaches_the_device_and_keeps_the_tokens(tiny_calbin):
    with pytest.raises(ModelError) as e:
        DeviceConfig(hugepages="always")
    assert e.value.code == "bad_option" and "collapse, off" in str(e.value)
    path, tokens = tiny_calbin("qwen3", lanes=4), {}
    for mode in ("off", "collapse"):
        d = Device(DeviceConfig(threads=2, hugepages=mode))
        d.configure(d.load(path))
        try:
            if mode == "off":
                assert d.hugepages is None
            else:
                assert d.hugepages is not None and d.hugepages.line()
            tokens[mode] = greedy_together(d, _prompts(), 12)
        finally:
            d.close()
    assert tokens["off"] == tokens["collapse"]
