"""`inspect_calbin(path) -> InspectReport`: what a calbin holds, without running it.

    manifest summary ─ graphs (inputs, outputs, op inventory, shape families) ─ memory plan table ─ quantization per module

`inspect` reads a calbin it trusts enough to parse (a manifest that does not parse is a `ModelError`);
it does not judge it: that is `validate`. A graph file that cannot be read shows its error instead
of an op inventory.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from calculet.calbin import inspect_moe
from calculet.calbin.gates import ops
from calculet.calbin.gates.context import inside
from calculet.calbin.graphspec import GraphSpec
from calculet.calbin.manifest import Manifest, TensorFormat, read_manifest
from calculet.calbin.memory_plan import MemoryPlan
from calculet.errors import ModelError


@dataclass(frozen=True)
class GraphSummary:
    """A graph's declared signature (the manifest's GraphSpec) with what its .onnx file holds."""
    graph: GraphSpec
    ops: ops.OpInventory | None       # None when the file cannot be read (see error)
    error: str | None = None

    def to_json(self) -> dict:
        return {**self.graph.to_json(), "ops": self.ops.to_json() if self.ops else None, "error": self.error}


@dataclass(frozen=True)
class QuantGroup:
    pattern: str        # tensor name with layer indices folded: model.layers.*.mlp.up_proj.weight
    module: str         # module class (attention, mlp, embedding, lm_head, norm, other) when the calbin says
    format: str         # "int8 b32 (int8 compute)", "fp32", "fp16"
    tensors: int
    bytes: int          # stored bytes (codes + scales for a quantized weight)


@dataclass(frozen=True)
class QuantSummary:
    policy: str
    table: dict[str, str]               # module class -> format label, as the policy states it
    groups: tuple[QuantGroup, ...]
    tensors: dict[str, TensorFormat]    # every weight -> its stored format

    def to_json(self) -> dict:
        return {"policy": self.policy, "table": self.table, "tensors": {k: v.to_json() for k, v in self.tensors.items()},
                "groups": [{"pattern": g.pattern, "module": g.module, "format": g.format, "tensors": g.tensors,
                            "bytes": g.bytes} for g in self.groups]}


@dataclass(frozen=True)
class InspectReport:
    path: str
    summary: dict                       # the manifest facts, flattened for reading (see _summary)
    graphs: tuple[GraphSummary, ...]
    memory: MemoryPlan
    quantization: QuantSummary

    def to_json(self) -> dict:
        return {"path": self.path, "summary": self.summary, "graphs": [g.to_json() for g in self.graphs],
                "memory_plan": self.memory.to_json(), "quantization": self.quantization.to_json()}

    def to_json_text(self) -> str:
        return json.dumps(self.to_json(), indent=1)


def inspect_calbin(path: str | Path) -> InspectReport:
    folder = Path(path)
    m = read_manifest(folder)
    try:
        return InspectReport(str(folder), _summary(folder, m), _graphs(folder, m), m.memory_plan, _quant(m))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelError("manifest_bad_field", f"{folder}: the manifest is malformed ({type(exc).__name__}: {exc}); "
                         f"`calculet validate {folder}` says where") from None


def _summary(folder: Path, m: Manifest) -> dict:
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
            "sliding_window", "max_position_embeddings", "tie_word_embeddings")
    return {
        "schema_version": m.schema_version,
        "target": m.target,
        "model": {"family": m.model.family, "model_type": m.model.model_type,
                  **{k: getattr(m.spec, k) for k in keys}, "source": asdict(m.model.source)},
        "profile": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(m.profile).items()},
        "kv": {"layout": m.kv.layout, "dtype": m.kv.dtype, "lanes": m.kv.lanes, "context": m.kv.context,
               "ring": m.kv.ring, "ring_layers": list(m.kv.ring_layers), "layers": m.kv.num_layers,
               "layer_lengths": list(m.kv.layer_lengths), "in_place": m.kv.in_place,
               "bytes_per_lane": m.kv.bytes_per_lane, "total_bytes": m.kv.total_bytes},
        "tokenizer": {"file": m.tokenizer.file, "vocab_size": m.tokenizer.vocab_size, "bos_token_id": m.tokenizer.bos_token_id,
                      "eos_token_ids": list(m.tokenizer.eos_token_ids), "pad_token_id": m.tokenizer.pad_token_id,
                      "add_bos_token": m.tokenizer.add_bos_token, "chat_template": m.tokenizer.chat_template is not None},
        "weights": {"file": m.weights.file, "bytes": m.weights.bytes, "tensors": len(m.weights.tensors)},
        "files": {"count": len(m.files), "bytes": sum(f.bytes for f in m.files.values())},
        "golden": None if m.golden is None else asdict(m.golden),
        "toolchain": asdict(m.toolchain),
        "isa": None if m.isa is None else m.isa.to_json(),
        "passes": list(m.passes),
        "moe": inspect_moe.moe_facts(m.model.hyperparameters, m.weights, m.quantization),
        "partition": _partition(m),
    }


def _graphs(folder: Path, m: Manifest) -> tuple[GraphSummary, ...]:
    """Every graph file: a partitioned calbin's are its chips', named chip<c>/<graph>."""
    if m.partition is None:
        return tuple(_graph(folder, g) for g in m.graphs)
    out = []
    for chip in m.partition.chips:
        sub = folder / chip.folder
        for g in read_manifest(sub).graphs:
            summary = _graph(sub, g)
            out.append(GraphSummary(replace(g, name=f"chip{chip.index}/{g.name}"), summary.ops, summary.error))
    return tuple(out)


def _partition(m: Manifest) -> dict | None:
    """Per chip what it holds, and the bytes each body graph's collectives move per call."""
    part = m.partition
    if part is None:
        return None
    return {"scheme": part.scheme, "head_chip": part.head_chip, "note": part.note,
            "chips": [c.to_json() for c in part.chips], "replicated": len(part.replicated), "sharded": len(part.sharded),
            "collectives": {s.graph: {"count": len(s.collectives), "link_bytes": s.link_bytes,
                                      "kinds": sorted({c.kind for c in s.collectives})} for s in part.schedules}}


def _graph(folder: Path, g: GraphSpec) -> GraphSummary:
    import onnx

    inventory, error = None, None
    if not inside(folder, g.file):
        return GraphSummary(g, None, f"{g.file}: the path leaves the calbin folder")
    try:
        model = onnx.load(str(folder / g.file), load_external_data=False)
    except Exception as exc:  # a missing or corrupt file: show why instead of an inventory
        error = f"{g.file}: cannot be read ({type(exc).__name__}: {exc})"
    else:
        try:
            inferred = ops.infer(ops.checker_copy(model))
        except Exception:  # shape families then use the declared shapes only
            inferred = None
        inventory = ops.op_inventory(model, g.name, ops.known_shapes(model, inferred))
    return GraphSummary(g, inventory, error)


_LAYER_INDEX = re.compile(r"\.\d+(?=\.|$)")


def _quant(m: Manifest) -> QuantSummary:
    q = m.quantization
    sizes = {t.name: t.nbytes for t in m.weights.tensors}
    groups: dict[tuple[str, str, str], list[int]] = {}
    for name, fmt in q.tensors.items():
        acc = groups.setdefault((_LAYER_INDEX.sub(".*", name), fmt.module, fmt.label), [0, 0])
        acc[0] += 1
        acc[1] += sizes.get(name, 0) + sizes.get(f"{name}.qcodes", 0) + sizes.get(f"{name}.qscales", 0)
    return QuantSummary(
        policy=q.policy,
        table={k: v.label for k, v in q.table.items()},
        groups=tuple(QuantGroup(p, mod, f, n, b) for (p, mod, f), (n, b) in groups.items()),
        tensors=dict(q.tensors),
    )
