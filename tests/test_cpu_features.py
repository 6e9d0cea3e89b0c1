"""cpu_features: the ISA flags compile, runtime and bench read, and the env override that simulates a CPU."""

from __future__ import annotations

import pytest

from calculet.cpu_features import ENV, FEATURES, CpuFeatures, detect, from_cpuinfo, parse_env
from calculet.errors import RequestError

EPYC_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse sse2 avx avx2 fma f16c bmi2 sha_ni
"""


def test_cpuinfo_flags_map_to_our_names_and_model():
    flags, model = from_cpuinfo(EPYC_AVX2)
    assert flags == ("avx2", "fma", "f16c") and model == "AMD EPYC 7B13"
    assert from_cpuinfo("processor : 0\nFeatures : fp asimd\n") is None   # ARM: no x86 flags line
    # family and model tell apart the generations that share a model name (AVX2-only vs AVX-512 VNNI EPYCs)
    numbered = from_cpuinfo("cpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nflags\t: avx2 fma\n"
                            "processor\t: 1\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\n")
    assert numbered == (("avx2", "fma"), "AMD EPYC (family 25 model 1)")


def test_env_override_wins_and_is_validated(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(EPYC_AVX2)
    assert detect({}, info).flags == ("avx2", "fma", "f16c") and detect({}, info).source == str(info)
    sim = detect({ENV: "avx512_vnni, AVX2"}, info)
    assert sim.flags == ("avx2", "avx512_vnni") and sim.source.startswith("env") and sim.int8_dot == "avx512_vnni"
    # the record of a simulated run still names the real CPU and its real features
    assert sim.model == "AMD EPYC 7B13" and sim.source.endswith("the CPU has avx2 fma f16c")
    assert detect({ENV: "avx2"}, tmp_path / "missing").source == f"env {ENV}"
    assert detect({ENV: "none"}, info).flags == ()
    with pytest.raises(RequestError, match="allowed: avx2, fma"):
        parse_env("avx2,sse9")


def test_without_cpuinfo_numpy_answers(tmp_path):
    got = detect({}, tmp_path / "missing")
    assert got.source in ("numpy", "unknown") and set(got.flags) <= set(FEATURES)


def test_int8_dot_prefers_amx_and_json_round_trips():
    cpu = CpuFeatures(("avx2", "avx512f", "avx512_vnni", "amx_int8"), "test", "x86_64", "Xeon")
    assert cpu.int8_dot == "amx_int8" and cpu.missing(("avx_vnni", "avx2")) == ("avx_vnni",)
    assert CpuFeatures.from_json(cpu.to_json()) == cpu
    # a newer calculet may record names this one does not know: they are dropped, not fatal
    assert CpuFeatures.from_json({**cpu.to_json(), "flags": ["avx2", "avx10_2"]}).flags == ("avx2",)
    with pytest.raises(ValueError, match="unknown CPU features"):
        CpuFeatures(("sse9",), "test")
