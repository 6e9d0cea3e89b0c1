"""Chips: execution slots. A chip has its own ONNX Runtime sessions, provider and options, thread
budget and memory budget; a model runs on one chip or is split over several (a partitioned calbin).

    chips = chip_configs(2)                         # ChipConfig(0), ChipConfig(1): one intra-op thread each on 2 cores
    device = open_device("model.calbin", chips)     # a 1-chip calbin on chips[0], a 2-chip one on both

The API other layers place models with (server/engine: "model A on chip 0, model B on chip 1"):
- `ChipConfig` (frozen): index, provider, provider_options, intra_op_threads, memory_budget_bytes.
- `chip_configs(n, ...)`: n configs sharing the cores (`split_threads`).
- `open_device(path, chips)` / `Device(chips=...)`: a configured Device on exactly those chips;
  two devices on different chips share no session and no worker thread.
- `ChipMemory` / `check_budget`: what a calbin will hold on each chip (weights, KV, staging, from
  its memory plan), refused with the numbers when over the chip's budget.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from calculet.calbin.manifest import Manifest
from calculet.errors import ModelError
from calculet.runtime.program import DeviceConfig
from calculet.runtime.providers import PROVIDERS

MAX_CHIPS = 64


@dataclass(frozen=True)
class ChipConfig:
    index: int = 0
    provider: str = "cpu"                              # a key of providers.PROVIDERS
    provider_options: tuple[tuple[str, str], ...] = ()
    intra_op_threads: int = 0                          # 0: ONNX Runtime's default (every core)
    memory_budget_bytes: int = 0                       # 0: no budget
    spinning: str = "run"                              # runtime.program.SPINNING
    hugepages: str = "collapse"                        # runtime.hugepages.MODES (one setting per process)

    def __post_init__(self):
        if not 0 <= self.index < MAX_CHIPS:
            raise ModelError("bad_option", f"chip index must be in 0..{MAX_CHIPS - 1}, got {self.index}")
        if self.provider not in PROVIDERS:
            raise ModelError("unsupported_provider", f"chip {self.index}: provider {self.provider!r} is not supported; "
                                                     f"supported: {', '.join(PROVIDERS)}")
        if self.intra_op_threads < 0:
            raise ModelError("bad_option", f"chip {self.index}: intra_op_threads must be >= 0, got {self.intra_op_threads}")
        if self.memory_budget_bytes < 0:
            raise ModelError("bad_option", f"chip {self.index}: memory_budget_bytes must be >= 0 (0: none), "
                                           f"got {self.memory_budget_bytes}")

    def device_config(self) -> DeviceConfig:
        return DeviceConfig(self.provider, self.intra_op_threads, self.provider_options, spinning=self.spinning,
                            hugepages=self.hugepages)


def split_threads(chips: int, cores: int | None = None) -> int:
    """Intra-op threads per chip when `chips` chips share `cores` cores (at least one each)."""
    cores = cores or os.cpu_count() or 1
    return max(1, cores // chips)


def chip_configs(n: int, provider: str = "cpu", provider_options: tuple = (), cores: int | None = None,
                 memory_budget_bytes: int = 0, first: int = 0) -> tuple[ChipConfig, ...]:
    """n chips (indices first..first+n-1) sharing `cores` cores: on 2 cores and 2 chips, one thread each."""
    if not 1 <= n <= MAX_CHIPS:
        raise ModelError("bad_option", f"chips must be in 1..{MAX_CHIPS}, got {n}")
    threads = split_threads(n, cores)
    return tuple(ChipConfig(first + i, provider, tuple(provider_options), threads, memory_budget_bytes) for i in range(n))


@dataclass(frozen=True)
class ChipMemory:
    """What one chip holds for a calbin, in bytes (its memory plan: weights mapped, KV, staging)."""
    chip: int
    weights: int
    kv: int
    staging: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.staging

    @staticmethod
    def of(chip: int, manifest: Manifest) -> "ChipMemory":
        plan = manifest.memory_plan
        return ChipMemory(chip, plan.weights_bytes, plan.kv.total_bytes, sum(s.total_bytes for s in plan.staging))


def check_budget(memory: ChipMemory, config: ChipConfig) -> None:
    """Refuse a calbin whose share does not fit the chip's budget, with the numbers."""
    budget = config.memory_budget_bytes
    if budget and memory.total > budget:
        raise ModelError("chip_memory_exceeded",
                         f"chip {config.index}: weights {memory.weights} + KV {memory.kv} + staging {memory.staging} = "
                         f"{memory.total} bytes exceed its budget of {budget} bytes; give the chip more memory, "
                         f"fewer lanes or a shorter context, or split the model over more chips (--chips)")


def open_device(path, chips: tuple[ChipConfig, ...] = (), full_hash: bool = False, faults=None):
    """A configured Device for the calbin at `path` on `chips` (default: one chip, ChipConfig(0))."""
    from calculet.runtime.device import Device

    device = Device(faults=faults, chips=tuple(chips) or (ChipConfig(0),))
    device.configure(device.load(path, full_hash=full_hash))
    return device
