"""Source provenance in the manifest, and reproducible builds: the same source compiled twice with
the same options gives byte-identical files (manifest, graphs, weights, golden)."""

from __future__ import annotations

import hashlib
import json
import shlex

import pytest

from calculet.calbin.manifest import read_manifest
from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions
from calculet.compiler.provenance import compile_command, source_identity

OPTIONS = CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), golden=False, weights="int8")


def _hashes(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_source_and_options_give_byte_identical_calbins(tiny_model_dir, tmp_path):
    """Two compiles into different folders: every file, the manifest included, has the same SHA-256
    (the manifest holds no timestamp and no output path)."""
    source = str(tiny_model_dir("qwen3"))
    a = compile_calbin(source, tmp_path / "one" / "a.calbin", OPTIONS, log=lambda _m: None)
    b = compile_calbin(source, tmp_path / "two" / "b.calbin", OPTIONS, log=lambda _m: None)
    ha, hb = _hashes(a), _hashes(b)
    assert set(ha) >= {"manifest.json", "graphs/weights.bin", "graphs/decode_2.onnx", "tokenizer.json"}
    assert ha == hb
    c = compile_calbin(source, tmp_path / "three" / "c.calbin", CompileOptions(**{**OPTIONS.__dict__, "lanes": 1}),
                       log=lambda _m: None)
    assert _hashes(c)["manifest.json"] != ha["manifest.json"]  # other options: another build


def test_manifest_records_the_source_files_command_and_toolchain(tiny_model_dir, tmp_path):
    import shutil

    card = shutil.copytree(tiny_model_dir("llama"), tmp_path / "card")  # a copy with a model card
    (card / "README.md").write_text("---\nlicense: apache-2.0\nlanguage: en\n---\n# tiny\n")
    calbin = compile_calbin(str(card), tmp_path / "m.calbin", OPTIONS, log=lambda _m: None)
    prov = read_manifest(calbin).provenance
    assert prov.source.kind == "hf" and prov.source.license == "apache-2.0" and prov.source.revision is None
    files = {f.path: f for f in prov.source.files}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(files)
    st = card / "model.safetensors"
    assert files["model.safetensors"].sha256 == hashlib.sha256(st.read_bytes()).hexdigest()
    assert files["model.safetensors"].bytes == st.stat().st_size
    argv = shlex.split(prov.command)
    assert argv[:3] == ["calculet", "compile", str(card)] and "-o" not in argv
    assert argv[argv.index("--weights") + 1] == "int8" and "--no-golden" in argv
    assert prov.options["lanes"] == 2 and prov.options["fusions"] == sorted(OPTIONS.fusions)
    for lib in ("calculet", "onnx", "onnxruntime", "numpy", "python", "tokenizers"):
        assert prov.toolchain[lib]
    raw = json.loads((calbin / "manifest.json").read_text())
    assert raw["provenance"]["source"]["files"][0]["sha256"]


def test_the_recorded_command_reproduces_the_options(tiny_model_dir):
    from calculet.cli import build_parser
    from calculet.compiler.options import parse_chunks, parse_fusions

    options = CompileOptions(lanes=3, context=128, prefill_chunks=(8, 32), weights="int4", decode_lanes=(1, 2),
                             fusions=frozenset({"qkv", "skip-norm"}), golden=False, probes=True)
    argv = shlex.split(compile_command("src", options))[1:] + ["-o", "x.calbin"]
    args = build_parser().parse_args(argv)
    again = CompileOptions(lanes=args.lanes, context=args.context, prefill_chunks=parse_chunks(args.prefill_chunks),
                           target=args.target, weights=args.weights, block_size=args.block_size, golden=not args.no_golden,
                           decode_lanes=parse_chunks(args.decode_lanes), fusions=parse_fusions(args.fuse, args.no_fuse),
                           probes=args.probes)
    assert again == options


def test_hf_revision_from_a_hub_snapshot_folder(tiny_model_dir, tmp_path):
    import shutil

    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = tmp_path / "models--x--y" / "snapshots" / rev
    shutil.copytree(tiny_model_dir("llama"), snap)
    assert source_identity("hf", str(snap)).revision == rev
    local = tmp_path / "local"
    shutil.copytree(tiny_model_dir("llama"), local)
    meta = local / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True)
    (meta / "config.json.metadata").write_text(rev + "\netag\n")
    ident = source_identity("hf", str(local))
    assert ident.revision == rev and not any(f.path.startswith(".cache") for f in ident.files)


@pytest.mark.slow
def test_gguf_identity_holds_its_general_metadata():
    from calculet.sources.resolve import default_model_path

    ident = source_identity("gguf", default_model_path())
    assert ident.metadata["general.architecture"] == "gemma3" and len(ident.files) == 1
    assert len(ident.files[0].sha256) == 64
