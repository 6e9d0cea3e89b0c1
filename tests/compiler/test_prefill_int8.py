"""The prefill-int8 pass: prefill chunks run qkv, gate/up and o_proj as a per-token int8 GEMM with
calibrated float32 outlier channels (the default) or over calibrated smoothed inputs (--prefill-int8-smooth),
decode keeps the block kernels, and the pass stays off where it cannot run.

The structure is checked on any CPU (CALCULET_CPU_FEATURES simulates one with VNNI); the numbers only
where this CPU has an int8 dot product, since without one ONNX Runtime's u8 x s8 kernel may saturate
(the reason the pass needs VNNI)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from calculet.calbin.isa import load_warnings
from calculet.calbin.manifest import read_manifest
from calculet.compiler import prefill_int8
from calculet.compiler.builder import GraphBuilder
from calculet.compiler.compile import compile_calbin
from calculet.compiler.int8_pairs import PAIR_SUM_LIMIT, column_codes, pair_bounded_codes, pair_sums
from calculet.compiler.options import CompileOptions
from calculet.compiler.quantize import QuantFormat, quantize
from calculet.compiler.weights import QuantInfo, WeightStore
from calculet.cpu_features import ENV, FULL_INT8_RANGE, CpuFeatures, detect
from calculet.runtime.program import Program
from calbin_weights import stored_weight
from decoding import generate_on_calbin, greedy_together

VNNI_FLAGS = "avx2,fma,f16c,avx512f,avx512_vnni"
AMX_FLAGS = VNNI_FLAGS + ",amx_int8"
AVX2 = CpuFeatures(("avx2", "fma", "f16c"), "test", "x86_64")
REAL_INT8_DOT = detect().int8_dot is not None
needs_int8_dot = pytest.mark.skipif(not REAL_INT8_DOT, reason="numbers need a CPU with VNNI or AMX (u8 x s8 without "
                                                                 "them may saturate: the pass is off there)")


def _ops(path, graph):
    model = onnx.load(str(path / "graphs" / f"{graph}.onnx"), load_external_data=False)
    return Counter(n.op_type for n in model.graph.node)


def _outlier_rank(path, graph):
    """The ranks of the outlier channels' products in `graph`: {2} fused into Gemm by ONNX Runtime, {3} kept apart
    (prefill_int8.outlier_add_apart), set() without outlier channels."""
    model = onnx.load(str(path / "graphs" / f"{graph}.onnx"), load_external_data=False)
    return {next(a.i for a in n.attribute if a.name == "axis") + 1 for n in model.graph.node
            if n.op_type == "Gather" and n.name.endswith("/OutlierChannels")}


def _compile(model_dir, out, k, **kw):
    options = CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), golden=False, weights="default",
                             prefill_int8_outliers=k, **kw)
    return compile_calbin(str(model_dir), out, options, log=lambda _m: None)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_prefill_graphs_take_the_int8_gemm_and_decode_keeps_the_blocks(arch, tiny_model_dir, tmp_path, monkeypatch):
    """The default formulation (--prefill-int8-smooth 0): the float32 outlier channels beside the int8 GEMM."""
    monkeypatch.setenv(ENV, VNNI_FLAGS)
    path = _compile(tiny_model_dir(arch), tmp_path / "on.calbin", 32, prefill_int8_smooth=0.0)
    m = read_manifest(path)
    spec = m.model.hyperparameters
    layers = spec.num_layers
    assert "prefill-int8" in m.passes
    for graph in ("prefill_4", "prefill_16"):
        ops = _ops(path, graph)
        assert ops["MatMulIntegerToFloat"] == 3 * layers, ops     # qkv, gate/up and o_proj of every layer
        assert ops["MatMulNBits"] == layers, ops                  # down_proj keeps the block kernel
    for graph in ("decode_1", "decode_2"):
        ops = _ops(path, graph)
        assert ops["MatMulIntegerToFloat"] == 0 and ops["MatMulNBits"] == 4 * layers, ops
    k = prefill_int8.outlier_count(32, spec.hidden_size)
    fmt = m.quantization.tensors["model.layers.0.self_attn.qkv_proj.weight.rows8"]
    assert fmt.kind == "int8" and fmt.compute == "int8" and f"{k} input channels in float32" in fmt.role
    names = {t.name: t for t in m.weights.tensors}
    assert names["model.layers.0.mlp.gate_up_proj.weight.outliers.weight"].shape[0] == k
    context = spec.num_heads * spec.head_dim          # o_proj's input width sets its own channel count
    assert names["model.layers.0.self_attn.o_proj.weight.outliers.weight"].shape == (
        prefill_int8.outlier_count(32, context), spec.hidden_size)
    assert names["model.layers.0.mlp.gate_up_proj.weight.rows8.weight"].dtype == "int8"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_smoothing_replaces_the_float32_channels(arch, tiny_model_dir, tmp_path, monkeypatch):
    """--prefill-int8-smooth auto: each projection's input is divided by calibrated per-channel factors f and
    its weight rows multiplied by them, so the graph has the int8 GEMM and no float32 channel (no Gather,
    no float32 MatMul), the plan and the manifest store no outlier rows, and rows8 holds W x f."""
    monkeypatch.setenv(ENV, VNNI_FLAGS)
    path = _compile(tiny_model_dir(arch), tmp_path / "smooth.calbin", 32, prefill_int8_smooth=None)   # auto
    m = read_manifest(path)
    layers = m.model.hyperparameters.num_layers
    assert "prefill-int8" in m.passes
    for graph in ("prefill_4", "prefill_16"):
        ops = _ops(path, graph)
        assert ops["MatMulIntegerToFloat"] == 3 * layers and ops["MatMulNBits"] == layers, ops
        names = [n.name for n in onnx.load(str(path / "graphs" / f"{graph}.onnx"), load_external_data=False).graph.node]
        assert sum(n.endswith("/RowsInt8/Smooth") for n in names) == 3 * layers
        assert not any("Outlier" in n for n in names)                  # no float32 channel picked or multiplied
    assert not any(".outliers." in t.name for t in m.weights.tensors)
    name = "model.layers.0.mlp.gate_up_proj.weight"
    fmt = m.quantization.tensors[f"{name}.rows8"]
    assert fmt.kind == "int8" and "smoothed" in fmt.role and "calibration output error" in fmt.role   # auto
    codes, scales = stored_weight(path, f"{name}.qcodes"), stored_weight(path, f"{name}.qscales")
    exact = ((codes.astype(np.float32) - 128.0) * scales[:, :, None]).reshape(scales.shape[0], -1)   # [out, in]
    rows8 = stored_weight(path, f"{name}.rows8.weight").astype(np.float32) * stored_weight(path, f"{name}.rows8.scale")
    f = (rows8 * exact.T).sum(axis=1) / (exact.T ** 2).sum(axis=1)     # per input row: rows8 ~ f x W (least squares)
    assert np.abs(rows8 - f[:, None] * exact.T).max() <= stored_weight(path, f"{name}.rows8.scale").max()
    assert f.max() / f.min() > 1.01                                    # the rows were scaled, not copied
    if REAL_INT8_DOT:
        _assert_as_close_to_fp32_as_the_blocks(tiny_model_dir(arch), path, tmp_path)


def _assert_as_close_to_fp32_as_the_blocks(model_dir, calbin, tmp_path) -> None:
    """`calbin`'s prompt logits are within 1.5x the block kernels' distance of the fp32 build's (a tiny
    random model's near-tied logits make greedy tokens of two int8 builds a coin toss: the block
    kernels themselves differ from fp32 in the first token of this prompt). Valid on any CPU."""
    prompt = list(range(3, 40))
    fp32_options = CompileOptions(lanes=2, context=64, prefill_chunks=(4, 16), golden=False, weights="fp32")
    fp32 = generate_on_calbin(compile_calbin(str(model_dir), tmp_path / "fp32.calbin", fp32_options,
                                             log=lambda _m: None), prompt, 8)
    blocks = generate_on_calbin(_compile(model_dir, tmp_path / "blocks.calbin", 0), prompt, 8)
    ours = generate_on_calbin(calbin, prompt, 8)
    off = float(np.abs(blocks.prompt_logits - fp32.prompt_logits).max())
    assert float(np.abs(ours.prompt_logits - fp32.prompt_logits).max()) <= 1.5 * off, off


def test_without_an_int8_dot_the_pass_stores_pair_bounded_codes(tiny_model_dir, tmp_path, monkeypatch):
    """On x86 without VNNI/AMX ONNX Runtime's u8 x s8 GEMM adds neighbouring products along K in 16 bits, so
    there the pass stores int8 codes whose neighbours sum to at most 128 in magnitude (exact on that kernel):
    its scales at most 2 x 127 / 128 as coarse as the full-range ones (a pair holds at most twice a column's
    peak) and typically much less, and the prompt's logits as close to the fp32 build's as the block kernels' are."""
    builds = {}
    for name, flags in (("vnni", VNNI_FLAGS), ("avx2", "avx2,fma,f16c")):
        monkeypatch.setenv(ENV, flags)
        builds[name] = _compile(tiny_model_dir("llama"), tmp_path / f"{name}.calbin", 32)
    m = {k: read_manifest(p) for k, p in builds.items()}
    layers = m["avx2"].model.hyperparameters.num_layers
    assert "prefill-int8" in m["avx2"].passes
    assert _ops(builds["avx2"], "prefill_16")["MatMulIntegerToFloat"] == 3 * layers
    assert _outlier_rank(builds["avx2"], "prefill_16") == _outlier_rank(builds["vnni"], "prefill_16") == {2}
    for proj in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"):
        name = f"model.layers.0.{proj}.weight.rows8"
        codes = {k: stored_weight(path, f"{name}.weight") for k, path in builds.items()}          # [in, out]
        scales = {k: stored_weight(path, f"{name}.scale") for k, path in builds.items()}
        assert codes["avx2"].dtype == np.int8 and codes["vnni"].dtype == np.int8
        assert int(pair_sums(codes["avx2"].T).max()) <= PAIR_SUM_LIMIT < int(pair_sums(codes["vnni"].T).max())
        ratio = scales["avx2"] / scales["vnni"]                  # a pair holds at most twice the peak: <= 2 x 127 / 128
        assert ratio.min() >= 1.0 and ratio.max() <= 2 * 127 / 128 + 1e-6 and np.median(ratio) <= 1.5, ratio
        values = {k: codes[k].astype(np.float64) * scales[k] for k in codes}
        assert np.abs(values["avx2"] - values["vnni"]).max() <= 1.01 * scales["avx2"].max()
        fmt = m["avx2"].quantization.tensors[name]
        assert fmt.pair_sum == PAIR_SUM_LIMIT and "pair-bounded" in fmt.role
        assert m["vnni"].quantization.tensors[name].pair_sum is None
    _assert_as_close_to_fp32_as_the_blocks(tiny_model_dir("llama"), builds["avx2"], tmp_path)


def test_pair_bounded_codes_keep_every_pair_within_the_limit():
    """pair_bounded_codes: per column every neighbouring pair along K (an odd last row with 0) sums to at most
    PAIR_SUM_LIMIT, the largest |code| is 127 or the largest pair reaches the limit, and each value is off
    by at most one step (half a step where no pair needed pulling in)."""
    rng = np.random.default_rng(5)
    for k_in in (64, 65, 640):
        w = rng.standard_normal((96, k_in)) * rng.uniform(0.01, 1.0, (96, 1))
        w[3, :] = 0.0                                            # a column of zeros
        w[4, 10], w[4, 11] = 3.0, -2.9                           # a pair of peaks: the pair sets the scale
        codes, scale = pair_bounded_codes(w)
        assert codes.dtype == np.int8 and scale.dtype == np.float32
        sums = pair_sums(codes)
        assert sums.max() <= PAIR_SUM_LIMIT
        live = np.abs(w).max(axis=1) > 0
        assert np.all((np.abs(codes).max(axis=1) == 127) | (sums.max(axis=1) >= PAIR_SUM_LIMIT - 1) | ~live)
        err = np.abs(codes * scale[:, None].astype(np.float64) - w) / np.where(live, scale, 1)[:, None]
        assert err.max() <= 1.0 + 1e-6
        assert np.median(err) <= 0.5 + 1e-6
        assert not codes[3].any()
        assert abs(int(codes[4, 10])) + abs(int(codes[4, 11])) >= PAIR_SUM_LIMIT - 1


def test_pair_bounded_codes_in_pieces_equal_the_whole(monkeypatch):
    """pair_bounded_codes takes COLUMNS_AT_ONCE output columns at a time (the lm_head copy's float64 temporaries):
    every column is independent, so the pieces give the codes and scales of one pass, uneven last piece included."""
    from calculet.compiler import int8_pairs

    w = np.random.default_rng(7).standard_normal((100, 64)).astype(np.float32)
    whole = pair_bounded_codes(w)
    monkeypatch.setattr(int8_pairs, "COLUMNS_AT_ONCE", 16)
    pieces = pair_bounded_codes(w)
    assert np.array_equal(pieces[0], whole[0]) and np.array_equal(pieces[1], whole[1])
    assert pieces[0].dtype == np.int8 and pieces[1].dtype == np.float32


def test_column_codes_are_full_range_or_pair_bounded():
    """column_codes (the prefill-int8 rows and the coarse head's several-row copy): full range puts each live
    column's largest |value| on code 127 and rounds the rest to nearest; pair-bounded is pair_bounded_codes."""
    rng = np.random.default_rng(6)
    w = (rng.standard_normal((64, 128)) * rng.uniform(0.01, 1.0, (64, 1))).astype(np.float32)
    w[7] = 0.0
    codes, scale = column_codes(w, pair_bounded=False)
    assert codes.dtype == np.int8 and scale.dtype == np.float32
    live = np.arange(64) != 7
    assert np.all(np.abs(codes[live]).max(axis=1) == 127) and not codes[7].any()
    assert np.abs(codes[live] * scale[live, None] - w[live]).max() <= 0.5 * scale.max() * (1 + 1e-6)
    assert pair_sums(codes).max() > PAIR_SUM_LIMIT                 # full range: pairs past the AVX2 limit
    paired, paired_scale = column_codes(w, pair_bounded=True)
    expected = pair_bounded_codes(w)
    assert np.array_equal(paired, expected[0]) and np.array_equal(paired_scale, expected[1])


def test_without_an_int8_dot_prefill_runs_down_proj_from_a_float32_copy(tiny_model_dir, tmp_path, monkeypatch):
    """On x86 without VNNI/AMX ONNX Runtime's 8-bit block kernel emulates its int8 dot products and a
    float32 GEMM is faster in a prefill chunk: the pass stores down_proj's block values in float32 for
    prefill (and decode keeps the blocks); the plan lists the copies (compile checks what it wrote
    against the plan), a VNNI build has none, and the prompt's logits are as close to the fp32 build's
    as the block kernels' are."""
    builds = {}
    for name, flags in (("vnni", VNNI_FLAGS), ("avx2", "avx2,fma,f16c")):
        monkeypatch.setenv(ENV, flags)
        builds[name] = _compile(tiny_model_dir("llama"), tmp_path / f"{name}.calbin", 32)
    m = read_manifest(builds["avx2"])
    layers = m.model.hyperparameters.num_layers
    for graph in ("prefill_4", "prefill_16"):
        ops = _ops(builds["avx2"], graph)
        assert ops["MatMulNBits"] == 0 and ops["MatMulIntegerToFloat"] == 3 * layers, ops
    assert _ops(builds["vnni"], "prefill_16")["MatMulNBits"] == layers
    for graph in ("decode_1", "decode_2"):   # decode-int8 moves gate/up only; down_proj keeps its block kernel there
        assert _ops(builds["avx2"], graph)["MatMulNBits"] == 3 * layers
    name = "model.layers.1.mlp.down_proj.weight"
    codes, scales = stored_weight(builds["avx2"], f"{name}.qcodes"), stored_weight(builds["avx2"], f"{name}.qscales")
    fmt = m.quantization.tensors[f"{name}.f32"]
    assert fmt.kind == "fp32" and "prefill" in fmt.role
    exact = ((codes.astype(np.float32) - 128.0) * scales[:, :, None]).reshape(scales.shape[0], -1)   # [out, in]
    assert np.array_equal(stored_weight(builds["avx2"], f"{name}.f32"), exact.T)
    assert not any(t.name.endswith(".f32") for t in read_manifest(builds["vnni"]).weights.tensors)
    _assert_as_close_to_fp32_as_the_blocks(tiny_model_dir("llama"), builds["avx2"], tmp_path)
    # Sessions (runtime/program.py): without MatMulNBits in prefill only the largest chunk keeps
    # private prepacked copies; with it (VNNI) every session must prepack.
    avx2, vnni = Program(builds["avx2"]), Program(builds["vnni"])
    assert {g.name: avx2._prepacks(g) for g in avx2.graphs} == {
        "prefill_4": False, "prefill_16": True, "decode_1": True, "decode_2": True, "head_1": True, "head_2": True}
    assert all(vnni._prepacks(g) for g in vnni.graphs)


def test_without_an_int8_dot_decode_runs_the_int8_rows_and_batched_equals_alone(tiny_model_dir, tmp_path, monkeypatch):
    """decode-int8: where the CPU has no int8 dot, every decode graph (decode_1 and decode_n alike) runs
    gate/up (by default; --decode-int8 all: qkv and o_proj too) on the pass's int8 rows, the others and
    down_proj on their block kernels, never the float32 copy; the manifest lists the pass; --decode-int8 off
    and a VNNI build keep decode on the block kernels. A prompt decoded alone gives the tokens it gives
    beside others (per-row scales: no row depends on another), and its logits stay as close to the fp32
    build's as the block kernels' are, in both formulations."""
    monkeypatch.setenv(ENV, "avx2,fma,f16c")
    path = _compile(tiny_model_dir("llama"), tmp_path / "avx2.calbin", 32)
    every = _compile(tiny_model_dir("llama"), tmp_path / "avx2-all.calbin", 32, decode_int8="all")
    off = _compile(tiny_model_dir("llama"), tmp_path / "avx2-off.calbin", 32, decode_int8="off")
    m = read_manifest(path)
    layers = m.model.hyperparameters.num_layers
    assert "decode-int8" in m.passes and "decode-int8" in read_manifest(every).passes
    assert "decode-int8" not in read_manifest(off).passes
    for graph in ("decode_1", "decode_2"):
        for build, moved in ((path, 1), (every, 3)):
            ops = _ops(build, graph)
            assert ops["MatMulIntegerToFloat"] == moved * layers and ops["MatMulNBits"] == (4 - moved) * layers, ops
            assert ops["MatMul"] == moved * layers, ops          # the float32 outlier channels; no f32 down_proj
        assert _ops(off, graph)["MatMulNBits"] == 4 * layers
    assert _ops(path, "prefill_16")["MatMulIntegerToFloat"] == 3 * layers   # prefill keeps all three
    monkeypatch.setenv(ENV, VNNI_FLAGS)
    vnni = _compile(tiny_model_dir("llama"), tmp_path / "vnni.calbin", 32)
    assert "decode-int8" not in read_manifest(vnni).passes and _ops(vnni, "decode_2")["MatMulNBits"] == 4 * layers
    from calculet.runtime.device import Device

    prompts = [np.random.default_rng(s).integers(3, 300, size=n).tolist() for s, n in ((1, 9), (2, 21))]
    for build in (path, every):
        d = Device()
        d.configure(d.load(build))
        try:
            together = greedy_together(d, prompts, 8)
            alone = [greedy_together(d, [p], 8)[0] for p in prompts]
        finally:
            d.close()
        assert together == alone
        _assert_as_close_to_fp32_as_the_blocks(tiny_model_dir("llama"), build, tmp_path)


def test_with_amx_prefill_runs_down_proj_as_the_two_level_int8_gemm(tiny_model_dir, tmp_path, monkeypatch):
    """With AMX the pass also runs down_proj in prefill chunks, as the two-level int8 GEMM over its
    per-column int8 codes (no outlier channels, no MatMulNBits left in prefill); decode keeps the blocks;
    every session prepacks; the plan lists the codes (compile checks what it wrote against the plan); a
    VNNI build has none of it. Where this CPU has an int8 dot product, the prompt's logits are as close
    to the fp32 build's as the block kernels' are."""
    monkeypatch.setenv(ENV, AMX_FLAGS)
    path = _compile(tiny_model_dir("llama"), tmp_path / "amx.calbin", 32)
    m = read_manifest(path)
    layers = m.model.hyperparameters.num_layers
    for graph in ("prefill_4", "prefill_16"):
        ops = _ops(path, graph)
        assert ops["MatMulNBits"] == 0 and ops["MatMulIntegerToFloat"] == 4 * layers, ops
        assert ops["Round"] == layers and ops["DequantizeLinear"] == 0, ops   # one residue per down_proj, no blocked DQ
        assert _outlier_rank(path, graph) == {3}   # the outlier channels added apart from their MatMul (AMX)
    for graph in ("decode_1", "decode_2"):
        ops = _ops(path, graph)
        assert ops["MatMulIntegerToFloat"] == 0 and ops["MatMulNBits"] == 4 * layers, ops
    name = "model.layers.1.mlp.down_proj.weight"
    fmt = m.quantization.tensors[f"{name}.rows8"]
    assert fmt.kind == "int8" and "two-level" in fmt.role
    names = {t.name for t in m.weights.tensors}
    assert f"{name}.rows8.weight" in names and f"{name}.outliers.weight" not in names
    codes, scales = stored_weight(path, f"{name}.qcodes"), stored_weight(path, f"{name}.qscales")
    exact = ((codes.astype(np.float32) - 128.0) * scales[:, :, None]).reshape(scales.shape[0], -1)   # [out, in]
    rows8 = stored_weight(path, f"{name}.rows8.weight").astype(np.float32) * stored_weight(path, f"{name}.rows8.scale")
    assert np.abs(rows8 - exact.T).max() <= 0.5 * stored_weight(path, f"{name}.rows8.scale").max() * (1 + 1e-6)
    assert all(Program(path)._prepacks(g) for g in Program(path).graphs)
    monkeypatch.setenv(ENV, VNNI_FLAGS)
    vnni = _compile(tiny_model_dir("llama"), tmp_path / "vnni.calbin", 32)
    assert not any(t.name.endswith("down_proj.weight.rows8.weight") for t in read_manifest(vnni).weights.tensors)
    if REAL_INT8_DOT:
        _assert_as_close_to_fp32_as_the_blocks(tiny_model_dir("llama"), path, tmp_path)


def test_the_pass_stays_off_where_it_cannot_run():
    vnni = CpuFeatures(tuple(VNNI_FLAGS.split(",")), "test", "x86_64")
    assert "portable" in prefill_int8.applicable(CompileOptions(target="portable", weights="int8",
                                                                prefill_int8_outliers=8), vnni)
    assert prefill_int8.applicable(CompileOptions(prefill_int8_outliers=0), vnni).startswith("off")
    assert prefill_int8.applicable(CompileOptions(prefill_int8_outliers=8), vnni) is None
    assert prefill_int8.applicable(CompileOptions(prefill_int8_outliers=8), AVX2) is None
    assert "not x86" in prefill_int8.applicable(CompileOptions(prefill_int8_outliers=8),
                                                CpuFeatures((), "test", "aarch64"))
    with pytest.raises(Exception, match="prefill-int8-outliers"):
        CompileOptions(prefill_int8_outliers=-1)
    with pytest.raises(Exception, match=r"prefill-int8-smooth must be auto or in \[0, 1\)"):
        CompileOptions(prefill_int8_smooth=1.5)
    with pytest.raises(Exception, match="--decode-int8 must be one of gate-up, all, off, got 'qkv'"):
        CompileOptions(decode_int8="qkv")
    assert prefill_int8.decode_int8(CompileOptions(), AVX2) == (".mlp.gate_up_proj.weight",)
    assert prefill_int8.decode_int8(CompileOptions(decode_int8="all"), AVX2) == tuple(prefill_int8.PROJECTED)
    assert prefill_int8.decode_int8(CompileOptions(decode_int8="off"), AVX2) == ()
    assert prefill_int8.decode_int8(CompileOptions(), vnni) == ()
    assert prefill_int8.decode_int8(CompileOptions(prefill_int8_outliers=0), AVX2) == ()
    from calculet.compiler.cli import parse_smooth
    assert parse_smooth("auto") is None and parse_smooth("0.6") == 0.6
    with pytest.raises(Exception, match="auto or a number"):
        parse_smooth("strong")


def test_loading_on_a_cpu_without_int8_dot_warns(tiny_model_dir, tmp_path, monkeypatch):
    vnni = CpuFeatures(tuple(VNNI_FLAGS.split(",")), "t", "x86_64")
    monkeypatch.setenv(ENV, VNNI_FLAGS)
    m = read_manifest(_compile(tiny_model_dir("llama"), tmp_path / "on.calbin", 8))
    assert any("prefill-int8" in w and "saturate" in w for w in load_warnings(m, AVX2))
    assert not any("prefill-int8" in w for w in load_warnings(m, vnni))
    monkeypatch.setenv(ENV, "avx2,fma,f16c")     # the AVX2 build (pair-bounded codes) is exact there, coarser than VNNI needs
    m2 = read_manifest(_compile(tiny_model_dir("llama"), tmp_path / "avx2.calbin", 8))
    assert not any("prefill-int8" in w for w in load_warnings(m2, AVX2))
    assert any("pair-bounded" in w and "recompile" in w for w in load_warnings(m2, vnni))


def _store_with(w: np.ndarray, name: str) -> WeightStore:
    """A store holding `w` [out, in] as the default policy's int8 blocks, like store_weights."""
    fmt = QuantFormat("int8", 32, "int8")
    put = quantize(w, fmt)
    store = WeightStore()
    store.add_quantized(name, QuantInfo(8, 32, w.shape[0], w.shape[1], fmt.accuracy_level), put.codes, put.scales)
    return store


def _run(g: GraphBuilder, store: WeightStore, x: np.ndarray) -> np.ndarray:
    """g's one output for the input x, its external weights inlined from `store`."""
    model = g.build()
    for init in model.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            init.CopyFrom(onnx.numpy_helper.from_array(store.array(init.name), init.name))
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def _linear_output(store: WeightStore, name: str, x: np.ndarray) -> np.ndarray:
    """prefill_int8.linear of `name` (its weights already added to `store`) on x [1, rows, in]."""
    _, rows, k_in = x.shape
    g = GraphBuilder("t", store)
    g.input("x", np.dtype(np.float32), (1, rows, k_in))
    g.output(prefill_int8.linear(g, "x", name, 1, rows, "/t"), "y", np.dtype(np.float32), (1, rows, store.quant(name).n))
    return _run(g, store, x)


@needs_int8_dot
def test_outlier_channels_keep_the_product_close_where_per_token_scales_alone_do_not():
    """x with a few huge channels (Gemma's residual stream): per-token int8 alone loses the small ones;
    with those channels in float32 the product is within the int8 rounding of the exact one."""
    rng = np.random.default_rng(0)
    k_in, n_out, rows, name = 128, 96, 16, "model.layers.0.self_attn.qkv_proj.weight"
    w = rng.standard_normal((n_out, k_in)).astype(np.float32) * 0.05
    x = rng.standard_normal((1, rows, k_in)).astype(np.float32)
    hot = np.array([3, 50, 101])
    x[..., hot] *= 300.0
    exact = None
    errors = {}
    for k, ids in ((3, hot), (0, np.zeros(0, np.int64))):
        store = _store_with(w, name)
        exact = ((store.array(f"{name}.qcodes").astype(np.float32) - 128) * store.array(f"{name}.qscales")[:, :, None]
                 ).reshape(n_out, k_in)
        record = {name: {"module": "attention"}}
        prefill_int8.add_weights(store, record, {name: np.asarray(ids, np.int64)})
        y = _linear_output(store, name, x)
        errors[k] = float(np.abs(y - x @ exact.T).max() / np.abs(x @ exact.T).max())
    assert errors[3] < 0.01, errors
    assert errors[0] > 5 * errors[3], errors


@pytest.mark.parametrize("code_range", [FULL_INT8_RANGE, 63])
def test_a_row_of_zeros_gives_zeros_and_leaves_its_neighbours_alone(code_range):
    """row_scales has no floor: a row whose inliers are all zero gets scale 0, and its output is exactly
    the float32 outlier product (here 0 as well), finite; the other rows equal the same rows run alone."""
    rng = np.random.default_rng(3)
    k_in, n_out, rows, name = 128, 64, 4, "model.layers.0.mlp.gate_up_proj.weight"
    w = rng.standard_normal((n_out, k_in)).astype(np.float32) * 0.05
    store = _store_with(w, name)
    prefill_int8.add_weights(store, {name: {"module": "mlp"}}, {name: np.array([5, 77])}, code_range)
    x = rng.standard_normal((1, rows, k_in)).astype(np.float32)
    x[0, 1] = 0.0                                       # every channel
    x[0, 3] = 0.0
    x[0, 3, [5, 77]] = 40.0                             # outliers only: the int8 part sees zeros
    y = _linear_output(store, name, x)
    assert np.isfinite(y).all()
    assert not y[0, 1].any()
    outliers = store.array(f"{name}.outliers.weight")   # [k, out]
    np.testing.assert_allclose(y[0, 3], x[0, 3, [5, 77]] @ outliers, rtol=1e-6)
    for r in (0, 2):
        alone = _linear_output(store, name, x[:, r:r + 1])
        np.testing.assert_array_equal(y[0, r], alone[0, 0])


@needs_int8_dot
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_float32_outlier_channels_give_the_block_kernels_greedy_tokens(arch, tiny_model_dir, tmp_path):
    """The float32-channel formulation (the default) on this prompt. The smoothed one is held to the
    distance to fp32 (test_smoothing_replaces_the_float32_channels): on these random tiny models greedy
    tokens are a coin toss between int8 builds (over 12 prompts the block kernels themselves matched fp32
    on 7 for gemma3; the float32 channels 8, smoothing with alpha 0.5 6)."""
    prompt = np.random.default_rng(5).integers(3, 300, size=21).tolist()
    off = generate_on_calbin(_compile(tiny_model_dir(arch), tmp_path / "off.calbin", 0), prompt)
    on = generate_on_calbin(_compile(tiny_model_dir(arch), tmp_path / "k32.calbin", 32, prefill_int8_smooth=0.0), prompt)
    assert on.tokens == off.tokens
    assert np.abs(on.prompt_logits - off.prompt_logits).max() < 0.05 * np.abs(off.prompt_logits).max()


@needs_int8_dot
def test_smoothing_keeps_the_product_close_where_per_token_scales_alone_do_not():
    """The same huge channels as above: divided by their smoothing factors (W's rows multiplied) the
    per-token int8 product stays within a few int8 roundings of the exact one, where the plain per-token
    GEMM (alpha 0 moves nothing) loses the small channels."""
    rng = np.random.default_rng(0)
    k_in, n_out, rows, name = 128, 96, 16, "model.layers.0.self_attn.qkv_proj.weight"
    w = rng.standard_normal((n_out, k_in)).astype(np.float32) * 0.05
    x = rng.standard_normal((1, rows, k_in)).astype(np.float32)
    x[..., [3, 50, 101]] *= 300.0
    errors = {}
    for alpha in (0.5, 1e-9):
        store = _store_with(w, name)
        exact = ((store.array(f"{name}.qcodes").astype(np.float32) - 128) * store.array(f"{name}.qscales")[:, :, None]
                 ).reshape(n_out, k_in)
        prefill_int8.add_smoothed_weights(store, {name: {"module": "attention"}}, {name: x[0]}, alpha)  # calibrated on x
        y = _linear_output(store, name, x)
        errors[alpha] = float(np.abs(y - x @ exact.T).max() / np.abs(x @ exact.T).max())
    assert errors[0.5] < 0.02, errors
    assert errors[1e-9] > 3 * errors[0.5], errors


@needs_int8_dot
def test_the_searched_alpha_is_the_one_whose_graph_is_closest():
    """auto (alpha None): each projection takes the candidate with the least simulated output error on its
    calibration rows, the simulation is the graph's own rounding (its error on the calibration rows matches
    the ONNX Runtime graph's within a few percent), and the record names the choice."""
    rng = np.random.default_rng(3)
    k_in, n_out, rows, name = 128, 96, 64, "model.layers.0.mlp.gate_up_proj.weight"
    w = rng.standard_normal((n_out, k_in)).astype(np.float32) * 0.05
    w[:, 7] *= 20.0                                    # one heavy weight row as well as heavy input channels
    x = rng.standard_normal((1, rows, k_in)).astype(np.float32)
    x[..., [3, 50]] *= 200.0
    store = _store_with(w, name)
    exact_w = ((store.array(f"{name}.qcodes").astype(np.float32) - 128) * store.array(f"{name}.qscales")[:, :, None]
               ).reshape(n_out, k_in)
    errors = {a: prefill_int8.smoothed_error(exact_w, x[0], a) for a in prefill_int8.SMOOTH_ALPHAS}
    alpha, err = prefill_int8.smoothing_alpha(exact_w, x[0])
    assert err == min(errors.values()) and errors[alpha] == err
    assert max(errors.values()) > 1.2 * err                # the candidates differ: the choice matters
    record = {name: {"module": "mlp"}}
    prefill_int8.add_smoothed_weights(store, record, {name: x[0]}, None)
    assert f"alpha {alpha:g} of" in record[f"{name}.rows8"]["role"]
    exact = x[0] @ exact_w.T
    graph_err = float(np.linalg.norm(_linear_output(store, name, x)[0] - exact) / np.linalg.norm(exact))
    assert abs(graph_err - err) <= 0.05 * err, (graph_err, err)


def test_smoothing_factors_move_the_range_and_ignore_dead_channels():
    """f = max|x|^alpha / max|W|^(1-alpha), geometric mean 1; a channel calibration never saw move is
    floored (no zero or infinite factor)."""
    w = np.full((4, 3), 0.1, np.float32)
    peak = np.array([1.0, 100.0, 0.0], np.float32)
    f = prefill_int8.smoothing_factors(w, peak, 0.5)
    assert np.isfinite(f).all() and (f > 0).all()
    assert np.isclose(np.exp(np.log(f).mean()), 1.0, rtol=1e-5)
    assert np.isclose(f[1] / f[0], 10.0, rtol=1e-5)                  # sqrt(100 / 1) at equal |W|
    assert np.isclose(f[2] / f[0], np.sqrt(prefill_int8.SMOOTH_FLOOR * 1.0), rtol=1e-4)   # floored at the median's share


@needs_int8_dot
def test_two_levels_keep_outliers_that_move_from_token_to_token():
    """down_proj's input has outliers in different channels per token, which fixed float32 channels do not
    catch: one per-token int8 level then loses the small channels, while the two-level GEMM (the residue
    quantized again on a 254x finer scale) is within the weights' own int8 rounding of the exact product."""
    rng = np.random.default_rng(1)
    k_in, n_out, rows, name = 256, 64, 16, "model.layers.0.mlp.down_proj.weight"
    w = rng.standard_normal((n_out, k_in)).astype(np.float32) * 0.05
    x = rng.standard_normal((1, rows, k_in)).astype(np.float32)
    x[0, np.arange(rows), rng.integers(0, k_in, rows)] *= 500.0          # one outlier per token, anywhere
    store = _store_with(w, name)
    prefill_int8.add_two_level_weights(_Spec(1), store, {name: {"module": "mlp"}})
    int8_values = store.array(f"{name}.rows8.weight").astype(np.float32) * store.array(f"{name}.rows8.scale")  # [in, out]
    exact = x[0] @ int8_values
    errors = {}
    for kind in ("two-level", "one level"):
        g = GraphBuilder("t", store)
        g.input("x", np.dtype(np.float32), (1, rows, k_in))
        if kind == "two-level":
            y = prefill_int8.linear(g, "x", name, 1, rows, "/t")
        else:
            product, scale = prefill_int8.per_row_int8_product(
                g, g.op("Reshape", ["x", g.const([rows, k_in])], name="/t/Rows"), f"{name}.rows8", rows, "/t")
            y = g.op("Mul", [product, scale], name="/t/Scaled")
        g.output(y, "y", np.dtype(np.float32), (1, rows, n_out) if kind == "two-level" else (rows, n_out))
        out = _run(g, store, x)
        errors[kind] = float(np.abs(out.reshape(rows, n_out) - exact).max() / np.abs(exact).max())
    assert errors["two-level"] < 1e-3, errors
    assert errors["one level"] > 20 * errors["two-level"], errors


@pytest.mark.parametrize("code_range", [FULL_INT8_RANGE, 63])
def test_row_scales_inside_the_int8_product_equal_a_mul_after_it(code_range):
    """per_row_int8_linear hands the row scales to MatMulIntegerToFloat as its a_scale [R, 1]: the same
    float32 values bit for bit as the product times the row scales in a Mul after it, row by row."""
    rng = np.random.default_rng(4)
    k_in, n_out, rows, name = 128, 80, 12, "model.layers.0.mlp.down_proj.weight"
    w = rng.standard_normal((n_out, k_in)).astype(np.float32) * 0.05
    x = rng.standard_normal((1, rows, k_in)).astype(np.float32) * rng.uniform(0.01, 50.0, (1, rows, 1)).astype(np.float32)
    store = _store_with(w, name)
    prefill_int8._add_rows8(store, {name: {"module": "mlp"}}, name, w, np.zeros(0, np.int64), code_range, "t", "t")
    g = GraphBuilder("t", store)
    g.input("x", np.dtype(np.float32), (1, rows, k_in))
    flat = g.op("Reshape", ["x", g.const([rows, k_in])], name="/t/Rows")
    inside = prefill_int8.per_row_int8_linear(g, flat, f"{name}.rows8", rows, "/in")
    product, scale = prefill_int8.per_row_int8_product(g, flat, f"{name}.rows8", rows, "/after")
    after = g.op("Mul", [product, scale], name="/after/Scaled")
    g.output(g.op("Concat", [inside, after], name="/t/Both", axis=0), "y", np.dtype(np.float32), (2 * rows, n_out))
    both = _run(g, store, x)
    assert np.abs(both[:rows]).max() > 0
    np.testing.assert_array_equal(both[:rows], both[rows:])


def test_the_two_level_residue_equals_dequantizing_the_first_level():
    """two_level_linear takes s1 q1's value as Round(x / s1) * s1 instead of the blocked DequantizeLinear (slow in
    ONNX Runtime 1.32): the same float32 values bit for bit, half-way ties and the row's peak included."""
    rng = np.random.default_rng(5)
    rows, k_in = 6, 64
    x = rng.standard_normal((rows, k_in)).astype(np.float32) * rng.uniform(0.01, 100.0, (rows, 1)).astype(np.float32)
    s1 = (np.abs(x).max(axis=1, keepdims=True) / np.float32(127.0)).astype(np.float32)
    x[:, :8] = (np.arange(-4, 4, dtype=np.float32) + np.float32(0.5)) * s1   # ties: round half to even
    g = GraphBuilder("t", WeightStore())
    g.input("x", np.dtype(np.float32), (rows, k_in))
    scale = prefill_int8.row_scales(g, "x", "/t")
    codes = prefill_int8.row_codes(g, "x", scale, rows, k_in, "/t/Q")
    blocked = g.op("DequantizeLinear", [codes, scale, g.const(np.full((rows, 1), 128), np.uint8)], name="/t/DQ", axis=1,
                   block_size=k_in)
    rounded = g.op("Mul", [g.op("Round", [g.op("Div", ["x", scale], name="/t/Steps")], name="/t/Round"), scale], name="/t/Back")
    g.output(g.op("Concat", [blocked, rounded], name="/t/Both", axis=0), "y", np.dtype(np.float32), (2 * rows, k_in))
    both = _run(g, WeightStore(), x)
    np.testing.assert_array_equal(both[:rows], both[rows:])


def test_a_row_of_zeros_through_two_levels_gives_zeros():
    """A zero row has s1 = s2 = 0 (no floor): its codes are arbitrary, its output exactly 0 and finite, and the
    other rows equal themselves alone."""
    rng = np.random.default_rng(6)
    k_in, n_out, rows, name = 128, 32, 3, "model.layers.0.mlp.down_proj.weight"
    store = _store_with(rng.standard_normal((n_out, k_in)).astype(np.float32) * 0.05, name)
    prefill_int8.add_two_level_weights(_Spec(1), store, {name: {"module": "mlp"}})
    x = rng.standard_normal((1, rows, k_in)).astype(np.float32)
    x[0, 1] = 0.0
    y = _linear_output(store, name, x)
    assert np.isfinite(y).all() and not y[0, 1].any()
    for r in (0, 2):
        np.testing.assert_array_equal(y[0, r], _linear_output(store, name, x[:, r:r + 1])[0, 0])


class _Spec:
    """The one field add_two_level_weights reads of a ModelSpec."""

    def __init__(self, num_layers: int):
        self.num_layers = num_layers
