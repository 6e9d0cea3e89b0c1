"""The "prefill-int8" pass: prefill chunks run the projections that read a norm's output, and o_proj,
as an int8 GEMM with one activation scale per token, with the few input channels that carry outliers kept
in float32 (the default) or over inputs smoothed per channel (the `cpu` target, one chip, an x86 CPU).

Decode steps keep the block kernels (MatMulNBits: 32-wide activation blocks, the GGUF's weights
exactly), except gate/up where the CPU has no int8 dot (decode_int8). A prefill chunk has many rows,
where ONNX Runtime's int8 GEMM is about twice as fast as the block kernels, but one int8 scale per
token is too coarse for Gemma's activations on its own: a handful of channels of the residual stream
are hundreds of times larger than the rest and set every token's scale. Two formulations handle them,
per projection W [in, out] (the packed qkv and gate/up, o_proj; see PROJECTED):

  float32 outlier channels (the default: --prefill-int8-smooth 0, --prefill-int8-outliers K):

    ids      = the k input channels with the largest |x| on calibration text       [k]
    x_in     = x with those channels zeroed                                         [R, in]
    y        = (u8(x_in / s) . W8) * s * w_scale  +  x[:, ids] . W[ids, :]          [R, out]
               s = max|x_in| / 127 per row; W8 = W with the rows `ids` zeroed, int8 per column

  smoothing (--prefill-int8-smooth auto|ALPHA; SmoothQuant's migration of range from the activations
  to the weights; auto: per projection the alpha of SMOOTH_ALPHAS whose simulated output error on the
  calibration rows is least):

    f        = max|x_c|^alpha / max|W_c|^(1 - alpha) per input channel c, geometric mean 1    [in]
    y        = (u8((x / f) / s) . W8f) * s * w_scale                                         [R, out]
               s = max|x / f| / 127 per row; W8f = W with row c times f_c, int8 per column

Smoothing leaves one GEMM and one Mul per projection where the float32 channels need a Gather, a
float32 MatMul of K rows and an Add over the [R, out] output (memory-bound). It is faster and coarser,
so it is an option, not the default. Measured 2026-12-06 on a 2-core AMD EPYC Zen 5 (AVX-512 VNNI),
default model: a 1,000-token prefill (benchmarks/prefill_ab.py, 7 alternating rounds, alpha 0.5) 493
against 603 ms (0.82x; the block kernels 625 ms); per projection on the calibration rows, relative
output error (mean over layers, qkv / o_proj / gate-up) 0.0066 / 0.0083 / 0.0079 with the float32
channels, 0.0102 / 0.0087 / 0.0115 smoothed with the best alpha, 0.0095 / 0.0053 / 0.0091 for the
block kernels' per-32 activation blocks; on the 100-prompt reference set (docs/NUMERICS.md)
teacher-forced agreement 0.9753 (float32 channels), 0.9675 (auto), 0.9663 (alpha 0.5).

Calibration runs the model itself: a probe build of the same source (compiled without this pass)
prefills four 128-token passages of the project's English text (calculet.reference.texts, a span
that neither the perplexity evaluation nor the reference sets read; no torch), and each
projection's input (a norm's output, or the probe `...o_proj:input`) gives the per-channel maximum |x|
(and, for smoothing, the rows its alpha is chosen on).

Measured on the default model (2-core EPYC with AVX-512 VNNI, onnxruntime 1.32): qkv and gate/up of
a 128-token chunk 4.0 -> 2.1 ms (best of 7), o_proj 14.9 -> 7.3 + 2.1 ms of a profiled chunk (18
layers); in a torch simulation over the golden set, teacher-forced agreement 0.979 with k = 32 on
qkv and gate/up, 0.984 with o_proj as well (the block kernels: 0.964).

On a CPU without an int8 dot product (x86 without VNNI/AMX) ONNX Runtime's u8 x s8 kernel adds pairs
of products in 16 bits (vpmaddubsw) and saturates with full-range codes. There the codes are
pair-bounded (compiler/int8_pairs.py: neighbours along K within 128 in magnitude, about 0.4 bits
coarser per column), which that kernel multiplies exactly. Until 2026-12-07 they were stored as uint8
for the exact u8 x u8 kernel, the full-range codes at 1.7x the u8 x s8 time (18 products [640 -> 4,096]
at 8 rows through a Xeon's AVX2 view: 8.5 against 5.1 ms); against that build, through the same view,
a 200-token prefill 0.94x, a 1,000-token one 0.88x, the decode step 0.95x at one lane and 0.92x at 8
(gate/up on the rows), teacher-forced agreement on the 100-prompt set 0.9756 -> 0.9716 and gate F
passing (docs/NUMERICS.md). Against the block kernels a 200-token prefill there took 0.76x the time
(406 against 538 ms, the u8 x u8 build); 7-bit codes were faster (0.62x) but failed gate F's top-10
overlap. CpuFeatures.int8_code_range says which CPU is which. There down_proj, which stays off the
int8 GEMM, runs in prefill chunks as a float32 GEMM from a float32 copy of its block values (FLOAT32_PREFILL): faster than the emulated
8-bit block kernel, and closer to the reference (on a real AVX2-only EPYC, default model, 8 lanes,
context 1,024: a 201-token prefill 0.87-0.91x, gate F teacher-forced 0.9479 -> 0.9740, worst max
logit error 0.81 -> 0.35; docs/NUMERICS.md).

On a CPU with AMX the u8 x s8 GEMM runs on the tile unit, and there down_proj joins the int8 GEMMs in
prefill chunks in a second formulation (TWO_LEVEL_PREFILL) that needs no calibration: each token's
input is quantized twice, the second time its rounding residue on a 254x finer scale,

    q1 = u8(x / s1)          s1 = max|x| / 127 per row
    q2 = u8((x - s1 q1) / s2)  s2 = s1 / 254
    y  = (s1 (q1 . W8) + s2 (q2 . W8)) * w_scale       one GEMM over the rows [q1; q2]

so the activations keep about 15 bits however far the outliers move (a down_proj input's largest
element is 100-4,000x its median), and what remains is the per-column int8 weight rounding. Over 512
tokens of English text in the fp32 reference, per layer: relative output error 0.018 (the weight
rounding alone 0.018), against 0.016 for the block kernel's per-32 activation blocks and 0.12 for
one level. A 128-row [2048 -> 640] product: 0.91 against 1.47 ms for the 8-bit block kernel; without
AMX (benchmarks/isa_view --kind no-amx, the same cores) 1.3-1.6 against 1.45: no gain, so only AMX
builds use it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from calculet.compiler.builder import MS_DOMAIN, GraphBuilder
from calculet.compiler.int8_pairs import PAIR_SUM_LIMIT, column_codes
from calculet.compiler.quantize import INT8_ACCURACY_LEVEL, int8_block_values
from calculet.cpu_features import FULL_INT8_RANGE, CpuFeatures
from calculet.models.base import ModelSpec

CALIBRATION_TOKENS = 128   # one prefill chunk per passage
CALIBRATION_PASSAGES = 4
# Characters of calculet.reference.texts.english_docs_text() the calibration reads: away from its start,
# which the perplexity evaluation and the reference sets' fillers read.
CALIBRATION_SPAN = slice(300_000, 340_000)


def outlier_count(k: int, width: int) -> int:
    """Channels kept in float32 per projection: k, but at most an eighth of its input width (a tiny
    model's 64-wide input keeps 8)."""
    return min(k, max(1, width // 8))


# The projections the pass runs: (weight suffix in a layer, what its input is). A norm's output, or
# the input of o_proj (the attention's context), exposed as the probe `<...>.o_proj:input`.
# down_proj stays on the block kernels: its input (gelu(gate) * up) has outliers that move from token
# to token, and fixed float32 channels do not catch them (a torch simulation over the golden set:
# teacher-forced agreement 0.948-0.953 with down_proj converted, 0.984 without; see NUMERICS.md).
MLP_NORM = "<the family's norm before the MLP>"
PROJECTED = {".self_attn.qkv_proj.weight": "input_layernorm",        # in the weight plan's order
             ".self_attn.o_proj.weight": "self_attn.o_proj:input",
             ".mlp.gate_up_proj.weight": MLP_NORM}
# Where the CPU has no int8 dot product (x86 without VNNI/AMX) ONNX Runtime's 8-bit block kernel
# emulates its dot products, and in a prefill chunk a float32 GEMM over the block codes' exact values
# beats it: down_proj [2048 -> 640] at 128 rows 4.45 against 6.27 ms, at 64 rows 1.45 against 1.85 ms
# (AVX2-only EPYC, 2 threads, 30 alternating calls). So there prefill chunks run FLOAT32_PREFILL
# from a float32 copy (the same weights as the block codes, and no activation rounding). Decode keeps
# the block kernels, which are faster for a few rows (memory-bound: a quarter of the bytes).
FLOAT32_PREFILL = (".mlp.down_proj.weight",)
# With AMX: the weights prefill chunks run as the two-level int8 GEMM (module docstring). Their codes are
# stored as `<weight>.rows8` like PROJECTED's, without outlier channels.
TWO_LEVEL_PREFILL = (".mlp.down_proj.weight",)
# decode-int8 (decode_int8): per --decode-int8 name, the projections decode graphs run on the int8 rows
# where the CPU has no int8 dot. gate/up alone holds most of the 8-lane gain at a fraction of the glue.
DECODE_INT8 = {"gate-up": (".mlp.gate_up_proj.weight",), "all": tuple(PROJECTED), "off": ()}
SMOOTH_ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)   # smoothing_alpha's candidates (--prefill-int8-smooth auto)
SEARCH_ROWS = 256       # calibration rows smoothing_alpha scores each candidate on
SMOOTH_FLOOR = 1e-3     # smoothing_factors: a channel's |x| or |W| peak counts as at least this share of the median
RESIDUE_STEPS = 254.0   # s2 = s1 / RESIDUE_STEPS: |x - s1 q1| <= s1 / 2, so |q2 - 128| <= 127


@dataclass(frozen=True)
class Projection:
    weight: str   # e.g. model.layers.3.self_attn.qkv_proj.weight
    source: str   # the probe that equals its input, e.g. model.layers.3.input_layernorm


def projections(spec: ModelSpec, store) -> list[Projection]:
    """The projections of PROJECTED that the store holds as int8 blocks with int8 compute, with the probes of
    their inputs. A weight-only int8 block (fp32 compute: the `int8` policy, `--quant X=int8`) is a numerics
    reference for the weights' error alone, so its activations are never quantized: it keeps its block kernel
    (on tiny random models, W8A8 prefill chunks had pushed the int8 policy's logprob error past its bound)."""
    mlp_norm = "pre_feedforward_layernorm" if spec.family == "gemma3" else "post_attention_layernorm"
    out = []
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        for suffix, source in PROJECTED.items():
            weight = p + suffix
            q = store.quant(weight)
            if q is not None and q.bits == 8 and q.accuracy_level == INT8_ACCURACY_LEVEL:
                out.append(Projection(weight, f"{p}.{mlp_norm if source == MLP_NORM else source}"))
    return out


def smooths(options) -> bool:
    """Whether the pass smooths its inputs (--prefill-int8-smooth auto or an alpha) rather than keeping
    float32 outlier channels (0)."""
    alpha = getattr(options, "prefill_int8_smooth", 0.0)   # CompileOptions' and PlanRequest's default
    return alpha is None or alpha > 0


def decode_int8(options, cpu: CpuFeatures | None) -> tuple[str, ...]:
    """The weight suffixes of PROJECTED that decode graphs run on the pass's int8 rows (down_proj keeps its
    block kernel): where the pass runs on x86 without an int8 dot, DECODE_INT8[--decode-int8] (default
    gate/up only), else none. ONNX Runtime emulates the 8-bit block kernel's dot products there, and the
    exact u8 x u8 GEMM beats it at 8 lanes, but each projection moved adds about 11 small nodes of glue
    (row scales, codes, the float32 channels), which one lane pays. Through a Zen 4 EPYC's AVX2 view, decode
    steps at a 128-token context, 60 alternating rounds (benchmarks/RESULTS.md, 2026-12-07): against
    all three projections moved, gate/up alone 0.91x at one lane and 1.03x at eight; the block kernels 0.89x
    and 1.10x. With VNNI or AMX it did not pay (all three: 0.98x and 0.91x at 8 lanes, 1.04x and 1.11x at one;
    gate/up alone on an AMX Xeon 0.946x and 0.989x, through its no-AMX view 0.961x and 1.026x, for teacher-forced
    agreement 0.9772 -> 0.9728 natively: benchmarks/RESULTS.md, 2026-12-07 (5)). Where there is no int8 dot the
    rows are pair-bounded for the u8 x s8 kernel (compiler/int8_pairs.py); the figures above were taken on
    their u8 x u8 predecessor."""
    if cpu is None or not getattr(options, "prefill_int8_outliers", 0) or not float32_prefill(cpu):
        return ()
    return DECODE_INT8[getattr(options, "decode_int8", "gate-up")]


def float32_prefill(cpu: CpuFeatures) -> bool:
    """Whether prefill chunks on `cpu` run FLOAT32_PREFILL from float32 copies (x86 without an int8 dot)."""
    return cpu.x86 and cpu.int8_dot is None


def two_level_prefill(cpu: CpuFeatures) -> bool:
    """Whether prefill chunks on `cpu` run TWO_LEVEL_PREFILL as the two-level int8 GEMM (x86 with AMX)."""
    return cpu.x86 and cpu.has("amx_int8")


def outlier_add_apart(cpu: CpuFeatures) -> bool:
    """Whether prefill chunks on `cpu` add the float32 outlier channels' product as a 3-D MatMul and Add, which
    ONNX Runtime leaves apart, rather than as 2-D ones, which it fuses into one Gemm (the same values bit for bit).
    Apart, a 1,000-token prefill of the default model took 0.95-0.97x the time on an AMX Xeon (21-31 alternating
    rounds, both orders), 0.99x through its no-AMX view and 1.02x through its AVX2 view; decode steps keep the
    Gemm (through the AVX2 view the 8-lane step was 1.02x apart). So with AMX only (benchmarks/RESULTS.md,
    2026-12-07 (8))."""
    return two_level_prefill(cpu)


def block8_weights(spec: ModelSpec, store, suffixes: tuple[str, ...]) -> list[str]:
    """The weights of `suffixes` (FLOAT32_PREFILL, TWO_LEVEL_PREFILL) that the store holds as 8-bit
    blocks, in layer order."""
    names = (f"model.layers.{i}{suffix}" for i in range(spec.num_layers) for suffix in suffixes)
    return [w for w in names if (q := store.quant(w)) is not None and q.bits == 8]


def applicable(options, cpu: CpuFeatures) -> str | None:
    """Why the pass cannot run for these options on this CPU (None: it can)."""
    target = getattr(options, "target", "cpu")
    if getattr(options, "prefill_int8_outliers", 0) == 0:
        return "off (--prefill-int8-outliers 0)"
    if target != "cpu":
        return f"the {target} target has no contrib int8 GEMM"
    if getattr(options, "chips", 1) > 1:
        return "one chip only"
    if getattr(options, "probes", False):
        return "a probe build keeps the plain kernels"
    if not cpu.x86:
        return f"this CPU ({cpu.label}) is not x86: ONNX Runtime's int8 GEMMs there were not measured"
    return None


def calibration_ids(tokenizer_json: str, bos: int | None, vocab: int) -> list[list[int]]:
    """CALIBRATION_PASSAGES prompts of CALIBRATION_TOKENS ids from the project's English docs text
    (CALIBRATION_SPAN; ids wrap around a tiny test model's vocabulary)."""
    from tokenizers import Tokenizer

    from calculet.reference.texts import english_docs_text

    tok = Tokenizer.from_str(tokenizer_json)
    ids = [i % vocab for i in tok.encode(english_docs_text()[CALIBRATION_SPAN], add_special_tokens=False).ids]
    head = [bos] if bos is not None else []
    n = CALIBRATION_TOKENS - len(head)
    return [head + ids[k * n:(k + 1) * n] for k in range(CALIBRATION_PASSAGES) if len(ids) >= (k + 1) * n]


def calibrate(build_probe, options, spec: ModelSpec, store, bos: int | None, tokenizer_json: str,
              log) -> dict[str, np.ndarray]:
    """{packed weight: float32 [n, in], its input at every token of the calibration prompts (projections
    that read the same norm share one array)}, from a probe build of the same weights (ONNX Runtime
    directly: the runtime is a layer above).
    build_probe(probe_options, out) -> the probe calbin's path (compile.py builds it from the weights already quantized)."""
    wanted = projections(spec, store)
    probe_options = replace(options, prefill_int8_outliers=0, probes=True, golden=False, lanes=1, decode_lanes=(1,),
                            prefill_chunks=(CALIBRATION_TOKENS,), context=max(2 * CALIBRATION_TOKENS, 256))
    prompts = calibration_ids(tokenizer_json, bos, spec.vocab_size)
    if not prompts:
        raise RuntimeError("prefill-int8 calibration: the calibration text gave no prompt")
    seen: dict[str, list[np.ndarray]] = {}
    with tempfile.TemporaryDirectory(prefix="calculet-calibration-") as tmp:
        calbin = build_probe(probe_options, Path(tmp) / "probe.calbin")
        for outputs in _probe_runs(calbin, prompts, {p.source for p in wanted}):
            for source, rows in outputs.items():
                seen.setdefault(source, []).append(np.asarray(rows, np.float32))
    rows = {source: np.concatenate(parts) for source, parts in seen.items()}
    log(f"prefill-int8: calibrated {len(wanted)} projections on {len(prompts)} x {CALIBRATION_TOKENS} tokens")
    return {p.weight: rows[p.source] for p in wanted}


def outlier_ids(store, rows: dict[str, np.ndarray], k: int) -> dict[str, np.ndarray]:
    """{weight: int64 ids of its outlier_count(k, in) input channels with the largest calibrated |x|}."""
    return {w: np.sort(np.argsort(-np.abs(x).max(axis=0), kind="stable")[:outlier_count(k, store.quant(w).k)]
                       ).astype(np.int64) for w, x in rows.items()}


def smoothing_factors(w: np.ndarray, peak: np.ndarray, alpha: float) -> np.ndarray:
    """f [in] for w [out, in] and the calibrated input peaks [in]: f_c = max|x_c|^alpha / max|w_c|^(1-alpha),
    scaled to a geometric mean of 1. A channel that calibration never saw move (or a weight row of zeros)
    is floored at SMOOTH_FLOOR of the median, so no factor comes from a zero."""
    ax = np.maximum(peak.astype(np.float64), SMOOTH_FLOOR * max(float(np.median(peak)), 1e-30))
    aw_raw = np.abs(w).max(axis=0).astype(np.float64)
    aw = np.maximum(aw_raw, SMOOTH_FLOOR * max(float(np.median(aw_raw)), 1e-30))
    f = ax ** alpha / aw ** (1.0 - alpha)
    return (f / np.exp(np.mean(np.log(f)))).astype(np.float32)


def _probe_runs(calbin: Path, prompts: list[list[int]], modules: set[str]):
    """Per prompt, {module: float32 [n, width]}: the probe build's prefill graph as a lane's first chunk."""
    import onnxruntime as ort

    from calculet.calbin.first_chunk import first_chunk_feeds, probe_rows
    from calculet.calbin.graphspec import PROBE_PREFIX
    from calculet.calbin.manifest import read_manifest

    manifest = read_manifest(calbin)
    graph = next(g for g in manifest.graphs if g.type == "prefill")
    names = [PROBE_PREFIX + m for m in sorted(modules)]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(calbin / graph.file), so, providers=["CPUExecutionProvider"])
    for ids in prompts:
        yield probe_rows(graph, names, session.run(names, first_chunk_feeds(graph, ids)), len(ids))


def add_weights(store, record: dict, outliers: dict[str, np.ndarray], code_range: int = FULL_INT8_RANGE) -> None:
    """Per projection: int8 codes per output column [in, out] with the outlier rows zeroed, their
    scales [out] and the outlier rows in float32 [k, out] (stored); their ids [k] go inline into the
    prefill graphs and into the quantization record. W is the block codes' exact value. Where the
    CPU's u8 x s8 GEMM would saturate (`code_range` below 127: CpuFeatures.int8_code_range) the codes
    are pair-bounded (compiler/int8_pairs.py)."""
    for weight, ids in outliers.items():
        w = int8_block_values(store, weight)                                                     # [out, in]
        role = (f"{len(ids)} input channels in float32 ({weight}.outliers): "
                f"{', '.join(str(int(i)) for i in ids)}")
        _add_rows8(store, record, weight, w, ids, code_range, "per-token int8 GEMM", role)
        store.add(f"{weight}.outliers.weight", np.ascontiguousarray(w[:, ids].T))                # [k, out]
        store.inline[f"{weight}.outliers.ids"] = ids
        record[f"{weight}.outliers.weight"] = {"kind": "fp32", "module": record[weight]["module"],
                                               "role": "prefill chunks: the float32 input channels of the int8 GEMM"}


def smoothed_error(w: np.ndarray, x: np.ndarray, alpha: float) -> float:
    """The relative output error |y' - y| / |y| (Frobenius) of the smoothed per-token int8 GEMM against
    x . W over calibration rows x [n, in], for w [out, in]: the graph's rounding simulated (x / f per row
    on max|.| / 127, round half to even as QuantizeLinear; W x f per output column as _add_rows8)."""
    f = smoothing_factors(w, np.abs(x).max(axis=0), alpha)
    xs = x / f
    sx = np.maximum(np.abs(xs).max(axis=1, keepdims=True), 1e-30) / 127.0
    ws = w * f[None, :]
    sw = np.maximum(np.abs(ws).max(axis=1, keepdims=True), 1e-30) / 127.0
    approx = (np.rint(xs / sx) * sx) @ (np.clip(np.round(ws / sw), -127, 127) * sw).T
    exact = x @ w.T
    return float(np.linalg.norm(approx - exact) / max(float(np.linalg.norm(exact)), 1e-30))


def smoothing_alpha(w: np.ndarray, x: np.ndarray, alphas: tuple[float, ...] = SMOOTH_ALPHAS) -> tuple[float, float]:
    """(alpha, its smoothed_error): the migration strength of `alphas` that keeps this projection's output
    closest to x . W on the calibration rows (the first SEARCH_ROWS of them)."""
    x = x[:SEARCH_ROWS]
    return min(((a, smoothed_error(w, x, a)) for a in alphas), key=lambda ae: ae[1])


def add_smoothed_weights(store, record: dict, rows: dict[str, np.ndarray], alpha: float | None,
                         code_range: int = FULL_INT8_RANGE) -> None:
    """Per projection: the smoothed weights W x f (f = smoothing_factors, per input row) as int8 codes per
    output column [in, out] with their scales; 1 / f goes inline into the prefill graphs (x / f), the
    alpha and f's spread into the quantization record. W is the block codes' exact value; alpha None:
    each projection's own from smoothing_alpha, else this one for all."""
    for weight, x in rows.items():
        w = int8_block_values(store, weight)                                                     # [out, in]
        if alpha is None:
            chosen, err = smoothing_alpha(w, x)
            how = f"alpha {chosen:g} of {', '.join(f'{a:g}' for a in SMOOTH_ALPHAS)}: calibration output error {err:.4f}"
        else:
            chosen, how = alpha, f"alpha {alpha:g}"
        f = smoothing_factors(w, np.abs(x).max(axis=0), chosen)
        role = (f"input channels smoothed (x / f, W rows x f; f = max|x|^a / max|W|^(1-a), {how}; "
                f"spread {float(f.max() / f.min()):.3g}x)")
        _add_rows8(store, record, weight, w * f[None, :], np.zeros(0, np.int64), code_range, "per-token int8 GEMM",
                   role)
        store.inline[f"{weight}.smooth.inverse"] = (1.0 / f).astype(np.float32)


def add_two_level_weights(spec: ModelSpec, store, record: dict, code_range: int = FULL_INT8_RANGE) -> None:
    """Per weight of TWO_LEVEL_PREFILL held as 8-bit blocks: int8 codes per output column [in, out] and
    their scales, for the two-level GEMM of prefill chunks (decode keeps the blocks)."""
    for weight in block8_weights(spec, store, TWO_LEVEL_PREFILL):
        _add_rows8(store, record, weight, int8_block_values(store, weight), np.zeros(0, np.int64), code_range,
                   "two-level per-token int8 GEMM", "the input quantized twice per token (the second time its residue)")


def _add_rows8(store, record: dict, weight: str, w: np.ndarray, ids: np.ndarray, code_range: int, what: str,
               role: str) -> None:
    """`<weight>.rows8`: w [out, in] with the input rows `ids` zeroed as int8 per output column [in, out]
    and its scales [out]. Where `code_range` is below 127 (a CPU whose u8 x s8 GEMM adds pairs of products
    in 16 bits) the codes are pair-bounded (compiler/int8_pairs.py), so that kernel never saturates."""
    paired = code_range < FULL_INT8_RANGE
    inliers = w.copy()
    inliers[:, ids] = 0.0
    codes8, scale = column_codes(inliers, paired)                                                # [out, in], [out]
    store.add(f"{weight}.rows8.weight", np.ascontiguousarray(codes8.T))                          # [in, out]
    store.add(f"{weight}.rows8.scale", scale.astype(np.float32))
    err = float(np.abs(codes8 * scale[:, None].astype(np.float64) - inliers).max(initial=0.0))
    coding = f" (codes pair-bounded: |c[2j]| + |c[2j+1]| <= {PAIR_SUM_LIMIT})" if paired else ""
    record[f"{weight}.rows8"] = {"kind": "int8", "block": store.quant(weight).k, "compute": "int8",
                                 "module": record[weight]["module"], "max_abs_error": err,
                                 **({"pair_sum": PAIR_SUM_LIMIT} if paired else {}),
                                 "role": f"prefill chunks: {what}{coding}; {role}"}


def add_float32_copies(spec: ModelSpec, store, record: dict) -> None:
    """Per 8-bit weight of FLOAT32_PREFILL: `<weight>.f32` [in, out], the block codes' exact values in float32,
    for prefill chunks (decode keeps the blocks)."""
    for weight in block8_weights(spec, store, FLOAT32_PREFILL):
        w = int8_block_values(store, weight)                                                     # [out, in]
        store.add(f"{weight}.f32", np.ascontiguousarray(w.T))                                     # [in, out]
        record[f"{weight}.f32"] = {"kind": "fp32", "module": record[weight]["module"],
                                   "role": "prefill chunks: float32 GEMM over the block codes' exact values "
                                           "(faster than the 8-bit block kernel without an int8 dot product)"}


def has_weights(store, weight: str) -> bool:
    return f"{weight}.rows8.weight" in store


def has_float32_copy(store, weight: str) -> bool:
    return f"{weight}.f32" in store


def row_scales(g: GraphBuilder, x: str, scope: str) -> str:
    """x [R, H] -> s [R, 1]: s = max|x| / 127 per row. A row of zeros gets s = 0: its codes are then
    arbitrary but finite, and its product times s is 0, as x . W is (so no floor is needed; measured
    per node, a floor's Max was one of the ~1 us dispatches that make up decode-int8's glue)."""
    peak = g.op("ReduceMax", [g.op("Abs", [x], name=f"{scope}/Abs"), g.const([1])], name=f"{scope}/RowMax",
                keepdims=1)                                                                        # [R, 1]
    return g.op("Div", [peak, g.const(127.0, np.float32)], name=f"{scope}/RowScale")              # [R, 1]


def row_codes(g: GraphBuilder, x: str, scale: str, rows_n: int, width: int, name: str) -> str:
    """x [R, H] as uint8 codes around 128 on one scale per row (scale [R, 1]): QuantizeLinear's blocked
    form with one block per row, which takes the [R, 1] scale as it is (no reshape to [R])."""
    return g.op("QuantizeLinear", [x, scale, g.const(np.full((rows_n, 1), 128), np.uint8)], name=name, axis=1,
                block_size=width)


def int8_product(g: GraphBuilder, codes: str, weight: str, scope: str, row_scale: str | None = None) -> str:
    """codes [R, H] (uint8 around 128) . `<weight>.weight` [H, V] (int8 per column, or uint8 around 128) in
    float32, times the column scales: [R, V]; times the row scales too where `row_scale` [R, 1] is given.

    MatMulIntegerToFloat takes the [R, 1] row scales as its a_scale and multiplies them in after the column
    scales, bit for bit the float32 product a Mul after it makes (ONNX Runtime 1.32, CPU), one node fewer per
    product. Alone, 18 products [128, 640] x [640, 4,096] took 0.93x the time of product and Mul on an AMX
    Xeon (0.98x through its AVX2 view); in the default model's graphs the change was not measurable (a
    1,000-token prefill 1.00x natively and 1.01x through the view, the 8-lane decode step 0.996x there, the
    logits bit-identical: benchmarks/RESULTS.md, 2026-12-07 (8))."""
    a_scale = row_scale if row_scale is not None else g.const(1.0, np.float32)
    inputs = [codes, g.weight(f"{weight}.weight"), a_scale, g.weight(f"{weight}.scale"), g.const(128, np.uint8)]
    if g.weights.array(f"{weight}.weight").dtype == np.uint8:   # _add_rows8's u8 codes around 128
        inputs.append(g.const(128, np.uint8))
    return g.op("MatMulIntegerToFloat", inputs, name=f"{scope}/MatMulIntegerToFloat", domain=MS_DOMAIN)


def per_row_int8_product(g: GraphBuilder, x: str, weight: str, rows_n: int, scope: str) -> tuple[str, str]:
    """x [R, H] . W [H, V] with x quantized per row (symmetric, uint8 around 128) and W int8 per column,
    as (product [R, V], row scales [R, 1]): the product times the row scales is x . W.

    Every row gets its own scale, so a row's result never depends on the other rows of the batch
    (DynamicQuantizeMatMul's one scale per tensor let one lane's outlier activations coarsen its
    neighbours' candidates: the 8-row head then missed tokens the 1-row head found)."""
    codes, scale = _rows_quantized(g, x, weight, rows_n, scope)
    return int8_product(g, codes, weight, scope), scale


def per_row_int8_linear(g: GraphBuilder, x: str, weight: str, rows_n: int, scope: str) -> str:
    """x [R, H] . W [H, V] as per_row_int8_product, the row scales multiplied in: [R, V]."""
    codes, scale = _rows_quantized(g, x, weight, rows_n, scope)
    return int8_product(g, codes, weight, scope, row_scale=scale)


def _rows_quantized(g: GraphBuilder, x: str, weight: str, rows_n: int, scope: str) -> tuple[str, str]:
    """x [R, H] as (uint8 codes around 128 [R, H], row scales [R, 1]) for `<weight>.weight` [H, V]."""
    scale = row_scales(g, x, scope)
    return row_codes(g, x, scale, rows_n, g.weights.array(f"{weight}.weight").shape[0], f"{scope}/QuantizeRows"), scale


def two_level_linear(g: GraphBuilder, x: str, weight: str, lanes: int, tokens: int, scope: str) -> str:
    """x [L, S, in] -> [L, S, out] through the two-level int8 GEMM (module docstring): each row quantized,
    then its residue on a RESIDUE_STEPS times finer scale, both through one GEMM of 2R rows."""
    info = g.weights.quant(weight)
    rows, s = lanes * tokens, f"{scope}/TwoLevelInt8"
    flat = g.op("Reshape", [x, g.const([rows, info.k])], name=f"{s}/Rows")                          # [R, in]
    s1 = row_scales(g, flat, s)                                                                    # [R, 1]
    q1 = row_codes(g, flat, s1, rows, info.k, f"{s}/QuantizeRows")
    # s1 q1's value without DequantizeLinear: Round(x / s1) is q1 - 128 exactly (QuantizeLinear divides and rounds
    # half to even, as Round does, and |x / s1| <= 127), so this is its float32 product bit for bit. ONNX Runtime
    # 1.32 runs the blocked DequantizeLinear (one scale per row) on a slow generic path: the two levels' codes of
    # 18 inputs [128, 2,048] 7.9 -> 1.9 ms on an AMX Xeon, the same codes (benchmarks/RESULTS.md, 2026-12-07 (8)).
    steps = g.op("Div", [flat, s1], name=f"{s}/Steps")                                           # [R, in]
    back = g.op("Mul", [g.op("Round", [steps], name=f"{s}/Round"), s1], name=f"{s}/Dequantize")
    residue = g.op("Sub", [flat, back], name=f"{s}/Residue")
    s2 = g.op("Div", [s1, g.const(RESIDUE_STEPS, np.float32)], name=f"{s}/ResidueScale")           # [R, 1]
    q2 = row_codes(g, residue, s2, rows, info.k, f"{s}/QuantizeResidue")
    both = g.op("Concat", [q1, q2], name=f"{s}/Levels", axis=0)                                    # [2R, in]
    scales = g.op("Concat", [s1, s2], name=f"{s}/LevelScales", axis=0)                             # [2R, 1]
    scaled = int8_product(g, both, f"{weight}.rows8", s, row_scale=scales)                           # [2R, out]
    first, second = g.op("Split", [scaled, g.const([rows, rows])], name=f"{s}/Split", axis=0, n_out=2)
    y = g.op("Add", [first, second], name=f"{s}/Sum")                                               # [R, out]
    return g.op("Reshape", [y, g.const([lanes, tokens, info.n])], name=f"{s}/Unflatten")


def linear(g: GraphBuilder, x: str, weight: str, lanes: int, tokens: int, scope: str) -> str:
    """x [L, S, in] -> [L, S, out] through the per-token int8 GEMM, over smoothed inputs or plus the float32
    outlier channels, or, for a weight stored with neither (TWO_LEVEL_PREFILL), the two-level int8 GEMM."""
    if f"{weight}.smooth.inverse" in g.weights.inline:
        return smoothed_linear(g, x, weight, lanes, tokens, scope)
    if f"{weight}.outliers.ids" not in g.weights.inline:
        return two_level_linear(g, x, weight, lanes, tokens, scope)
    info = g.weights.quant(weight)
    ids = g.weights.inline[f"{weight}.outliers.ids"]
    mask = np.ones(info.k, np.float32)
    mask[ids] = 0.0
    rows, s = lanes * tokens, f"{scope}/RowsInt8"
    flat = g.op("Reshape", [x, g.const([rows, info.k])], name=f"{s}/Rows")                          # [R, in]
    inliers = g.op("Mul", [flat, g.const(mask, np.float32)], name=f"{s}/Inliers")
    scaled = per_row_int8_linear(g, inliers, f"{weight}.rows8", rows, s)                           # [R, out]
    unflatten = lambda y: g.op("Reshape", [y, g.const([lanes, tokens, info.n])], name=f"{s}/Unflatten")  # noqa: E731
    apart = tokens > 1 and g.outlier_add_apart   # 3-D: ONNX Runtime keeps MatMul and Add apart; 2-D: one Gemm
    if apart:
        scaled = unflatten(scaled)                                                                # [L, S, out]
    picked = g.op("Gather", [x if apart else flat, g.const(ids)], name=f"{s}/OutlierChannels",
                  axis=2 if apart else 1)                                                         # [.., k]
    outlier = g.op("MatMul", [picked, g.weight(f"{weight}.outliers.weight")], name=f"{s}/OutlierMatMul")
    y = g.op("Add", [scaled, outlier], name=f"{s}/Sum")
    return y if apart else unflatten(y)


def smoothed_linear(g: GraphBuilder, x: str, weight: str, lanes: int, tokens: int, scope: str) -> str:
    """x [L, S, in] -> [L, S, out] as (x / f) . (W x f) through the per-token int8 GEMM (add_smoothed_weights)."""
    info = g.weights.quant(weight)
    rows, s = lanes * tokens, f"{scope}/RowsInt8"
    flat = g.op("Reshape", [x, g.const([rows, info.k])], name=f"{s}/Rows")                          # [R, in]
    smooth = g.op("Mul", [flat, g.const(g.weights.inline[f"{weight}.smooth.inverse"], np.float32)],
                  name=f"{s}/Smooth")
    y = per_row_int8_linear(g, smooth, f"{weight}.rows8", rows, s)                                 # [R, out]
    return g.op("Reshape", [y, g.const([lanes, tokens, info.n])], name=f"{s}/Unflatten")
