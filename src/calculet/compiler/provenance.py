"""Collect a calbin's provenance (calbin/provenance.py) from the source on disk and the options."""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import asdict
from pathlib import Path

from calculet.calbin.provenance import Provenance, SourceFile, SourceIdentity
from calculet.compiler.options import FUSIONS, CompileOptions

_HEX40 = re.compile(r"^[0-9a-f]{40}$")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _files(root: Path) -> tuple[SourceFile, ...]:
    """Every regular file of a folder (hidden folders such as .cache skipped), or the one file."""
    if root.is_file():
        return (SourceFile(root.name, root.stat().st_size, _sha256(root)),)
    paths = sorted(p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    return tuple(SourceFile(str(p.relative_to(root)), p.stat().st_size, _sha256(p)) for p in paths)


def _hf_revision(root: Path) -> str | None:
    """The commit of a Hugging Face download: a hub-cache snapshot folder is named after it; a
    `local_dir` download keeps it in .cache/huggingface/download/*.metadata (first line)."""
    if root.parent.name == "snapshots" and _HEX40.match(root.name):
        return root.name
    for meta in sorted((root / ".cache" / "huggingface" / "download").glob("*.metadata")):
        first = meta.read_text(errors="replace").splitlines()[:1]
        if first and _HEX40.match(first[0].strip()):
            return first[0].strip()
    return None


def _card_license(root: Path) -> str | None:
    """`license:` from the YAML front matter of README.md (the model card)."""
    readme = root / "README.md"
    if not readme.is_file():
        return None
    text = readme.read_text(errors="replace")
    if not text.startswith("---"):
        return None
    front = text[3:].split("\n---", 1)[0]
    match = re.search(r"^license:\s*(\S.*?)\s*$", front, re.MULTILINE)
    return match.group(1).strip("'\"") if match else None


def _gguf_general(path: Path) -> dict:
    from calculet.sources.gguf import read_gguf

    meta = read_gguf(str(path)).metadata
    return {k: v for k, v in sorted(meta.items()) if k.startswith("general.") and isinstance(v, (str, int, float, bool))}


def source_identity(kind: str, path: str) -> SourceIdentity:
    root = Path(path)
    if kind == "gguf":
        general = _gguf_general(root)
        return SourceIdentity(kind, str(path), None, general.get("general.license"), general, _files(root))
    return SourceIdentity(kind, str(path), _hf_revision(root), _card_license(root), {}, _files(root))


def compile_command(source_arg: str | None, options: CompileOptions) -> str:
    """The `calculet compile` command line that reproduces these options (output path left out)."""
    argv = ["calculet", "compile"] + ([source_arg] if source_arg is not None else [])
    argv += ["--lanes", str(options.lanes), "--context", str(options.context),
             "--prefill-chunks", ",".join(map(str, sorted(options.prefill_chunks))),
             "--target", options.target, "--weights", options.weights, "--block-size", str(options.block_size),
             "--decode-lanes", ",".join(map(str, sorted(options.decode_lanes)))]
    argv += [f"--no-fuse={name}" for name in FUSIONS if name not in options.fusions]
    if options.kv_dtype != "fp32":
        argv += ["--kv-dtype", options.kv_dtype]
    if not options.golden:
        argv.append("--no-golden")
    if options.probes:
        argv.append("--probes")
    if options.quant:
        from calculet.compiler.quant_spec import canonical
        argv += ["--quant", canonical(options.quant)]
    return shlex.join(argv)


def provenance(kind: str, path: str, source_arg: str | None, options: CompileOptions, toolchain: dict) -> Provenance:
    fields = asdict(options)
    fields["fusions"] = sorted(options.fusions)
    return Provenance(source_identity(kind, path), compile_command(source_arg, options), fields, dict(toolchain))
