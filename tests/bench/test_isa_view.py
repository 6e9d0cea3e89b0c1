"""benchmarks/isa_view: ONNX Runtime answering CPUID as an AVX2-only CPU runs that CPU's kernels, and
the AVX2 build's several-row coarse head is exact on them while a VNNI build's is not (16-bit pair sums).

The view is built once per module (a copy of the installed onnxruntime with its CPUID instructions
rewritten, and a small C handler); it needs a C compiler and objdump, and an x86 CPU with AVX2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from calculet.calbin.manifest import read_manifest
from calculet.compiler.compile import compile_calbin
from calculet.compiler.options import CompileOptions
from calculet.cpu_features import ENV, detect

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "isa_view"))
import make_view  # noqa: E402

pytestmark = pytest.mark.skipif(
    shutil.which("objdump") is None or shutil.which(os.environ.get("CC", "cc")) is None
    or not detect().has("avx2"),
    reason="the ISA view needs objdump, a C compiler and an x86 CPU with AVX2")


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    out = tmp_path_factory.mktemp("isa_view")
    assert make_view.main(["--out", str(out)]) == 0
    return out


def _in_view(view: Path, code: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code, *args], env=make_view.view_environment(view),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


U8S8 = r"""
import json, numpy as np, onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
rng = np.random.default_rng(0)
w = rng.integers(-127, 128, (64, 256), dtype=np.int8)
a = np.full((4, 64), 255, np.uint8)
g = helper.make_graph([helper.make_node("MatMulInteger", ["a", "w"], ["c"])], "g",
                      [helper.make_tensor_value_info("a", TensorProto.UINT8, [4, 64])],
                      [helper.make_tensor_value_info("c", TensorProto.INT32, [4, 256])], [numpy_helper.from_array(w, "w")])
s = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                         providers=["CPUExecutionProvider"])
c = s.run(None, {"a": a})[0]
print(json.dumps({"ort": ort.__file__, "error": int(np.abs(c.astype(np.int64) - a.astype(np.int64) @ w).max())}))
"""


def test_view_runs_the_avx2_kernels(view):
    """Under the view the package imported is the patched copy, and its u8 x s8 GEMM is the AVX2 one: with
    full-range codes its 16-bit pair sums saturate (the VNNI kernel, and exact int64 arithmetic, do not)."""
    got = _in_view(view, U8S8)
    assert got["ort"].startswith(str(view / "site"))
    assert got["error"] > 1000


HEAD = r"""
import json, sys, numpy as np, onnxruntime as ort
from pathlib import Path
from calculet.calbin.manifest import read_manifest
sys.path.insert(0, sys.argv[2])
from calbin_weights import stored_weight
calbin = Path(sys.argv[1]); m = read_manifest(calbin)
graph = next(g for g in m.graphs if g.type == "head" and g.name != "head_1")
s = ort.InferenceSession(str(calbin / graph.file), providers=["CPUExecutionProvider"])
rows, hidden = s.get_inputs()[0].shape
x = np.ones((rows, hidden), np.float32)                  # every activation code 255: the largest pair sums
x[1] = -np.linspace(0.5, 1.5, hidden, dtype=np.float32)
coarse = s.run(["logits"], {"hidden": x})[0]
codes = stored_weight(calbin, "lm_head.coarse8.weight").astype(np.int64)
scale = stored_weight(calbin, "lm_head.coarse8.scale")
row = np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-30) / np.float32(127)
q = np.clip(np.rint(x / row) + 128, 0, 255).astype(np.int64) - 128
exact = (q @ codes).astype(np.float64) * scale
print(json.dumps({"graph": graph.name, "error": float(np.abs(coarse - exact).max() / np.abs(exact).max())}))
"""


@pytest.mark.parametrize("features, pair_sum, exact", [
    ("avx2,fma,f16c", 128, True), ("avx2,fma,f16c,avx512f,avx512_vnni", None, False)])
def test_avx2_build_coarse_head_is_exact_on_avx2_kernels(view, tiny_model_dir, tmp_path, monkeypatch,
                                                         features, pair_sum, exact):
    """The AVX2 build pair-bounds the several-row coarse head's codes along the hidden size, so the AVX2
    kernel's 16-bit pair sums never saturate and the product equals exact arithmetic; a VNNI build's
    full-range codes loaded there drift (load_warnings says so)."""
    monkeypatch.setenv(ENV, features)
    out = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "c.calbin",
                         CompileOptions(lanes=2, context=32, prefill_chunks=(4,), golden=False), log=lambda _m: None)
    assert read_manifest(out).quantization.tensors["lm_head.coarse8"].pair_sum == pair_sum
    got = _in_view(view, HEAD, str(out), str(ROOT / "tests"))
    assert got["graph"] == "head_2"
    if exact:
        assert got["error"] < 1e-5, got
    else:
        assert got["error"] > 1e-3, got


ROWS = r"""
import json, sys, numpy as np, onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
sys.path.insert(0, sys.argv[2])
from calbin_weights import stored_weight
errors = []
for proj in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"):
    codes = stored_weight(sys.argv[1], f"model.layers.0.{proj}.weight.rows8.weight")        # [in, out]
    k, n = codes.shape
    # row r: code 255 where column r's weight code is positive, else 1 (that column's largest pair sums)
    a = np.where(codes[:, np.arange(16) % n].T > 0, 255, 1).astype(np.uint8)                 # [16, in]
    inits = [numpy_helper.from_array(codes, "w"), numpy_helper.from_array(np.array(1.0, np.float32), "sa"),
             numpy_helper.from_array(np.ones(n, np.float32), "sw"), numpy_helper.from_array(np.array(128, np.uint8), "za")]
    node = helper.make_node("MatMulIntegerToFloat", ["a", "w", "sa", "sw", "za"], ["y"], domain="com.microsoft")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, list(a.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    y = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    exact = (a.astype(np.int64) - 128) @ codes.astype(np.int64)
    errors.append(float(np.abs(y - exact).max() / np.abs(exact).max()))
print(json.dumps({"error": max(errors)}))
"""


@pytest.mark.parametrize("features, exact", [("avx2,fma,f16c", True), ("avx2,fma,f16c,avx512f,avx512_vnni", False)])
def test_avx2_build_prefill_rows_are_exact_on_avx2_kernels(view, tiny_model_dir, tmp_path, monkeypatch, features, exact):
    """The prefill-int8 pass's AVX2 build stores pair-bounded codes (compiler/int8_pairs.py): the AVX2 u8 x s8
    kernel's 16-bit pair sums never saturate and its products equal exact arithmetic even with every
    activation code at 255; a VNNI build's full-range codes drift there."""
    monkeypatch.setenv(ENV, features)
    out = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "r.calbin",
                         CompileOptions(lanes=2, context=32, prefill_chunks=(4,), golden=False), log=lambda _m: None)
    got = _in_view(view, ROWS, str(out), str(ROOT / "tests"))
    if exact:
        assert got["error"] < 1e-6, got
    else:
        assert got["error"] > 1e-3, got


GREEDY = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
from decoding import generate_on_calbin
print(json.dumps({"tokens": generate_on_calbin(sys.argv[1], list(range(3, 40)), 8).tokens}))
"""


def test_avx2_build_decodes_the_same_on_avx2_kernels(view, tiny_model_dir, tmp_path, monkeypatch):
    """The AVX2 build's integer GEMMs (prefill-int8 and the coarse head on pair-bounded codes, MatMulNBits) are
    exact on the AVX2 kernels too: the greedy tokens under the view are the ones this CPU's kernels give."""
    from decoding import generate_on_calbin

    monkeypatch.setenv(ENV, "avx2,fma,f16c")
    out = compile_calbin(str(tiny_model_dir("llama")), tmp_path / "g.calbin",
                         CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), golden=False), log=lambda _m: None)
    assert "prefill-int8" in read_manifest(out).passes
    got = _in_view(view, GREEDY, str(out), str(ROOT / "tests"))
    assert got["tokens"] == list(generate_on_calbin(out, list(range(3, 40)), 8).tokens)



@pytest.mark.skipif(not detect().has("amx_int8"), reason="the no-AMX view needs a CPU with AMX")
def test_no_amx_view_hides_amx_alone(tmp_path):
    """`--kind no-amx`: ONNX Runtime's CPUID answers (the shim's log of leaf 7) lose AMX_TILE and AMX_INT8
    and keep AVX512F and AVX512_VNNI, and calculet's own detection names the same features less amx_int8."""
    out = tmp_path / "no-amx"
    assert make_view.main(["--kind", "no-amx", "--out", str(out)]) == 0
    features = make_view.view_features("no-amx").split(",")
    assert "amx_int8" not in features and "avx512_vnni" in features
    assert f"CALCULET_CPU_FEATURES={','.join(features)}" in (out / "env.sh").read_text()
    done = subprocess.run([sys.executable, "-c", make_view.CHECK], capture_output=True, text=True, timeout=300,
                          env=make_view.view_environment(out, ",".join(features), CPUID_VIEW_LOG="1"))
    assert done.returncode == 0, done.stderr[-3000:]
    leaf7 = [line.split("->")[1].split() for line in done.stderr.splitlines() if "leaf 0x7.0 ->" in line]
    assert leaf7, done.stderr[-3000:]
    for eax, ebx, ecx, edx in ([int(r, 16) for r in regs] for regs in leaf7):
        assert not edx & (1 << 24 | 1 << 25)           # AMX_TILE, AMX_INT8 hidden
        assert ebx & (1 << 16) and ecx & (1 << 11)      # AVX512F, AVX512_VNNI kept


def test_no_amx_view_refuses_a_cpu_without_amx(monkeypatch):
    if detect(environ={}).has("amx_int8"):
        pytest.skip("this CPU has AMX")
    with pytest.raises(SystemExit, match="no AMX"):
        make_view.view_features("no-amx")
