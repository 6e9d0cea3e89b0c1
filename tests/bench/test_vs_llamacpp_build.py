"""benchmarks/vs_llamacpp/build_llama_server.py: which llama-server build a CPU gets. Guards the
2026-12-04 failure on an Intel AMX Xeon, where the native build crashed at its first decode
(ggml_backend_amx_mul_mat) and `run.py` stopped with "server exited with code -11"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "vs_llamacpp"))
import build_llama_server as build  # noqa: E402


def test_no_amx_build_keeps_everything_but_native_and_turns_amx_off():
    native, no_amx = build.cmake_options("native"), build.cmake_options("no-amx")
    assert native == build.CMAKE_OPTIONS and "-DGGML_NATIVE=ON" in native
    assert "-DGGML_NATIVE=ON" not in no_amx and "-DGGML_NATIVE=OFF" in no_amx
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(no_amx)
    assert {"-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX2=ON"} <= set(no_amx)
    assert set(native) - {"-DGGML_NATIVE=ON"} <= set(no_amx)   # the server-only, no-UI, no-SSL options stay


def test_amx_is_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni amx_bf16 amx_int8 amx_tile\n")
    assert build.has_amx(info)
    info.write_text("flags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert not build.has_amx(info)
    assert not build.has_amx(tmp_path / "missing")


def test_a_cpu_with_amx_builds_without_it_unless_asked(tmp_path, monkeypatch):
    built = []
    monkeypatch.setattr(build, "find_llama_server", lambda explicit, cache, avx2: None)
    monkeypatch.setattr(build, "build_llama_server", lambda cache, jobs, kind: built.append(kind) or cache)
    for amx, ggml_amx, want in ((True, False, "no-amx"), (True, True, "native"), (False, False, "native")):
        monkeypatch.setattr(build, "has_amx", lambda: amx)
        build.find_or_build(cache=tmp_path, ggml_amx=ggml_amx)
        assert built[-1] == want, (amx, ggml_amx)
        build.find_or_build(cache=tmp_path, avx2=True)
        assert built[-1] == "avx2", amx


def test_the_avx2_peer_compiles_no_avx512_vnni_or_amx_kernel_and_has_its_own_folder(tmp_path):
    avx2 = build.cmake_options("avx2")
    assert "-DGGML_NATIVE=OFF" in avx2 and "-DGGML_NATIVE=ON" not in avx2
    assert {"-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"} <= set(avx2)
    on = {o for o in avx2 if o.endswith("=ON")}
    assert not [o for o in on if "AVX512" in o or "VNNI" in o or "AMX" in o], on
    assert set(build.CMAKE_OPTIONS) - {"-DGGML_NATIVE=ON"} <= set(avx2)
    assert build.built_binary(tmp_path, "avx2") == tmp_path / "build-avx2" / "bin" / "llama-server"
    assert build.built_binary(tmp_path) == build.built_binary(tmp_path, "no-amx") == tmp_path / "build" / "bin" / "llama-server"
    with pytest.raises(ValueError, match="known: native, no-amx, avx2"):
        build.cmake_options("avx512")


def test_the_avx2_peer_is_only_the_caches_own(tmp_path, monkeypatch):
    """A llama-server on PATH is built for its own CPU: the AVX2 search must not take it."""
    monkeypatch.delenv("LLAMA_SERVER", raising=False)
    monkeypatch.setattr(build.shutil, "which", lambda name: "/usr/bin/llama-server")
    assert build.find_llama_server(None, tmp_path) == Path("/usr/bin/llama-server")
    assert build.find_llama_server(None, tmp_path, avx2=True) is None
    binary = build.built_binary(tmp_path, "avx2")
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    assert build.find_llama_server(None, tmp_path, avx2=True) == binary
