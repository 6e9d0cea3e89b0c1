"""Layer probes: which module of a compiled model first departs from the reference?

A calbin compiled with `--probes` outputs, besides `hidden`, every module's result as
`probe:<module>` (embedding, each norm, q/k norms, attention, MLP, each layer's residual sum, the
final norm), in execution order. The prompt runs once through a prefill graph; the reference model
runs the same ids with a forward hook on each of those modules. Per module:

    relative error = ||ours - reference|| / ||reference||      (over the prompt's real tokens)

The first module whose relative error exceeds `threshold` and is at least `jump` times the largest
error of every module before it is named: errors that grow slowly through a quantized stack do not
trigger it, a broken weight or kernel does, at the module that holds it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from calculet.calbin.first_chunk import first_chunk_feeds, probe_rows
from calculet.calbin.graphspec import PROBE_PREFIX
from calculet.errors import ModelError, RequestError


@dataclass(frozen=True)
class ModuleError:
    module: str
    rel_error: float
    max_abs: float


@dataclass(frozen=True)
class ProbeReport:
    calbin: str
    graph: str
    prompt_length: int
    threshold: float
    jump: float
    modules: tuple[ModuleError, ...]   # execution order
    first_bad: str | None

    def to_dict(self) -> dict:
        doc = asdict(self)
        for m in doc["modules"]:
            for k in ("rel_error", "max_abs"):
                m[k] = m[k] if math.isfinite(m[k]) else None
        return doc

    def render(self) -> str:
        lines = [f"probe: {self.calbin}, graph {self.graph}, {self.prompt_length}-token prompt "
                 f"(named: relative error > {self.threshold} and >= {self.jump}x every error before it)",
                 f"  {'module':48} {'rel error':>10} {'max abs':>10}"]
        for m in self.modules:
            mark = "  <-- first bad module" if m.module == self.first_bad else ""
            lines.append(f"  {m.module:48} {m.rel_error:>10.3g} {m.max_abs:>10.3g}{mark}")
        lines.append(f"first bad module: {self.first_bad}" if self.first_bad else "no module's error jumps")
        return "\n".join(lines)


def first_jump(errors: list[float], threshold: float, jump: float) -> int | None:
    """Index of the first error > threshold and >= jump x the largest before it (NaN counts as inf)."""
    worst = 0.0
    for i, e in enumerate(errors):
        e = math.inf if math.isnan(e) else e
        if e > threshold and e >= jump * worst:
            return i
        worst = max(worst, e)
    return None


def _prefill_graph(program, n: int):
    fitting = [g for g in program.prefill_graphs if g.tokens >= n]
    if not fitting:
        raise RequestError("bad_option", f"a {n}-token probe prompt fits no prefill graph (largest "
                           f"{program.prefill_graphs[-1].tokens}); use --probe-tokens <= {program.prefill_graphs[-1].tokens}")
    graph = fitting[0]
    names = [t.name for t in graph.outputs if t.name.startswith(PROBE_PREFIX)]
    if not names:
        raise ModelError("no_probes", f"{program.path}: graph {graph.name} has no probe outputs; "
                         "compile a debug build with `calculet compile ... --probes`")
    return graph, names


def calbin_module_outputs(calbin, ids: list[int], threads: int = 0) -> tuple[str, dict[str, np.ndarray]]:
    """(graph name, {module: float32 [n, width]}) from one run of the smallest prefill graph that
    holds the prompt, on fresh (zero) KV buffers; modules in execution order."""
    from calculet.runtime.program import DeviceConfig, Program

    program = Program(calbin)
    graph, names = _prefill_graph(program, len(ids))
    program.graphs = [graph]  # open this one session only
    program.open_sessions(DeviceConfig(threads=threads))
    values = program.sessions[graph.name].run(names, first_chunk_feeds(graph, ids))
    return graph.name, probe_rows(graph, names, values, len(ids))


def compare_modules(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> list[ModuleError]:
    errors = []
    for module, a in ours.items():
        b = ref[module]
        if b.shape[0] != a.shape[0]:  # the final norm: our last token against the reference's
            b = b[-a.shape[0]:]
        if a.shape != b.shape:
            raise ModelError("probe_shape", f"module {module}: ours {list(a.shape)}, reference {list(b.shape)}")
        diff = a.astype(np.float64) - b
        norm = float(np.linalg.norm(b))
        rel = float(np.linalg.norm(diff)) / norm if norm > 0 else float(np.linalg.norm(diff))
        errors.append(ModuleError(module, rel, float(np.abs(diff).max())))
    return errors


def probe_calbin(calbin, source, ids: list[int], threshold: float = 0.05, jump: float = 4.0,
                 threads: int = 0) -> ProbeReport:
    """Run the probes of `calbin` and the reference model of `source` (a SourceModel) on `ids`."""
    from calculet.reference.hf import build_reference_model, reference_module_outputs

    if threshold < 0 or jump < 1:
        raise RequestError("bad_option", f"--probe-threshold must be >= 0 and --probe-jump >= 1, got {threshold}, {jump}")
    graph, ours = calbin_module_outputs(calbin, ids, threads)
    ref = reference_module_outputs(build_reference_model(source), ids, list(ours))
    modules = compare_modules(ours, ref)
    bad = first_jump([m.rel_error for m in modules], threshold, jump)
    return ProbeReport(str(calbin), graph, len(ids), threshold, jump, tuple(modules),
                       modules[bad].module if bad is not None else None)
