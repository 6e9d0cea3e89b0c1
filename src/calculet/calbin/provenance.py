"""The manifest's `provenance` section: what a calbin was compiled from, and how.

    source     kind, path, revision (HF commit when the folder says), license, GGUF `general.*`
               metadata, and the size and SHA-256 of every source file
    command    the compile command that reproduces the build (canonical flags, every option
               spelled out; the output path is left out: where a build is written is not part of it)
    options    the compile options as JSON
    toolchain  versions of everything that touched the bytes (also in the manifest's `toolchain`)

There is deliberately no timestamp: compiling the same source with the same options and toolchain
gives byte-identical files, manifest included, and the SHA-256 list identifies the build.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class SourceFile:
    path: str        # relative to the source folder (HF) or the file name (GGUF)
    bytes: int
    sha256: str


@dataclass(frozen=True)
class SourceIdentity:
    kind: str                       # "hf" | "gguf"
    path: str
    revision: str | None            # HF commit hash when known
    license: str | None             # README front matter (HF) or general.license (GGUF)
    metadata: dict = field(default_factory=dict)     # GGUF general.* scalars; HF: the model card's name keys
    files: tuple[SourceFile, ...] = ()

    @staticmethod
    def from_json(d: dict) -> "SourceIdentity":
        return SourceIdentity(d["kind"], d["path"], d.get("revision"), d.get("license"), dict(d.get("metadata", {})),
                              tuple(SourceFile(**f) for f in d.get("files", ())))


@dataclass(frozen=True)
class Provenance:
    source: SourceIdentity
    command: str
    options: dict
    toolchain: dict

    def to_json(self) -> dict:
        d = asdict(self)
        d["source"]["files"] = [dict(f) for f in d["source"]["files"]]
        return d

    @staticmethod
    def from_json(d: dict) -> "Provenance":
        return Provenance(SourceIdentity.from_json(d["source"]), d["command"], dict(d["options"]), dict(d["toolchain"]))
