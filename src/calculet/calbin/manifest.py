"""The calbin manifest: the versioned contract between compiler and runtime, as frozen types.

A calbin is a folder:

    manifest.json          a `Manifest` (everything below, plus a size and SHA-256 per file)
    tokenizer.json         Hugging Face tokenizers file
    graphs/weights.bin     every initializer once, 64-byte aligned, shared by all graphs
    graphs/<name>.onnx     one per entry point: prefill_<S>, decode_<n>, head_<n> (see graphspec.py)
    golden/golden.json     reference prompts, top-k logits and greedy tokens (when the reference extra was installed)
    chips/<c>/             --chips N: one sub-calbin per chip instead of graphs/ (see calbin/partition.py)

The compiler builds one complete `Manifest`; the runtime, the gates and `inspect` read its typed
sections. JSON is only the on-disk form: `Manifest.to_json` / `Manifest.from_json` are the one
translation, and `write_manifest` / `read_manifest` the one place that touches manifest.json and
checks the schema version. (`read_manifest_json` hands gates A and B the raw document, so that a
broken manifest is judged field by field instead of failing to parse.)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from calculet.calbin.graphspec import DTYPE_BYTES, GraphSpec
from calculet.calbin.memory_plan import MemoryPlan
from calculet.calbin.isa import IsaInfo
from calculet.calbin.partition import Partition
from calculet.calbin.provenance import Provenance
from calculet.errors import ModelError
from calculet.models.base import ModelSpec

SCHEMA_VERSION = "calculet.calbin/3"
SUPPORTED_SCHEMAS = (SCHEMA_VERSION,)
# Older schemas this reader recognises only to say how to get a current calbin.
RETIRED_SCHEMAS = {"calculet.calbin/1": "its memory plan and manifest sections changed in calculet.calbin/2",
                   "calculet.calbin/2": "its KV layout and memory plan list a buffer length per layer (sliding-window rings) since calculet.calbin/3"}
MANIFEST = "manifest.json"
TARGETS = ("cpu", "portable")   # cpu: ONNX Runtime contrib ops, KV in place; portable: standard ONNX ops only


def recompile_hint(folder: str | Path) -> str:
    return (f"recompile it from its source with `calculet compile SOURCE -o {folder}` "
            f"(the compile cache recompiles by itself: its key hashes the compiler)")


def schema_problem(version, folder: str | Path) -> str | None:
    """None when this reader reads `version`; otherwise the message that says what to do."""
    if isinstance(version, str) and version in SUPPORTED_SCHEMAS:
        return None
    if isinstance(version, str) and version in RETIRED_SCHEMAS:
        return (f"{folder}: schema_version {version!r} is from an older calculet ({RETIRED_SCHEMAS[version]}); "
                f"this calculet reads {', '.join(SUPPORTED_SCHEMAS)}: {recompile_hint(folder)}")
    return f"{folder}: schema_version {version!r} is not supported; supported: {', '.join(SUPPORTED_SCHEMAS)}"


@dataclass(frozen=True)
class Profile:
    lanes: int
    context: int
    prefill_chunks: tuple[int, ...]
    decode_lanes: tuple[int, ...]   # decode batch sizes compiled (the largest is `lanes`)

    def __post_init__(self):
        if self.lanes < 1 or self.lanes > 256:
            raise ModelError("bad_profile", f"lanes must be in 1..256, got {self.lanes}")
        if self.context < 2:
            raise ModelError("bad_profile", f"context must be >= 2, got {self.context}")
        if not self.prefill_chunks:
            raise ModelError("bad_profile", "at least one prefill chunk size is needed")
        for s in self.prefill_chunks:
            if s < 1 or s > self.context:
                raise ModelError("bad_profile", f"prefill chunk {s} must be in 1..context ({self.context})")

    @staticmethod
    def from_json(d: dict) -> "Profile":
        return Profile(d["lanes"], d["context"], tuple(d["prefill_chunks"]), tuple(d["decode_lanes"]))


@dataclass(frozen=True)
class TokenizerInfo:
    file: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    add_bos_token: bool
    chat_template: str | None

    @staticmethod
    def from_json(d: dict) -> "TokenizerInfo":
        return TokenizerInfo(**{**d, "eos_token_ids": tuple(d["eos_token_ids"])})


@dataclass(frozen=True)
class KVLayout:
    """The KV buffers: per layer one K and one V buffer [lanes, kv_heads, length, head_dim].

    A full-attention layer's buffer holds the whole context (length = context, position p at row p).
    A sliding-window layer may hold a ring instead (length = ring < context, position p at row
    p mod ring): it only ever reads the last `window` positions, so window + the largest prefill chunk
    rows are enough (a chunk's writes never reach rows its own queries still read)."""
    layout: str          # "BNSH": per layer [lanes, kv_heads, length, head_dim]
    dtype: str
    num_layers: int
    lanes: int
    kv_heads: int
    context: int         # positions a lane can hold (the full-attention layers' buffer length)
    head_dim: int
    in_place: bool       # present_* outputs alias past_* inputs
    layer_lengths: tuple[int, ...]   # rows of each layer's buffer: context, or the ring length (gate C checks it)

    def length(self, layer: int) -> int:
        return self.layer_lengths[layer]

    def layer_shape(self, layer: int) -> tuple[int, int, int, int]:
        """One layer's K (or V) buffer: [lanes, kv_heads, length, head_dim]."""
        return (self.lanes, self.kv_heads, self.layer_lengths[layer], self.head_dim)

    @property
    def ring(self) -> int | None:
        """The ring length of the sliding-window layers, or None when every buffer holds the context."""
        rings = {n for n in self.layer_lengths if n != self.context}
        return min(rings) if rings else None

    @property
    def ring_layers(self) -> tuple[int, ...]:
        return tuple(i for i, n in enumerate(self.layer_lengths) if n != self.context)

    @property
    def bytes_per_position(self) -> int:
        """One position of one lane in one K (or V) buffer: kv_heads x head_dim x dtype bytes."""
        return self.kv_heads * self.head_dim * DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_lane(self) -> int:
        """(full layers x context + ring layers x ring) x 2 (K, V) x kv_heads x head_dim x dtype bytes."""
        return 2 * sum(self.layer_lengths) * self.bytes_per_position

    @property
    def total_bytes(self) -> int:
        """Every layer's K and V buffer for every lane."""
        return self.lanes * self.bytes_per_lane

    def to_json(self) -> dict:
        return {**_plain(self), "layer_lengths": list(self.layer_lengths)}

    @staticmethod
    def from_json(d: dict) -> "KVLayout":
        return KVLayout(**{**d, "layer_lengths": tuple(d["layer_lengths"])})


@dataclass(frozen=True)
class SourceInfo:
    kind: str            # "hf" | "gguf"
    path: str
    sha256: str


@dataclass(frozen=True)
class ModelInfo:
    family: str
    model_type: str
    hyperparameters: ModelSpec
    source: SourceInfo

    def to_json(self) -> dict:
        return {"family": self.family, "model_type": self.model_type, "hyperparameters": self.hyperparameters.to_json(),
                "source": _plain(self.source)}

    @staticmethod
    def from_json(d: dict) -> "ModelInfo":
        return ModelInfo(d["family"], d["model_type"], ModelSpec.from_json(d["hyperparameters"]), SourceInfo(**d["source"]))


@dataclass(frozen=True)
class WeightTensor:
    name: str
    dtype: str           # numpy dtype name
    shape: tuple[int, ...]
    offset: int          # bytes from the start of the weights file
    nbytes: int


@dataclass(frozen=True)
class WeightsInfo:
    file: str
    bytes: int
    layout: str          # a sentence on how tensors are laid out
    tensors: tuple[WeightTensor, ...]

    def to_json(self) -> dict:
        return {"file": self.file, "bytes": self.bytes, "layout": self.layout,
                "tensors": [{**_plain(t), "shape": list(t.shape)} for t in self.tensors]}

    @staticmethod
    def from_json(d: dict) -> "WeightsInfo":
        return WeightsInfo(d["file"], d["bytes"], d.get("layout", ""),
                           tuple(WeightTensor(t["name"], t["dtype"], tuple(t["shape"]), t["offset"], t["nbytes"])
                                 for t in d["tensors"]))


@dataclass(frozen=True)
class TensorFormat:
    """How one weight is stored. `module` is a module class string of the policy table (embedding,
    attention, mlp, lm_head, norm, ...: families may add their own, e.g. router or experts)."""
    kind: str                         # fp32 | fp16 | int8 | int4
    block: int = 0                    # quantization block along K (0: not block-quantized)
    compute: str = "fp32"             # the precision the kernel computes in
    module: str = ""
    exact_blocks: float | None = None   # share of blocks re-encoded exactly (values already on a grid)
    max_abs_error: float | None = None
    role: str | None = None             # a helper copy's job, e.g. the coarse lm_head's candidate selection
    code_range: int | None = None       # int8 codes for u8 x s8 GEMMs: the largest |code| (127; 63 in a coarse head
                                        # built before 2026-12-07 for a CPU without an int8 dot product)
    pair_sum: int | None = None         # int8 codes whose neighbours along K sum to at most this in magnitude
                                        # (compiler/int8_pairs.py: exact on an AVX2 u8 x s8 kernel)

    @property
    def quantized(self) -> bool:
        return self.kind != "fp32"

    @property
    def label(self) -> str:
        """`fp32`, `fp16`, or e.g. `int8 b32 (int8 compute)`."""
        return self.kind if self.kind in ("fp32", "fp16") else f"{self.kind} b{self.block} ({self.compute} compute)"

    def to_json(self) -> dict:
        return {k: v for k, v in _plain(self).items() if v is not None}


@dataclass(frozen=True)
class Quantization:
    policy: str
    table: dict[str, TensorFormat]      # module class -> the policy's format for it
    tensors: dict[str, TensorFormat]    # every weight -> its stored format
    overrides: tuple[dict, ...] = ()    # --quant per-module overrides as given (compiler/quant_spec.Override.to_json)

    def to_json(self) -> dict:
        return {"policy": self.policy, "table": {k: v.to_json() for k, v in self.table.items()},
                "overrides": [dict(o) for o in self.overrides],
                "tensors": {k: v.to_json() for k, v in self.tensors.items()}}

    @staticmethod
    def from_json(d: dict) -> "Quantization":
        return Quantization(d["policy"], {k: TensorFormat(**v) for k, v in d["table"].items()},
                            {k: TensorFormat(**v) for k, v in d["tensors"].items()},
                            tuple(dict(o) for o in d.get("overrides", ())))


@dataclass(frozen=True)
class GoldenInfo:
    file: str
    prompts: int
    tokens: int
    thresholds: dict[str, float]        # as golden.json states them (gate F checks the two agree)


@dataclass(frozen=True)
class Toolchain:
    calculet: str
    onnx: str
    onnxruntime: str
    numpy: str
    python: str


@dataclass(frozen=True)
class FileEntry:
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    schema_version: str
    target: str                         # one of TARGETS
    model: ModelInfo
    tokenizer: TokenizerInfo
    profile: Profile
    graphs: tuple[GraphSpec, ...]
    kv: KVLayout
    weights: WeightsInfo
    quantization: Quantization
    memory_plan: MemoryPlan
    golden: GoldenInfo | None
    toolchain: Toolchain
    files: dict[str, FileEntry]         # every file but manifest.json, by path relative to the calbin
    passes: tuple[str, ...] = ()        # fusion passes applied
    provenance: Provenance | None = None   # source identity, compile command, toolchain (calbin/provenance.py)
    isa: IsaInfo | None = None          # compiling CPU's features and the weight policy's reason (calbin/isa.py)
    partition: Partition | None = None     # --chips N --partition pp|tp|ep: which chip holds what (calbin/partition.py)

    @property
    def spec(self) -> ModelSpec:
        return self.model.hyperparameters

    def graph(self, name: str) -> GraphSpec | None:
        """The graph named exactly `name` (never by prefix or substring)."""
        return next((g for g in self.graphs if g.name == name), None)

    def graphs_of(self, kind: str) -> list[GraphSpec]:
        return [g for g in self.graphs if g.type == kind]

    @property
    def quantized(self) -> bool:
        return any(t.quantized for t in self.quantization.tensors.values())

    def to_json(self) -> dict:
        return {
            "schema_version": self.schema_version,
            "target": self.target,
            "model": self.model.to_json(),
            "tokenizer": {**_plain(self.tokenizer), "eos_token_ids": list(self.tokenizer.eos_token_ids)},
            "profile": {k: list(v) if isinstance(v, tuple) else v for k, v in _plain(self.profile).items()},
            "graphs": [g.to_json() for g in self.graphs],
            "kv": self.kv.to_json(),
            "weights": self.weights.to_json(),
            "quantization": self.quantization.to_json(),
            "memory_plan": self.memory_plan.to_json(),
            "golden": None if self.golden is None else _plain(self.golden),
            "toolchain": _plain(self.toolchain),
            "files": {k: _plain(v) for k, v in self.files.items()},
            "passes": list(self.passes),
            "provenance": None if self.provenance is None else self.provenance.to_json(),
            "isa": None if self.isa is None else self.isa.to_json(),
            **({} if self.partition is None else {"partition": self.partition.to_json()}),
        }

    @staticmethod
    def from_json(d: dict) -> "Manifest":
        try:
            return Manifest(
                schema_version=d["schema_version"],
                target=d["target"],
                model=ModelInfo.from_json(d["model"]),
                tokenizer=TokenizerInfo.from_json(d["tokenizer"]),
                profile=Profile.from_json(d["profile"]),
                graphs=tuple(GraphSpec.from_json(g) for g in d["graphs"]),
                kv=KVLayout.from_json(d["kv"]),
                weights=WeightsInfo.from_json(d["weights"]),
                quantization=Quantization.from_json(d["quantization"]),
                memory_plan=MemoryPlan.from_json(d["memory_plan"]),
                golden=None if d.get("golden") is None else GoldenInfo(**d["golden"]),
                toolchain=Toolchain(**d["toolchain"]),
                files={k: FileEntry(**v) for k, v in d["files"].items()},
                passes=tuple(d.get("passes", ())),
                provenance=Provenance.from_json(d["provenance"]) if d.get("provenance") else None,
                isa=IsaInfo.from_json(d["isa"]) if d.get("isa") else None,
                partition=Partition.from_json(d["partition"]) if d.get("partition") else None,
            )
        except KeyError as exc:
            raise ModelError("manifest_missing_field", f"manifest.json lacks the field {exc.args[0]!r}") from None
        except (TypeError, AttributeError) as exc:
            raise ModelError("manifest_bad_field", f"manifest.json has a malformed section: {exc}") from None


def _plain(obj) -> dict:
    """A flat dataclass's fields as a dict (one level: nested sections write their own JSON)."""
    return {k: getattr(obj, k) for k in obj.__dataclass_fields__}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(manifest: Manifest, folder: Path) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1) + "\n")


def read_manifest_json(folder: str | Path) -> dict:
    """manifest.json as a dict; a folder that is not a calbin or a manifest that is not JSON is an error."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not folder.is_dir():
        raise ModelError("not_a_calbin", f"{folder}: not a calbin (not a directory); give the folder `calculet compile` wrote")
    if not path.is_file():
        raise ModelError("not_a_calbin", f"{folder}: not a calbin (no {MANIFEST}); compile one with `calculet compile`")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError("manifest_not_json", f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelError("manifest_not_json", f"{path}: expected a JSON object at the top level, got {type(data).__name__}")
    return data


def read_manifest(folder: str | Path) -> Manifest:
    data = read_manifest_json(folder)
    problem = schema_problem(data.get("schema_version"), folder)
    if problem:
        raise ModelError("manifest_schema", problem)
    return Manifest.from_json(data)


def verify_files(manifest: Manifest, folder: str | Path, full_hash: bool = False) -> None:
    """Every listed file exists with its size (and SHA-256 with full_hash)."""
    folder = Path(folder)
    for rel, entry in manifest.files.items():
        path = folder / rel
        if not path.is_file():
            raise ModelError("file_missing", f"{path}: listed in the manifest but missing")
        size = path.stat().st_size
        if size != entry.bytes:
            raise ModelError("file_size_mismatch", f"{path}: {size} bytes on disk, the manifest says {entry.bytes} bytes")
        if full_hash and sha256_file(path) != entry.sha256:
            raise ModelError("file_hash_mismatch", f"{path}: SHA-256 differs from the manifest (corrupt or modified file)")
