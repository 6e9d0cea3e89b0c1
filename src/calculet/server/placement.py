"""Placement: which chip a served model runs on, and whether it fits there.

A chip is an execution slot with its own thread share and memory budget. Until the runtime has its
own chips (partitioned calbins), a chip maps onto what exists: every model placed on chip i gets its
own `Device` (its own ONNX Runtime sessions and worker thread) configured with chip i's thread share,
so two models never share a session or a worker, and the models on one chip share its memory budget.

    chips = server_chips(config)          # the one function to swap for the runtime's ChipConfig
    placement = Placement(chips)
    r = placement.reserve("gemma", (0,), manifest.memory_plan)   # raises model_does_not_fit
    device = Device(device_config(chips[0], config))
    ...
    placement.release(r)                  # on unload, or when loading fails after reserving

Memory per model is the calbin's memory plan (calbin/memory_plan.py): weights + KV + staging, plus
ONNX Runtime's workspace estimate, since that is memory on the chip as well.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass

from calculet.errors import ModelError, RequestError


@dataclass(frozen=True)
class Chip:
    index: int
    threads: int                   # intra-op threads of every session on this chip (0: ONNX Runtime's default)
    memory_budget: int | None      # bytes; None: unlimited


def server_chips(chips: int, threads: int, chip_memory: int | None) -> tuple[Chip, ...]:
    """The server's chips from its flags. One chip and --threads 0 keep ONNX Runtime's default (all
    cores), as a single-model server always had; N chips share the cores evenly unless --threads says
    how many each gets. (Swap point: build the runtime's ChipConfig list here once it exists.)"""
    if chips == 1 or threads:
        per_chip = threads
    else:
        per_chip = max(1, (os.cpu_count() or 1) // chips)
    return tuple(Chip(i, per_chip, chip_memory) for i in range(chips))


def device_config(chip: Chip, provider: str, provider_options: tuple):
    """The runtime device for one model on `chip`."""
    from calculet.runtime.program import DeviceConfig

    return DeviceConfig(provider, threads=chip.threads, provider_options=provider_options)


def plan_bytes(plan) -> dict[str, int]:
    """A memory plan's numbers as the budget counts them."""
    staging = sum(s.total_bytes for s in plan.staging)
    parts = {"weights": plan.weights_bytes, "kv": plan.kv.total_bytes, "staging": staging,
             "workspace (estimate)": plan.workspace_estimate_bytes}
    return {**parts, "total": sum(parts.values())}


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB ({n} bytes)"


@dataclass(frozen=True)
class Reservation:
    id: int
    name: str
    chips: tuple[int, ...]
    bytes: int


class Placement:
    """Per-chip memory accounting of the resident models (thread-safe: loads run beside serving)."""

    def __init__(self, chips: tuple[Chip, ...]):
        self.chips = chips
        self._held: dict[int, Reservation] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def chip(self, index: int) -> Chip:
        if not 0 <= index < len(self.chips):
            raise RequestError("bad_option", f"chip {index} does not exist; this server has {len(self.chips)} chip(s): "
                               f"0..{len(self.chips) - 1} (--chips)")
        return self.chips[index]

    def used(self, index: int) -> int:
        with self._lock:
            return sum(r.bytes for r in self._held.values() if index in r.chips)

    def reserve(self, name: str, chips: tuple[int, ...], plan) -> Reservation:
        """Hold the plan's bytes on each of `chips`, or raise model_does_not_fit with the numbers."""
        for i in chips:
            self.chip(i)
        if len(chips) != 1:
            raise RequestError("bad_option", f"model {name!r} names chips {list(chips)}, but a calbin runs on one chip "
                               "(partitioned calbins are not served yet); give one chip, e.g. chips = [0]")
        need = plan_bytes(plan)
        with self._lock:
            for i in chips:
                budget = self.chips[i].memory_budget
                if budget is None:
                    continue
                others = [r for r in self._held.values() if i in r.chips]
                used = sum(r.bytes for r in others)
                if used + need["total"] > budget:
                    parts = " + ".join(f"{k} {mib(v)}" for k, v in need.items() if k != "total")
                    resident = ", ".join(f"{r.name} {mib(r.bytes)}" for r in others) or "nothing"
                    raise ModelError("model_does_not_fit",
                                     f"model {name!r} does not fit chip {i}: its memory plan needs {parts} = "
                                     f"{mib(need['total'])}; chip {i} has a budget of {mib(budget)} (--chip-memory) with "
                                     f"{mib(used)} in use ({resident}), so {mib(max(0, budget - used))} free")
            r = Reservation(next(self._ids), name, tuple(chips), need["total"])
            self._held[r.id] = r
            return r

    def release(self, r: Reservation | None) -> None:
        if r is not None:
            with self._lock:
                self._held.pop(r.id, None)


def parse_bytes(text: str) -> int:
    """`--chip-memory`: bytes, or with a K/M/G/T suffix (powers of 1024), e.g. 512M, 2G."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    digits = t[:-1] if scale > 1 else t
    try:
        value = float(digits)
    except ValueError:
        raise RequestError("bad_option", f"--chip-memory {text!r} is not a size; give bytes or e.g. 512M, 2G") from None
    if value <= 0:
        raise RequestError("bad_option", f"--chip-memory must be > 0, got {text!r}")
    return int(value * scale)
