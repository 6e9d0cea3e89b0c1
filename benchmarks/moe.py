"""Mixture-of-experts speed: the expert kernels against each other, and a MoE model against a dense one.

    python benchmarks/moe.py kernels [--hidden 2048 --expert-ffn 768 --experts 128 --top-k 8] [--tokens 1,8,128]
    python benchmarks/moe.py models  [--hidden 512 --layers 4 --experts 32 --top-k 4 --expert-ffn 256] [--steps 30]
    python benchmarks/moe.py stats   [same options as models]   the cost of --expert-stats
    python benchmarks/moe.py all     (all three, default sizes)  add --out FILE.md to keep the tables

kernels: one MoE block (router + experts) as compiler/moe.py builds it, on random weights, timed per
call for each token count (1 and 8: decode steps; 128: a prefill chunk). Variants:
    MoE fp32        com.microsoft.MoE (what the default target compiles for fp32 experts)
    QMoE int8       com.microsoft.QMoE 8-bit blocks (default / int8 / w8a8 policies)
    QMoE int4 a8    QMoE 4-bit blocks, int8 activations (w4a8)
    gather fp32     standard ops: each token's k expert matrices gathered, batched MatMul
    dense fp32      standard ops: every expert on every token, weighted by the routing matrix
The defaults are one layer of Qwen3-30B-A3B (fp32 experts take 2.4 GB; pass smaller sizes on a small box).

models: a tiny-random Qwen3-MoE and a dense Qwen3 with the same active parameters per token (dense
intermediate_size = top_k * expert FFN), both compiled with the default policy; decode step time at
1 and 8 lanes (per token) and a 128-token prefill chunk (per token), rounds interleaved.
Needs the reference extra (torch, transformers) to build the models. Record the CPU features with
the numbers (grep -o -w 'avx2\\|avx512f\\|avx512_vnni\\|avx_vnni\\|amx_int8' /proc/cpuinfo | sort -u).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

VARIANTS = ("MoE fp32", "QMoE int8", "QMoE int4 a8", "gather fp32", "dense fp32")


# ── kernels ─────────────────────────────────────────────────────────────────────────────────────

def _spec(hidden: int, ffn: int, experts: int, top_k: int):
    from calculet.models.base import ModelSpec, MoeSpec, RopeSpec

    moe = MoeSpec(experts, top_k, ffn, (0,), norm_topk_prob=True)
    return ModelSpec(family="qwen3_moe", model_type="qwen3_moe", vocab_size=16, hidden_size=hidden,
                     intermediate_size=ffn, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6,
                     layer_types=("full",), rope_full=RopeSpec(1e6), rope_sliding=None, sliding_window=None,
                     attn_scale=1.0, tie_word_embeddings=False, moe=moe)


def _layer_session(spec, variant: str, folder: Path, rng):
    import onnx
    import onnxruntime as ort

    from calculet.compiler import moe
    from calculet.compiler.builder import GraphBuilder
    from calculet.compiler.quantize import QuantFormat, store_weights
    from calculet.compiler.weights import WEIGHTS_FILE, WeightStore

    m, h = spec.moe, spec.hidden_size
    router, fc1, fc2 = moe.weight_names(0)
    arrays = [(router, (rng.standard_normal((h, m.num_experts)) * 0.1).astype(np.float32)),
              (fc1, (rng.standard_normal((m.num_experts, 2 * m.expert_intermediate_size, h)) * 0.05).astype(np.float32)),
              (fc2, (rng.standard_normal((m.num_experts, h, m.expert_intermediate_size)) * 0.05).astype(np.float32))]
    family = type("Fixed", (), {"prepare_weights": staticmethod(lambda _s, _t: iter(arrays))})
    table = {"QMoE int8": {"experts": QuantFormat("int8", 32, "int8")},
             "QMoE int4 a8": {"experts": QuantFormat("int4", 32, "int8")}}.get(variant, {})
    store = WeightStore()
    store_weights(spec, family, {}, table, store)
    store.write(folder / WEIGHTS_FILE)
    target = "cpu" if variant.startswith(("MoE", "QMoE")) else "portable"
    g = GraphBuilder("moe_layer", store, target)
    g.input("x", np.float32, ["tokens", h])
    rows = 1 if variant.startswith("gather") else 1 << 30       # forces the standard formulation
    y = moe.sparse_mlp(g, spec, 0, "x", rows, "/moe")
    g.output(y, "y", np.float32, ["tokens", h])
    path = folder / f"{variant.replace(' ', '_')}.onnx"
    onnx.save_model(g.build(), str(path))
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def kernels(hidden: int, ffn: int, experts: int, top_k: int, tokens: list[int], repeats: int) -> list[str]:
    spec = _spec(hidden, ffn, experts, top_k)
    rng = np.random.default_rng(0)
    rows = [f"one MoE block: hidden {hidden}, {experts} experts x FFN {ffn}, top {top_k}; median ms per call "
            f"({repeats} calls)", "", "| variant | " + " | ".join(f"{n} tokens" for n in tokens) + " |",
            "|---" * (len(tokens) + 1) + "|"]
    with tempfile.TemporaryDirectory() as tmp:
        sessions = {v: _layer_session(spec, v, Path(tmp), rng) for v in VARIANTS}
        inputs = {n: rng.standard_normal((n, hidden)).astype(np.float32) for n in tokens}
        times = {(v, n): [] for v in VARIANTS for n in tokens}
        for s in sessions.values():
            for x in inputs.values():
                s.run(None, {"x": x})                                # warm-up (prepacking)
        for _ in range(repeats):                                     # interleaved: noise hits all alike
            for v, s in sessions.items():
                for n, x in inputs.items():
                    t0 = time.perf_counter()
                    s.run(None, {"x": x})
                    times[v, n].append(time.perf_counter() - t0)
    for v in VARIANTS:
        rows.append(f"| {v} | " + " | ".join(f"{statistics.median(times[v, n]) * 1e3:.3f}" for n in tokens) + " |")
    return rows


# ── models ──────────────────────────────────────────────────────────────────────────────────────

def _hf_model(folder: Path, moe: bool, hidden: int, layers: int, experts: int, top_k: int, ffn: int) -> Path:
    import sys

    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import tiny_models

    common = dict(vocab_size=tiny_models.VOCAB, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 256), head_dim=64,
                  max_position_embeddings=2048, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                  pad_token_id=0, eos_token_id=1, bos_token_id=2)
    cfg = (Qwen3MoeConfig(**common, intermediate_size=top_k * ffn, num_experts=experts, num_experts_per_tok=top_k,
                          moe_intermediate_size=ffn, norm_topk_prob=True)
           if moe else Qwen3Config(**common, intermediate_size=top_k * ffn))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(tiny_models._tokenizer_json())
    return folder


def models(hidden: int, layers: int, experts: int, top_k: int, ffn: int, steps: int, stats: bool = False) -> list[str]:
    """MoE vs dense; with `stats`, MoE without vs with --expert-stats (the cost of the statistics)."""
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.runtime.device import Device
    from calculet.runtime.jobs import DecodeJob, PrefillJob

    variants = ((("MoE", True, False), ("MoE + expert stats", True, True)) if stats
                else (("MoE", True, False), ("dense", False, False)))
    out = [f"MoE ({experts} experts x FFN {ffn}, top {top_k}) vs "
           + ("the same with --expert-stats" if stats else f"dense (FFN {top_k * ffn})")
           + f", hidden {hidden}, {layers} layers, default policy; median ms per token", "",
           "| model | decode 1 lane | decode 8 lanes (per token) | prefill 128 (per token) |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        probes = {}
        for name, is_moe, with_stats in variants:
            src = _hf_model(Path(tmp) / f"hf-{is_moe}", is_moe, hidden, layers, experts, top_k, ffn)
            path = compile_calbin(str(src), Path(tmp) / f"{name.replace(' ', '_')}.calbin",
                                  CompileOptions(lanes=8, context=512, prefill_chunks=(16, 128), golden=False,
                                                 expert_stats=with_stats), log=lambda _m: None)
            d = Device()
            d.configure(d.load(path))
            lanes = [d.lanes.allocate() for _ in range(8)]
            for lane in lanes:
                d.run(PrefillJob(lane, tuple(range(3, 103)), want_logits=False), 600)
            probes[name] = (d, lanes)
        times = {(n, k): [] for n in probes for k in ("d1", "d8", "p128")}
        for _ in range(steps):
            for name, (d, lanes) in probes.items():
                for key, n in (("d1", 1), ("d8", 8)):
                    t0 = time.perf_counter()
                    d.run(DecodeJob(tuple(lanes[:n]), (5,) * n, full_logits=False), 600)
                    times[name, key].append((time.perf_counter() - t0) / n)
                d.lanes.clear(lanes[-1])
                t0 = time.perf_counter()
                d.run(PrefillJob(lanes[-1], tuple(range(3, 131)), want_logits=False), 600)
                times[name, "p128"].append((time.perf_counter() - t0) / 128)
        for name, (d, _) in probes.items():
            out.append(f"| {name} | " + " | ".join(f"{statistics.median(times[name, k]) * 1e3:.3f}"
                                                    for k in ("d1", "d8", "p128")) + " |")
            d.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("kernels", "models", "stats", "all"))
    p.add_argument("--hidden", type=int)
    p.add_argument("--experts", type=int)
    p.add_argument("--top-k", type=int)
    p.add_argument("--expert-ffn", type=int)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--tokens", default="1,8,128")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--out")
    a = p.parse_args()
    lines = []
    if a.what in ("kernels", "all"):
        lines += kernels(a.hidden or 2048, a.expert_ffn or 768, a.experts or 128, a.top_k or 8,
                         [int(t) for t in a.tokens.split(",")], a.repeats) + [""]
    if a.what in ("models", "all"):
        lines += models(a.hidden or 512, a.layers, a.experts or 32, a.top_k or 4, a.expert_ffn or 256, a.steps) + [""]
    if a.what in ("stats", "all"):
        lines += models(a.hidden or 512, a.layers, a.experts or 32, a.top_k or 4, a.expert_ffn or 256, a.steps, stats=True)
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
