"""benchmarks/vs_llamacpp/build_llama_server.py: which llama-server build a CPU gets. Guards the
2026-12-04 failure on an Intel AMX Xeon, where the native build crashed at its first decode
(ggml_backend_amx_mul_mat) and `run.py` stopped with "server exited with code -11"."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "vs_llamacpp"))
import build_llama_server as build  # noqa: E402


def test_no_amx_build_keeps_everything_but_native_and_turns_amx_off():
    native, no_amx = build.cmake_options(False), build.cmake_options(True)
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
    monkeypatch.setattr(build, "find_llama_server", lambda explicit, cache: None)
    monkeypatch.setattr(build, "build_llama_server", lambda cache, jobs, no_amx: built.append(no_amx) or cache)
    for amx, ggml_amx, want in ((True, False, True), (True, True, False), (False, False, False)):
        monkeypatch.setattr(build, "has_amx", lambda: amx)
        build.find_or_build(cache=tmp_path, ggml_amx=ggml_amx)
        assert built[-1] is want, (amx, ggml_amx)
