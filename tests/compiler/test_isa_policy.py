"""--weights auto: the policy follows the CPU's ISA, is recorded in the manifest with its reason, and
a load on a CPU that lacks what the choice assumed warns. CALCULET_CPU_FEATURES simulates the CPUs."""

from __future__ import annotations

import pytest

from calculet.calbin.isa import choose_policy, load_warnings
from calculet.calbin.manifest import read_manifest
from calculet.compiler.compile import compile_calbin
from calculet.compiler.isa_policy import resolve_weights
from calculet.compiler.int8_pairs import PAIR_SUM_LIMIT, pair_sums
from calculet.compiler.options import CompileOptions
from calculet.cpu_features import ENV, CpuFeatures
from calbin_weights import stored_weight

AVX2 = CpuFeatures(("avx2", "fma", "f16c"), "test", "x86_64")
VNNI = CpuFeatures(("avx2", "fma", "f16c", "avx512f", "avx512_vnni"), "test", "x86_64")


@pytest.mark.parametrize("cpu, policy", [
    (AVX2, "default"), (VNNI, "default"), (CpuFeatures(("avx2", "avx_vnni"), "t", "x86_64"), "default"),
    (CpuFeatures((), "t", "x86_64"), "fp32"), (CpuFeatures((), "t", "aarch64"), "default")])
def test_rule(cpu, policy):
    choice = choose_policy(cpu)
    assert choice.chosen == policy and choice.reason


def test_named_policy_is_kept_and_portable_auto_is_int8():
    opts, choice = resolve_weights(CompileOptions(weights="w8a8"), AVX2)
    assert opts.weights == "w8a8" and choice.requested == "w8a8" and choice.assumes == ()
    opts, choice = resolve_weights(CompileOptions(target="portable"), AVX2)
    assert opts.weights == "int8" and choice.requested == "auto"


def test_int8_weight_only_is_flagged_at_compile_and_at_load(tiny_model_dir, tmp_path, monkeypatch):
    """Guards the 3.3 tok/s int8 policy (issue 14): 8-bit MatMulNBits at fp32 compute has no ONNX Runtime
    kernel. The policy stays as a numerics reference, and says so when compiled and when loaded."""
    from calculet.compiler.isa_policy import uses_slow_8bit
    from calculet.compiler.quant_spec import parse_quant

    assert uses_slow_8bit(CompileOptions(weights="int8"))
    assert uses_slow_8bit(CompileOptions(weights="fp32", quant=parse_quant("mlp=int8")))
    assert not uses_slow_8bit(CompileOptions(weights="fp32", quant=parse_quant("embed=int8,mlp=w8a8")))
    assert not uses_slow_8bit(CompileOptions(weights="default")) and not uses_slow_8bit(CompileOptions(weights="int4"))
    said = []
    monkeypatch.setenv(ENV, "avx2,fma,f16c,avx512f,avx512_vnni")   # compiled for the CPU it is loaded on below
    out = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "i.calbin",
                         CompileOptions(lanes=2, context=32, prefill_chunks=(4,), golden=False, weights="int8"),
                         log=said.append)
    assert any("numerics reference" in line and "--weights default" in line for line in said)
    warnings = load_warnings(read_manifest(out), VNNI)
    assert len(warnings) == 1 and "ONNX Runtime has no kernel" in warnings[0]


def test_auto_compile_records_the_choice_and_load_warns_on_a_lesser_cpu(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, "avx2,fma,f16c,avx512f,avx512_vnni")
    out = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "m.calbin",
                         CompileOptions(lanes=2, context=32, prefill_chunks=(4,), golden=False), log=lambda _m: None)
    m = read_manifest(out)
    assert m.quantization.policy == "default" and m.isa.choice.requested == "auto"
    assert m.isa.choice.assumes == ("avx512_vnni",) and m.isa.compile_cpu.flags[-1] == "avx512_vnni"
    assert load_warnings(m, VNNI) == []
    lesser = load_warnings(m, AVX2)
    assert any("lacks avx512_vnni" in w for w in lesser)
    assert any(w.startswith("lm_head.coarse8: full-range int8 codes") for w in lesser)   # 16-bit pair sums there
    assert m.quantization.tensors["lm_head.coarse8"].code_range == 127

    monkeypatch.setenv(ENV, "avx2,fma,f16c")   # the runtime checks the loading CPU and keeps what it logged
    from calculet.runtime.program import Program
    from calculet.cpu_features import detect
    assert any("prefill-int8" in w for w in lesser)   # the VNNI build's prefill GEMMs (compiler/prefill_int8.py)
    assert Program(out).isa_warnings == load_warnings(m, detect()) and len(lesser) == 3
    out2 = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "a.calbin",
                          CompileOptions(lanes=2, context=32, prefill_chunks=(4,), golden=False), log=lambda _m: None)
    m2 = read_manifest(out2)
    assert m2.quantization.policy == "default" and "AVX2 without VNNI" in m2.isa.choice.reason
    assert "gate F" in m2.isa.choice.reason       # why not w4a8, which is faster there
    assert {t.kind for t in m2.quantization.tensors.values() if t.module == "mlp" and t.role is None} == {"int8"}
    coarse8 = m2.quantization.tensors["lm_head.coarse8"]
    assert coarse8.pair_sum == PAIR_SUM_LIMIT and "pair-bounded" in coarse8.role
    codes = stored_weight(out2, "lm_head.coarse8.weight")                        # [H, V]: pairs along H
    assert codes.dtype.name == "int8" and int(pair_sums(codes.T).max()) == PAIR_SUM_LIMIT   # bounded, used to the full
    assert int(abs(codes.astype(int)).max()) > 63                                 # wider than 7-bit codes
    assert load_warnings(m2, AVX2) == []
    assert [w for w in load_warnings(m2, VNNI) if "pair-bounded" not in w] == []   # only: its prefill codes are coarser there


def test_cache_key_of_auto_follows_the_cpu(monkeypatch):
    """A compile cache shared by two CPUs must not hand one the other's `auto` build."""
    monkeypatch.setenv(ENV, "avx2,fma,f16c")
    avx2 = CompileOptions().cache_key()
    monkeypatch.setenv(ENV, "avx2,avx512_vnni")
    assert CompileOptions().cache_key() != avx2
    assert CompileOptions(weights="default").cache_key() == CompileOptions(weights="default").cache_key()
