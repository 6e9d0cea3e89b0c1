"""The calbin manifest: the versioned contract between compiler and runtime.

A calbin is a folder:

    manifest.json          this schema (everything below, plus a size and SHA-256 per file)
    tokenizer.json         Hugging Face tokenizers file
    graphs/weights.bin     every initializer once, 64-byte aligned, shared by all graphs
    graphs/prefill_<S>.onnx, graphs/decode.onnx
    golden/golden.json     reference prompts, top-k logits and greedy tokens (when the reference extra was installed)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from calculet.calbin.provenance import Provenance
from calculet.errors import ModelError

SCHEMA_VERSION = "calculet.calbin/1"
SUPPORTED_SCHEMAS = (SCHEMA_VERSION,)
MANIFEST = "manifest.json"


@dataclass(frozen=True)
class Profile:
    lanes: int
    context: int
    prefill_chunks: tuple[int, ...]
    decode_lanes: tuple[int, ...] = ()   # decode batch sizes compiled (the largest is `lanes`)

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


@dataclass(frozen=True)
class TokenizerInfo:
    file: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    add_bos_token: bool
    chat_template: str | None


@dataclass(frozen=True)
class KVLayout:
    layout: str          # "BNSH": per layer [lanes, kv_heads, context, head_dim]
    dtype: str
    num_layers: int
    lanes: int
    kv_heads: int
    context: int
    head_dim: int
    in_place: bool       # present_* outputs alias past_* inputs

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.lanes, self.kv_heads, self.context, self.head_dim)

    @property
    def bytes_per_buffer(self) -> int:
        n = self.lanes * self.kv_heads * self.context * self.head_dim
        return n * {"float32": 4, "float16": 2}[self.dtype]


@dataclass(frozen=True)
class FileEntry:
    bytes: int
    sha256: str


@dataclass
class Manifest:
    schema_version: str
    target: str
    model: dict              # family, model_type, hyperparameters (ModelSpec), source {kind, path, sha256}
    tokenizer: TokenizerInfo
    profile: Profile
    graphs: list[dict]       # GraphSpec.to_json()
    kv: KVLayout
    weights: dict            # {file, bytes, tensors: [TensorEntry]}
    quantization: dict       # {policy, modules: {tensor: dtype}}
    memory_plan: dict        # see compiler/memory_plan.py
    golden: dict | None
    toolchain: dict
    files: dict[str, FileEntry] = field(default_factory=dict)
    passes: list[str] = field(default_factory=list)   # fusion passes applied
    provenance: Provenance | None = None   # source identity, compile command, toolchain (calbin/provenance.py)

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "Manifest":
        try:
            return Manifest(
                schema_version=d["schema_version"],
                target=d["target"],
                model=d["model"],
                tokenizer=TokenizerInfo(**{**d["tokenizer"], "eos_token_ids": tuple(d["tokenizer"]["eos_token_ids"])}),
                profile=Profile(d["profile"]["lanes"], d["profile"]["context"], tuple(d["profile"]["prefill_chunks"]),
                                tuple(d["profile"].get("decode_lanes", ()))),
                graphs=d["graphs"],
                kv=KVLayout(**d["kv"]),
                weights=d["weights"],
                quantization=d["quantization"],
                memory_plan=d["memory_plan"],
                golden=d.get("golden"),
                toolchain=d["toolchain"],
                files={k: FileEntry(**v) for k, v in d["files"].items()},
                passes=list(d.get("passes", [])),
                provenance=Provenance.from_json(d["provenance"]) if d.get("provenance") else None,
            )
        except KeyError as exc:
            raise ModelError("manifest_missing_field", f"manifest.json lacks the field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise ModelError("manifest_bad_field", f"manifest.json has a malformed section: {exc}") from None


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
    path = Path(folder) / MANIFEST
    data = read_manifest_json(folder)
    version = data.get("schema_version")
    if version not in SUPPORTED_SCHEMAS:
        raise ModelError("manifest_schema", f"{path}: schema_version {version!r} is not supported; supported: {', '.join(SUPPORTED_SCHEMAS)}")
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
