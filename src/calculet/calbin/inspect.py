"""`inspect_calbin(path) -> InspectReport`: what a calbin holds, without running it.

    manifest summary ─ graphs (inputs, outputs, op inventory, shape families) ─ memory plan table ─ quantization per module

`inspect` reads a calbin it trusts enough to parse (a manifest that does not parse is a `ModelError`);
it does not judge it: that is `validate`. A graph file that cannot be read shows its error instead
of an op inventory.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from calculet.calbin import inspect_moe
from calculet.calbin.gates import ops
from calculet.calbin.gates.context import inside
from calculet.calbin.manifest import Manifest, read_manifest
from calculet.errors import ModelError


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


@dataclass(frozen=True)
class GraphSummary:
    name: str
    type: str
    file: str
    lanes: int
    tokens: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    ops: ops.OpInventory | None       # None when the file cannot be read (see error)
    error: str | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.type, "file": self.file, "lanes": self.lanes, "tokens": self.tokens,
                "inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs],
                "ops": self.ops.to_json() if self.ops else None, "error": self.error}


@dataclass(frozen=True)
class Region:
    name: str
    kind: str
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(frozen=True)
class MemorySummary:
    unit: str
    alignment: int | None
    regions: tuple[Region, ...]
    aliases: tuple[tuple[str, str], ...]     # (alias, region it shares)
    total_bytes: int
    device_memory_required_bytes: int

    def bytes_by_kind(self) -> dict[str, int]:
        out: Counter = Counter()
        for r in self.regions:
            out[r.kind] += r.size
        return dict(out)

    def to_json(self) -> dict:
        return {"unit": self.unit, "alignment": self.alignment, "total_bytes": self.total_bytes,
                "device_memory_required_bytes": self.device_memory_required_bytes, "bytes_by_kind": self.bytes_by_kind(),
                "regions": [{"name": r.name, "kind": r.kind, "offset": r.offset, "size": r.size, "end": r.end} for r in self.regions],
                "aliases": [{"name": a, "alias_of": b} for a, b in self.aliases]}


@dataclass(frozen=True)
class QuantGroup:
    pattern: str        # tensor name with layer indices folded: model.layers.*.mlp.up_proj.weight
    module: str         # module class (attention, mlp, embedding, lm_head, norm, other) when the calbin says
    format: str         # "int8 b32 (int8 compute)", "fp32", or in older calbins a dtype such as "float32"
    tensors: int
    bytes: int          # stored bytes (codes + scales for a quantized weight)


@dataclass(frozen=True)
class QuantSummary:
    policy: str
    table: dict                         # module class -> format, as the policy states it
    groups: tuple[QuantGroup, ...]
    tensors: dict[str, dict | str]      # every weight -> its format record (older calbins: its dtype)

    def to_json(self) -> dict:
        return {"policy": self.policy, "table": self.table, "tensors": self.tensors,
                "groups": [{"pattern": g.pattern, "module": g.module, "format": g.format, "tensors": g.tensors,
                            "bytes": g.bytes} for g in self.groups]}


@dataclass(frozen=True)
class InspectReport:
    path: str
    summary: dict                       # the manifest facts, flattened for reading (see _summary)
    graphs: tuple[GraphSummary, ...]
    memory: MemorySummary
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
        return InspectReport(str(folder), _summary(folder, m), tuple(_graph(folder, g) for g in m.graphs), _memory(m), _quant(m))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ModelError("manifest_bad_field", f"{folder}: the manifest is malformed ({type(exc).__name__}: {exc}); "
                         f"`calculet validate {folder}` says where") from None


def _summary(folder: Path, m: Manifest) -> dict:
    hp = m.model.get("hyperparameters", {})
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
            "sliding_window", "max_position_embeddings", "tie_word_embeddings")
    return {
        "schema_version": m.schema_version,
        "target": m.target,
        "model": {"family": m.model.get("family"), "model_type": m.model.get("model_type"),
                  **{k: hp.get(k) for k in keys}, "source": m.model.get("source")},
        "profile": {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(m.profile).items()},
        "kv": {"layout": m.kv.layout, "dtype": m.kv.dtype, "shape": list(m.kv.shape), "layers": m.kv.num_layers,
               "in_place": m.kv.in_place, "bytes_per_buffer": m.kv.bytes_per_buffer,
               "total_bytes": 2 * m.kv.num_layers * m.kv.bytes_per_buffer},
        "tokenizer": {"file": m.tokenizer.file, "vocab_size": m.tokenizer.vocab_size, "bos_token_id": m.tokenizer.bos_token_id,
                      "eos_token_ids": list(m.tokenizer.eos_token_ids), "pad_token_id": m.tokenizer.pad_token_id,
                      "add_bos_token": m.tokenizer.add_bos_token, "chat_template": m.tokenizer.chat_template is not None},
        "weights": {"file": m.weights.get("file"), "bytes": m.weights.get("bytes"), "tensors": len(m.weights.get("tensors", []))},
        "files": {"count": len(m.files), "bytes": sum(f.bytes for f in m.files.values())},
        "golden": m.golden,
        "toolchain": m.toolchain,
        "passes": list(getattr(m, "passes", [])),
        "moe": inspect_moe.moe_facts(hp, m.weights, m.quantization),
    }


def _tensors(items: list[dict]) -> tuple[TensorInfo, ...]:
    return tuple(TensorInfo(t["name"], tuple(t["shape"]), t["dtype"]) for t in items)


def _graph(folder: Path, g: dict) -> GraphSummary:
    import onnx

    inventory, error = None, None
    if not inside(folder, g["file"]):
        return GraphSummary(g["name"], g["type"], g["file"], g["lanes"], g["tokens"], _tensors(g["inputs"]),
                            _tensors(g["outputs"]), None, f"{g['file']}: the path leaves the calbin folder")
    try:
        model = onnx.load(str(folder / g["file"]), load_external_data=False)
    except Exception as exc:  # a missing or corrupt file: show why instead of an inventory
        error = f"{g['file']}: cannot be read ({type(exc).__name__}: {exc})"
    else:
        try:
            inferred = ops.infer(ops.checker_copy(model))
        except Exception:  # shape families then use the declared shapes only
            inferred = None
        inventory = ops.op_inventory(model, g["name"], ops.known_shapes(model, inferred))
    return GraphSummary(g["name"], g["type"], g["file"], g["lanes"], g["tokens"], _tensors(g["inputs"]),
                        _tensors(g["outputs"]), inventory, error)


def _memory(m: Manifest) -> MemorySummary:
    plan = m.memory_plan
    return MemorySummary(
        unit=plan.get("unit", "?"),
        alignment=plan.get("alignment"),
        regions=tuple(Region(r["name"], r["kind"], r["offset"], r["size"]) for r in plan.get("regions", [])),
        aliases=tuple((a["name"], a["alias_of"]) for a in plan.get("aliases", [])),
        total_bytes=plan.get("total_bytes", 0),
        device_memory_required_bytes=plan.get("device_memory_required_bytes", 0),
    )


_LAYER_INDEX = re.compile(r"\.\d+(?=\.|$)")


def _format(record: dict | str) -> str:
    if isinstance(record, str):
        return record
    if record.get("kind") in (None, "fp32"):
        return "fp32"
    return f"{record['kind']} b{record.get('block')} ({record.get('compute', 'fp32')} compute)"


def _quant(m: Manifest) -> QuantSummary:
    q = m.quantization
    tensors = dict(q.get("tensors", q.get("modules", {})))
    sizes = {t["name"]: t.get("nbytes", 0) for t in m.weights.get("tensors", [])}
    groups: dict[tuple[str, str, str], list[int]] = {}
    for name, record in tensors.items():
        module = record.get("module", "") if isinstance(record, dict) else ""
        acc = groups.setdefault((_LAYER_INDEX.sub(".*", name), module, _format(record)), [0, 0])
        acc[0] += 1
        acc[1] += sizes.get(name, 0) + sizes.get(f"{name}.qcodes", 0) + sizes.get(f"{name}.qscales", 0)
    return QuantSummary(
        policy=str(q.get("policy")),
        table={k: _format(v) for k, v in (q.get("table") or {}).items()},
        groups=tuple(QuantGroup(p, mod, f, n, b) for (p, mod, f), (n, b) in groups.items()),
        tensors=tensors,
    )
