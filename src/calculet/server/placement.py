"""Placement: which chips a served model runs on, and whether it fits there.

A chip is the runtime's `ChipConfig` (runtime/chips.py): an execution slot with its provider, its
intra-op thread share and its memory budget. The server builds its chips once from the flags
(`server_chips`) and every model's Device opens its sessions on the chips it is placed on, so two
models never share a session or a worker, and the models on one chip share its memory budget. A
partitioned calbin (`compile --chips N --partition tp|pp|ep`) runs on N chips, one share on each.

    chips = server_chips(2, threads=0, chip_memory=None)    # ChipConfig(0), ChipConfig(1)
    placement = Placement(chips)
    on = placement.place("gemma", None, program.chip_count)  # the ChipConfigs it runs on (None: 0..n-1)
    r = placement.reserve("gemma", on, program.chip_plans()) # raises model_does_not_fit
    device = Device(chips=on)
    ...
    placement.release(r)                  # on unload, or when loading fails after reserving

Memory per model and chip is that chip's memory plan (calbin/memory_plan.py): weights + KV +
staging, plus ONNX Runtime's workspace estimate, since that is memory on the chip as well.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass

from calculet.errors import ModelError, RequestError
from calculet.runtime.chips import ChipConfig


def server_chips(chips: int, threads: int, chip_memory: int | None, provider: str = "cpu",
                 provider_options: tuple = (), spinning: str = "run", hugepages: str = "collapse") -> tuple[ChipConfig, ...]:
    """The server's chips from its flags, built once. One chip and --threads 0 keep ONNX Runtime's
    default (all cores), as a single-model server always had; N chips share the cores evenly
    (runtime.chips.split_threads) unless --threads says how many each gets."""
    from calculet.runtime.chips import split_threads

    per_chip = threads if chips == 1 or threads else split_threads(chips, os.cpu_count())
    return tuple(ChipConfig(i, provider, tuple(provider_options), per_chip, chip_memory or 0, spinning, hugepages)
                 for i in range(chips))


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
    shares: tuple[int, ...]        # bytes held on each of `chips`, in the same order

    @property
    def bytes(self) -> int:
        return sum(self.shares)

    def on(self, index: int) -> int:
        return sum(b for c, b in zip(self.chips, self.shares) if c == index)


class Placement:
    """Per-chip memory accounting of the resident models (thread-safe: loads run beside serving)."""

    def __init__(self, chips: tuple[ChipConfig, ...]):
        self.chips = tuple(chips)
        self._held: dict[int, Reservation] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def chip(self, index: int) -> ChipConfig:
        if not 0 <= index < len(self.chips):
            raise RequestError("bad_option", f"chip {index} does not exist; this server has {len(self.chips)} chip(s): "
                               f"0..{len(self.chips) - 1} (--chips)")
        return self.chips[index]

    def place(self, name: str, indices: tuple[int, ...] | None, chip_count: int) -> tuple[ChipConfig, ...]:
        """The chips model `name` runs on: the ones it names, or (None) chips 0..chip_count-1; a calbin
        compiled for N chips needs exactly N."""
        if indices is None:
            if chip_count > len(self.chips):
                raise RequestError("bad_option", f"model {name!r} was compiled for {chip_count} chips, but this server has "
                                   f"{len(self.chips)}; start it with --chips {chip_count} (or more)")
            indices = tuple(range(chip_count))
        chips = tuple(self.chip(i) for i in indices)
        if len(chips) != chip_count:
            want = list(range(chip_count))
            raise RequestError("bad_option", f"model {name!r} names chips {list(indices)}, but its calbin was compiled for "
                               f"{chip_count} chip(s); name {chip_count}, e.g. chips = {want}, or recompile it with "
                               f"--chips {len(chips)}" + (" --partition tp|pp|ep" if len(chips) > 1 else ""))
        return chips

    def used(self, index: int) -> int:
        with self._lock:
            return sum(r.on(index) for r in self._held.values())

    def reserve(self, name: str, chips: tuple[ChipConfig, ...], plans: tuple) -> Reservation:
        """Hold each chip's plan (plans[k] on chips[k]), or raise model_does_not_fit with the numbers."""
        if len(plans) != len(chips):
            raise ModelError("chip_count_mismatch", f"model {name!r}: {len(plans)} chip memory plan(s) for "
                             f"{len(chips)} chip(s)")
        needs = [plan_bytes(p) for p in plans]
        with self._lock:
            for chip, need in zip(chips, needs):
                budget = chip.memory_budget_bytes
                if not budget:
                    continue
                i = chip.index
                others = [r for r in self._held.values() if i in r.chips]
                used = sum(r.on(i) for r in others)
                if used + need["total"] > budget:
                    parts = " + ".join(f"{k} {mib(v)}" for k, v in need.items() if k != "total")
                    share = f"its share on chip {i} of {len(chips)} chips" if len(chips) > 1 else "its memory plan"
                    resident = ", ".join(f"{r.name} {mib(r.on(i))}" for r in others) or "nothing"
                    raise ModelError("model_does_not_fit",
                                     f"model {name!r} does not fit chip {i}: {share} needs {parts} = "
                                     f"{mib(need['total'])}; chip {i} has a budget of {mib(budget)} (--chip-memory) with "
                                     f"{mib(used)} in use ({resident}), so {mib(max(0, budget - used))} free")
            r = Reservation(next(self._ids), name, tuple(c.index for c in chips), tuple(n["total"] for n in needs))
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
