"""down_proj on per-token int8 activations with one scale per group of G inputs: relative output error on
calibration activations (the default model's, 512 rows per layer), against one level, two levels, the block kernel.

    python down_groups.py ACTS.npz CALBIN

ACTS.npz: `results/decode_rows7_20261207_intel/activation_error.py capture ACTS.npz` (gate/up's calibration inputs
and weights; down_proj's input is gelu(gate) * up of them); CALBIN: a default-model calbin (down_proj's 8-bit blocks).
"Pair w": the weights as pair-bounded int8 codes per output column (compiler/int8_pairs.py)."""
import sys
from pathlib import Path

import numpy as np
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from calbin_weights import stored_weight
from calculet.compiler.int8_pairs import pair_bounded_codes
acts = np.load(sys.argv[1])
cal = sys.argv[2]
def block_values(name):
    c = stored_weight(cal, f"{name}.qcodes"); s = stored_weight(cal, f"{name}.qscales")
    return ((c.astype(np.float32) - 128) * s[:, :, None]).reshape(c.shape[0], -1)
def gelu_tanh(x): return 0.5 * x * (1 + np.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))
def q_rows(x, g):   # per-row, per-group symmetric int8 (codes round(x/s), s = max|x|/127 per group)
    r, k = x.shape; xg = x.reshape(r, k // g, g)
    s = np.maximum(np.abs(xg).max(-1, keepdims=True), 1e-30) / 127
    return (np.rint(xg / s) * s).reshape(r, k)
res = {}
for layer in range(18):
    x = acts[f"x:model.layers.{layer}.mlp.gate_up_proj.weight"].astype(np.float64)
    wgu = acts[f"w:model.layers.{layer}.mlp.gate_up_proj.weight"].astype(np.float64)
    gu = x @ wgu.T; inter = wgu.shape[0] // 2
    h = gelu_tanh(gu[:, :inter]) * gu[:, inter:]            # [512, 2048]
    w = block_values(f"model.layers.{layer}.mlp.down_proj.weight").astype(np.float64)   # [640, 2048]
    exact = h @ w.T
    codes, sc = pair_bounded_codes(w); wp = codes * sc[:, None].astype(np.float64)
    s = np.abs(w).max(1, keepdims=True) / 127; wf = np.clip(np.round(w / s), -127, 127) * s
    def err(y): return np.linalg.norm(y - exact) / np.linalg.norm(exact)
    out = {"block kernel (per-32 act, exact w)": err(q_rows(h, 32) @ w.T)}
    for g in (2048, 512, 256, 128, 64):
        out[f"groups of {g}, pair w"] = err(q_rows(h, g) @ wp.T)
    s1 = np.abs(h).max(1, keepdims=True) / 127; q1 = np.rint(h / s1) * s1; s2 = s1 / 254
    out["two-level, pair w"] = err((q1 + np.rint((h - q1) / s2) * s2) @ wp.T)
    out["exact act, pair w"] = err(h @ wp.T)
    out["exact act, full w"] = err(h @ wf.T)
    for k, v in out.items(): res.setdefault(k, []).append(v)
for k, v in res.items(): print(f"{k:38s} mean {np.mean(v):.4f}  worst layer {np.max(v):.4f}")
