"""Which execution provider runs each node of a calbin's graphs: ONNX Runtime's partitioning, observed.

ONNX Runtime assigns every node (after its graph optimizations) to the first provider in the list that
claims it, and the CPU provider takes whatever is left. The Python API does not expose that
assignment, but its profiler records, for every node it runs, the node's op type and the provider that
ran it. So: open the calbin's sessions on the provider with profiling on, run every graph once (the
device's warm-up does that, on zeros), and count the profiled nodes per graph, provider and op type.
A provider that compiles subgraphs (OpenVINO) shows each compiled subgraph as one node of its own op
type (e.g. `OpenVINO-EP-subgraph_1`); the nodes left outside them are listed under the CPU provider.
This measures; it does not guess from an op list.
"""

from __future__ import annotations

import collections
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from calculet.runtime.program import DeviceConfig


@dataclass(frozen=True)
class GraphPlacement:
    graph: str
    nodes: tuple[tuple[str, str, int], ...]   # (provider, op type, nodes), sorted

    def providers(self) -> dict[str, int]:
        out: dict[str, int] = collections.Counter()
        for provider, _, n in self.nodes:
            out[provider] += n
        return dict(out)

    def on(self, provider: str) -> dict[str, int]:
        """op type -> nodes run by `provider` (an ONNX Runtime provider name)."""
        return {op: n for p, op, n in self.nodes if p == provider}


@dataclass(frozen=True)
class Placement:
    provider: str                       # calculet's name: cpu | openvino | cuda
    provider_name: str                  # ONNX Runtime's: CPUExecutionProvider, ...
    graphs: tuple[GraphPlacement, ...]

    def fallback_ops(self) -> dict[str, int]:
        """op type -> nodes the CPU provider runs although another provider was asked for (empty for cpu)."""
        if self.provider_name == "CPUExecutionProvider":
            return {}
        out: dict[str, int] = collections.Counter()
        for g in self.graphs:
            for op, n in g.on("CPUExecutionProvider").items():
                out[op] += n
        return dict(sorted(out.items()))

    def to_dict(self) -> dict:
        return {"provider": self.provider, "provider_name": self.provider_name,
                "cpu_fallback": self.fallback_ops(),
                "graphs": [{"graph": g.graph, "providers": g.providers(),
                            "nodes": [{"provider": p, "op": op, "count": n} for p, op, n in g.nodes]}
                           for g in self.graphs]}


def measure_placement(path: str | Path, config: DeviceConfig) -> Placement:
    """Open `path` on config's provider with profiling on, run each graph once, read the profiles."""
    from calculet.runtime.device import Device
    from calculet.runtime.providers import PROVIDERS

    with tempfile.TemporaryDirectory(prefix="calculet-placement-") as tmp:
        device = Device(DeviceConfig(config.provider, config.threads, config.provider_options, profile_dir=tmp))
        try:
            device.configure(device.load(path))   # the warm-up runs every graph once
            graphs = []
            for name, session in sorted(device.program.sessions.items()):
                graphs.append(GraphPlacement(name, _count(Path(session.end_profiling()))))
        finally:
            device.close()
    return Placement(config.provider, PROVIDERS[config.provider], tuple(graphs))


def _count(profile: Path) -> tuple[tuple[str, str, int], ...]:
    """(provider, op type, count) over the distinct nodes of one session's profile."""
    seen: dict[str, tuple[str, str]] = {}
    for event in json.loads(profile.read_text()):
        args = event.get("args") or {}
        name = event.get("name", "")
        if event.get("cat") == "Node" and name.endswith("_kernel_time") and "provider" in args:
            seen[name[: -len("_kernel_time")]] = (args["provider"], args.get("op_name", "?"))
    counts = collections.Counter(seen.values())
    return tuple(sorted((p, op, n) for (p, op), n in counts.items()))


def render_placement(p: Placement) -> str:
    """A few lines: per graph, nodes per provider; then the ops that fall back to the CPU."""
    lines = [f"placement on {p.provider} ({p.provider_name}), measured with ONNX Runtime's profiler:"]
    for g in p.graphs:
        parts = []
        for provider, n in sorted(g.providers().items()):
            subgraphs = sum(c for op, c in g.on(provider).items() if "-EP-subgraph" in op)
            what = f"{subgraphs} compiled subgraph(s)" if subgraphs == n and subgraphs else f"{n} nodes"
            parts.append(f"{provider.removesuffix('ExecutionProvider')}: {what}")
        lines.append(f"  {g.graph:<14} {', '.join(parts)}")
    if p.provider_name != "CPUExecutionProvider":
        fallback = p.fallback_ops()
        lines.append("  falls back to the CPU: " + (", ".join(f"{op} x{n}" for op, n in fallback.items()) if fallback
                                                   else "nothing (every node runs on the provider)"))
    return "\n".join(lines)
