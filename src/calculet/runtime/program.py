"""Program: a loaded calbin — verified manifest, memory-mapped weights, one session per graph.

The weights file is mapped once; every session receives the same buffers through
`SessionOptions.add_initializer` (no copy), so prefill and decode graphs share one copy of the
weights. ONNX Runtime's CPU kernels may "prepack" a constant weight into a private, faster layout,
which costs one extra copy per session. Decode is memory-bound and repeats every token, so its
session prepacks (measured about 1.6x faster per step on the default model); prefill sessions do
not, and read the shared mapping directly (about 1.2x slower per chunk, no extra copy). In a
quantized calbin MatMulNBits has no fast path without prepacking, so a prefill graph that holds one
prepacks too. A quantized prefill graph with float32 copies of 8-bit weights (the prefill-int8 pass
on a CPU without an int8 dot product: u8 x s8 GEMMs and down_proj as a float32 MatMul) prepacks in the
largest chunk alone, which carries most prompt tokens: there each chunk session held its own ~190 MB
of prepacked copies (the default model served 1.61 GiB peak through benchmarks/isa_view, 1.42 with
this rule), while the smaller chunks run about 1.1-1.25x slower from the mapping (a 200-token prompt,
128 + 64 + 16, 1.03x). Integer GEMMs alone prepack in every chunk: unpacked, the AMX build's 16-token
chunk (down_proj as the two-level int8 GEMM, no MatMulNBits left) took 36.5 instead of 23.5 ms, its
gate/up GEMMs 0.83 instead of 0.17 ms each, for the same ~100 MB per session the block kernels'
prepacking costs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calculet.calbin.graphspec import DECODE, HEAD, PREFILL, GraphSpec
from calculet.calbin.isa import load_warnings
from calculet.calbin.manifest import Manifest, read_manifest, verify_files
from calculet.cpu_features import detect
from calculet.errors import DeviceError, ModelError
from calculet.runtime.heap import trim_heap
from calculet.runtime.hugepages import MODES as HUGEPAGE_MODES
from calculet.runtime.kv_store import CudaKV, HostKV
from calculet.runtime.providers import PROVIDERS, check_active, choose_provider


# How ONNX Runtime's intra-op pool threads wait for the next kernel (DeviceConfig.spinning):
#   run  spin between the kernels of a run and stop spinning when it ends (force_spinning_stop): the default;
#   off  sleep whenever idle: each parallel kernel wakes its threads.
# Spinning with no stop at the end of a run took the cores from the Python thread that prepares the
# next step (decode 62 -> 84 tok/s once it was off). With the stop, on the device alone (default model,
# 2 threads, AVX2 kernels through benchmarks/isa_view, 6 alternating processes) `run` is faster: 8-lane
# decode step 48.8 -> 44.4 ms, 1-lane 16.9 -> 13.5 ms, 128-token prefill 234 -> 183 ms. Served, two
# 5-round vs_llamacpp runs one after the other first read `off` as faster, but the rounds there moved
# with the hypervisor's steal more than with the setting; alternating two servers round by round
# (benchmarks/serve_ab.py, 8 rounds, steal recorded per run) `run` was faster at 1 and 8 streams and
# took less steal: a vCPU whose threads sleep between kernels is descheduled by the host and waits
# to come back, one that spins keeps its core (benchmarks/RESULTS.md). So `run` is the default;
# `off` suits a CPU shared with other busy processes (e.g. several chips on the same cores).
SPINNING = ("run", "off")


def session_spinning(so, spinning: str) -> None:
    """Apply DeviceConfig.spinning to ONNX Runtime session options `so`."""
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning == "run" else "0")
    if spinning == "run":
        so.add_session_config_entry("session.force_spinning_stop", "1")


@dataclass(frozen=True)
class DeviceConfig:
    provider: str = "cpu"       # a key of providers.PROVIDERS
    threads: int = 0            # intra-op threads; 0 = ONNX Runtime's default (all cores)
    provider_options: tuple[tuple[str, str], ...] = ()  # (key, value) pairs for the provider
    profile_dir: str = ""       # non-empty: every session writes an ONNX Runtime profile there (placement.py)
    spinning: str = "run"       # SPINNING: how the intra-op pool threads wait between kernels
    hugepages: str = "collapse"  # runtime.hugepages.MODES: the sessions' resident memory onto 2 MiB pages, or off

    def __post_init__(self):
        if self.provider not in PROVIDERS:
            raise ModelError("unsupported_provider", f"provider {self.provider!r} is not supported; supported: {', '.join(PROVIDERS)}")
        if self.threads < 0:
            raise ModelError("bad_option", f"threads must be >= 0, got {self.threads}")
        if not all(isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in self.provider_options):
            raise ModelError("bad_option", f"provider_options must be (key, value) string pairs, got {self.provider_options!r}")
        if self.spinning not in SPINNING:
            raise ModelError("bad_option", f"spinning must be one of {', '.join(SPINNING)}, got {self.spinning!r}")
        if self.hugepages not in HUGEPAGE_MODES:
            raise ModelError("bad_option", f"hugepages must be one of {', '.join(HUGEPAGE_MODES)}, got {self.hugepages!r}")


def reads_float32_copies(path: Path) -> bool:
    """Whether an ONNX graph file reads float32 copies of 8-bit weights (compiler/prefill_int8.py's
    `<weight>.f32`, fed as initializers by name)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return any(name.endswith(".f32") for n in model.graph.node for name in n.input)


class Program:
    """A verified calbin on disk plus its sessions (created by `open_sessions`)."""

    def __init__(self, path: str | Path, full_hash: bool = False, chip_part: bool = False):
        """chip_part: one chip's sub-calbin of a partitioned calbin (runtime/partitioned.py), whose graphs
        are stages or segments of the entry points, run by name."""
        self.path = Path(path)
        self.manifest: Manifest = read_manifest(self.path)
        verify_files(self.manifest, self.path, full_hash=full_hash)
        # The compile-time ISA choice against this CPU (calbin/isa.py): logged, never fatal.
        self.isa_warnings = load_warnings(self.manifest, detect())
        for warning in self.isa_warnings:
            logging.getLogger("calculet.runtime").warning("%s: %s", self.path.name, warning)
        self.graphs = list(self.manifest.graphs)
        self.sessions: dict[str, object] = {}
        self.choice = None                    # the ProviderChoice of open_sessions
        self._weights = None
        self.load_seconds = 0.0
        if chip_part:
            return
        self.prefill_graphs = self._of(PREFILL, key=lambda g: g.tokens)
        self.decode_graphs = self._of(DECODE, key=lambda g: g.lanes)
        self.head_graphs = {g.lanes: g for g in self._of(HEAD, key=lambda g: g.lanes)}
        for g in self.decode_graphs + [self.prefill_graphs[0]]:
            if g.lanes not in self.head_graphs:
                raise ModelError("graph_not_found", f"{self.path}: no head graph for {g.lanes} rows (needed by {g.name!r})")

    def _of(self, kind: str, key) -> list[GraphSpec]:
        found = sorted((g for g in self.graphs if g.type == kind), key=key)
        if not found:
            raise ModelError("graph_not_found", f"{self.path}: the calbin has no {kind} graph")
        return found

    def graph(self, name: str) -> GraphSpec:
        for g in self.graphs:
            if g.name == name:  # exact names only
                return g
        raise ModelError("graph_not_found", f"{self.path}: no graph named {name!r}")

    def decode_graph_for(self, rows: int) -> GraphSpec:
        """The smallest decode graph covering lanes 0..rows-1."""
        return next(g for g in self.decode_graphs if g.lanes >= rows)

    @property
    def quantized(self) -> bool:
        """Quantized MatMulNBits kernels only run fast on prepacked weights, so every session prepacks."""
        return self.manifest.quantized

    @property
    def max_rewind(self) -> int | None:
        """How many positions back from a lane's current end its KV can still be reused: a lane holding
        n tokens may be cut back to any length k >= n - max_rewind and continue from there (a prefix
        cache reusing the lane's first k tokens). None: unlimited (every buffer holds the whole context).

        A sliding-window ring of R rows holds the last R positions, less one row that a decode step in
        which the lane takes no part writes (at the lane's next position, which it later overwrites).
        Continuing from k needs positions k - window + 1 .. k - 1, so k >= n - (R - window)."""
        ring = self.manifest.kv.ring
        if ring is None:
            return None
        return ring - int(self.manifest.spec.sliding_window)

    @property
    def vocab_size(self) -> int:
        return self.manifest.spec.vocab_size

    @property
    def candidates(self) -> int:
        """K of the on-graph sampling head's top-K outputs (0: the heads return full logits only)."""
        head = next(iter(self.head_graphs.values()))
        return next((t.shape[1] for t in head.outputs if t.name == "topk_ids"), 0)

    @property
    def chunk_sizes(self) -> tuple[int, ...]:
        return tuple(g.tokens for g in self.prefill_graphs)

    @property
    def chip_count(self) -> int:
        return 1

    def chip_memory(self) -> list:
        from calculet.runtime.chips import ChipMemory
        return [ChipMemory.of(0, self.manifest)]

    def chip_plans(self) -> tuple:
        """Each chip's memory plan (calbin/memory_plan.MemoryPlan), in chip order: one here."""
        return (self.manifest.memory_plan,)

    def renew_kv(self):
        """After a fence: fresh KV buffers held outside the device's Lanes (none on one chip); returns
        the old ones, which a fenced worker may still write."""
        return None

    def close(self) -> None:
        """Release what the program holds besides its sessions (nothing on one chip)."""

    def make_lanes(self):
        from calculet.runtime.lanes import Lanes
        return Lanes(self.manifest.kv, self.kv_store())

    def head_binding(self, rows: int, device: str = "cpu", device_id: int = 0):
        """`device`/`device_id`: where the lanes' KV store lives (the head's outputs are bound there)."""
        from calculet.runtime.bindings import HeadBinding
        graph = self.head_graphs[rows]
        return HeadBinding(self.sessions[graph.name], graph, device, device_id)

    def body_binding(self, name: str, lanes, first_lane: int, head):
        from calculet.runtime.bindings import BodyBinding
        return BodyBinding(self.sessions[name], self.graph(name), lanes, first_lane, head)

    def _weight_values(self):
        import onnxruntime as ort

        wfile = self.path / self.manifest.weights.file
        self._weights = np.memmap(wfile, dtype=np.uint8, mode="r")
        values = {}
        for t in self.manifest.weights.tensors:
            count = int(np.prod(t.shape)) if t.shape else 1
            array = np.frombuffer(self._weights, dtype=t.dtype, count=count, offset=t.offset).reshape(t.shape)
            values[t.name] = ort.OrtValue.ortvalue_from_numpy(array)
        return values

    def _prepacks(self, g: GraphSpec) -> bool:
        """Whether `g`'s session prepacks its constant weights (see the module docstring)."""
        if g.type != PREFILL:
            return True
        if not self.quantized:
            return False
        largest = max(x.tokens for x in self.graphs if x.type == PREFILL)
        return g.tokens == largest or not reads_float32_copies(self.path / g.file)

    def open_sessions(self, config: DeviceConfig) -> None:
        import onnxruntime as ort

        t0 = time.perf_counter()
        body_inputs = {t.name for g in self.graphs if g.type != HEAD for t in g.inputs}
        choice = self.choice = choose_provider(config.provider, config.provider_options, self.manifest.target, body_inputs)
        values = self._values = self._weight_values()  # OrtValues must outlive the sessions
        self.sessions = {}
        for g in self.graphs:
            so = ort.SessionOptions()
            so.log_severity_level = 3
            if config.threads:
                so.intra_op_num_threads = config.threads
            so.inter_op_num_threads = 1
            if config.profile_dir:
                so.enable_profiling = True
                so.profile_file_prefix = str(Path(config.profile_dir) / g.name)
            session_spinning(so, config.spinning)
            if not self._prepacks(g):
                so.add_session_config_entry("session.disable_prepacking", "1")
            for name, value in values.items():
                so.add_initializer(name, value)
            try:
                session = ort.InferenceSession(str(self.path / g.file), so, providers=list(choice.providers),
                                               provider_options=list(choice.options))
            except Exception as exc:  # onnxruntime raises its own exception types
                raise DeviceError("session_create_failed", f"cannot create a session for graph {g.name!r}: {exc}") from None
            check_active(session, choice, g.name)
            self.sessions[g.name] = session
            self._release_mapped_pages()  # after each session, so prepacking temporaries never pile up
            trim_heap()
        self.load_seconds = time.perf_counter() - t0

    def kv_store(self):
        """KVLayout -> the lanes' KV store for the chosen provider: GPU-resident for CUDA, host otherwise."""
        if self.choice is not None and self.choice.name == "cuda":
            from calculet.runtime.cudart import CudaRuntime

            device_id, cudart = int(self.choice.options[0]["device_id"]), CudaRuntime()
            return lambda layout: CudaKV(layout, device_id, cudart)
        return HostKV

    def _release_mapped_pages(self) -> None:
        """Prepacking read every weight once; hand those file pages back to the page cache. Tensors the
        kernels still read (norms, embedding rows, unpacked weights) fault back in on demand."""
        import mmap

        raw = getattr(self._weights, "_mmap", None)
        if raw is not None and hasattr(raw, "madvise"):
            raw.madvise(mmap.MADV_DONTNEED)
