"""How well each coarse lm_head copy finds the exact head's top tokens on the default model:

    python coarse_recall.py [--ranks 448,512] [--out hidden.npy]

Final hidden states (after the last norm) from the fp32 transformers reference of the default GGUF
(calculet.reference.hf, torch CPU): every position of the 16 reference passages (calculet.reference.texts)
and of three 3,000-character spans of the English docs text, teacher-forced (at most 500 tokens each),
plus 48 greedy steps continuing each one's first 40 tokens. The exact head is the GGUF's int8 embedding
(tied), dequantized. Per coarse copy: the exact top token's rank among the coarse logits (0 = first), and
how many of the exact top 64 are among the 128 candidates the graph rescores (graphs.CANDIDATE_POOL x 64).

Copies: the 1-row int4 blocks of 64 (lm_head.coarse), the several-row int8 per column with full-range codes
(CPUs with an int8 dot), 7-bit codes (CPUs without one, until 2026-12-07) and pair-bounded codes
(compiler/int8_pairs.py, since); and, measured and not built, rank-r projections of the head (the hidden
state's second moment whitened, the top r directions of the logits' energy) at int8 per column.
"""
import argparse
import sys

import numpy as np
import torch


def hidden_states(model, tokenizer) -> np.ndarray:
    from calculet.reference.texts import PASSAGES, english_docs_text

    texts = [t for _, t in PASSAGES] + [english_docs_text()[i:i + 3000] for i in (10_000, 200_000, 500_000)]
    out = []
    with torch.no_grad():
        for text in texts:
            ids = [2] + tokenizer.encode(text, add_special_tokens=False).ids[:500]
            out.append(model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0].numpy())
            g = model.generate(torch.tensor([ids[:40]]), max_new_tokens=48, do_sample=False, output_hidden_states=True,
                               return_dict_in_generate=True)
            out.append(np.concatenate([step[-1][0, -1:].numpy() for step in g.hidden_states[1:]]))
    return np.concatenate(out).astype(np.float32)


def int4_blocks(w, block=64):
    x = w.reshape(w.shape[0], -1, block)
    s = np.abs(x).max(-1, keepdims=True) / 7
    return (np.clip(np.round(x / np.maximum(s, 1e-30)), -8, 7) * s).reshape(w.shape)


def int8_columns(w, top):
    s = np.abs(w).max(1, keepdims=True) / top
    return np.clip(np.round(w / np.maximum(s, 1e-30)), -top, top) * s


def paired_columns(w):
    from calculet.compiler.int8_pairs import pair_bounded_codes

    codes, scale = pair_bounded_codes(w)
    return codes.astype(np.float32) * scale[:, None]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", default="448,512")
    p.add_argument("--hidden", help="reuse hidden states saved by an earlier run")
    p.add_argument("--out", default="hidden.npy")
    a = p.parse_args()
    torch.set_num_threads(2)
    from tokenizers import Tokenizer

    from calculet.reference.hf import build_reference_model
    from calculet.sources.resolve import load_source

    source = load_source(None)
    model = build_reference_model(source)
    w = model.get_input_embeddings().weight.detach().numpy().astype(np.float32)          # [V, H]
    if a.hidden:
        h = np.load(a.hidden)
    else:
        h = hidden_states(model, Tokenizer.from_str(source.tokenizer_json))
        np.save(a.out, h)
    print(f"{len(h)} hidden states, head {w.shape}", flush=True)
    variants = {"int4 blocks of 64 (1 row)": (None, int4_blocks(w)),
                "int8 full-range codes (int8 dot)": (None, int8_columns(w, 127)),
                "int8 7-bit codes (no int8 dot, before)": (None, int8_columns(w, 63)),
                "int8 pair-bounded codes (no int8 dot, now)": (None, paired_columns(w))}
    second = h.T.astype(np.float64) @ h / len(h)
    ev, u = np.linalg.eigh(second)
    ev = np.maximum(ev, 1e-12)
    root, inv_root = (u * np.sqrt(ev)) @ u.T, (u / np.sqrt(ev)) @ u.T
    energy, basis = np.linalg.eigh(root @ (w.T.astype(np.float64) @ w) @ root)
    order = np.argsort(-energy)
    energy, basis = energy[order], basis[:, order]
    for r in (int(x) for x in a.ranks.split(",") if x):
        proj = (inv_root @ basis[:, :r]).astype(np.float32)                             # h -> h . proj  [H, r]
        head_r = (basis[:, :r].T @ root @ w.T.astype(np.float64)).T.astype(np.float32)    # [V, r]
        kept = energy[:r].sum() / energy.sum()
        variants[f"rank {r} int8 full-range ({kept:.4f} of the energy)"] = (proj, int8_columns(head_r, 127))
        variants[f"rank {r} int8 pair-bounded"] = (proj, paired_columns(head_r))
    wt = torch.from_numpy(w)
    ranks = {k: [] for k in variants}
    pooled = {k: [] for k in variants}
    for i in range(0, len(h), 128):
        rows = h[i:i + 128]
        top = torch.topk(torch.from_numpy(rows) @ wt.T, 64, dim=1).indices
        for name, (proj, head) in variants.items():
            x = rows if proj is None else rows @ proj
            coarse = torch.from_numpy(np.ascontiguousarray(x, np.float32)) @ torch.from_numpy(np.ascontiguousarray(head, np.float32)).T
            ranks[name].append((coarse > coarse.gather(1, top[:, :1])).sum(1).numpy())
            pool = torch.topk(coarse, 128, dim=1).indices.numpy()
            pooled[name].append(np.array([len(np.intersect1d(pool[j], top[j].numpy())) for j in range(len(rows))]))
    print(f"{'coarse copy':58s} | top-1 rank: worst | 99.9th pct | >= 128 | top 64 among the 128: mean | worst | all 64")
    for name in variants:
        r, t = np.concatenate(ranks[name]), np.concatenate(pooled[name])
        print(f"{name:58s} | {r.max():6d} | {np.percentile(r, 99.9):7.1f} | {(r >= 128).sum():3d} | {t.mean():6.2f} | "
              f"{t.min():3d} | {np.mean(t == 64):.3f}")


if __name__ == "__main__":
    sys.exit(main())
