"""down_proj's relative output error per formulation, on the inputs the fp32 reference model sees over the
16 reference passages (first 256 tokens each): activation blocks of 32..2048, per-token int8 with k exact
outliers, the weights exact, int8 per column or 8-bit blocks of 32.

    python down_num.py     (needs torch, transformers and the default model as a Hugging Face folder at
                            /tmp/gemma3-270m-hf: benchmarks/vs_openvino/export_hf.py makes it)
"""
import torch, numpy as np
from transformers import AutoModelForCausalLM, AutoTokenizer
from calculet.reference import texts
tok = AutoTokenizer.from_pretrained("/tmp/gemma3-270m-hf")
m = AutoModelForCausalLM.from_pretrained("/tmp/gemma3-270m-hf", torch_dtype=torch.float32).eval()
cap = {}
def hook(i):
    def f(mod, inp): cap.setdefault(i, []).append(inp[0].detach().reshape(-1, inp[0].shape[-1]).numpy())
    return f
for i, l in enumerate(m.model.layers): l.mlp.down_proj.register_forward_pre_hook(hook(i))
names = texts.passage_names()
print(names)
with torch.no_grad():
    for n in names:
        ids = tok(dict(texts.PASSAGES)[n], return_tensors="pt").input_ids[:, :256]
        m(ids)
def q_blocks(x, b):
    r, k = x.shape
    xb = x.reshape(r, k // b, b)
    s = np.abs(xb).max(-1, keepdims=True) / 127; s[s == 0] = 1
    return (np.round(xb / s) * s).reshape(r, k)
res = {b: [] for b in (32, 64, 128, 256, 2048)}
for i in sorted(cap):
    x = np.concatenate(cap[i]); W = m.model.layers[i].mlp.down_proj.weight.detach().numpy().T
    y = x @ W
    for b in res:
        res[b].append(np.linalg.norm(q_blocks(x, b) @ W - y) / np.linalg.norm(y))
for b, v in res.items(): print(f"block {b}: rel err mean {np.mean(v):.4f} max {np.max(v):.4f}")
def q_row_topk(x, k):
    a = np.abs(x); idx = np.argpartition(-a, k, axis=1)[:, :k] if k else None
    xin = x.copy()
    if k: np.put_along_axis(xin, idx, 0.0, axis=1)
    s = np.abs(xin).max(1, keepdims=True) / 127; s[s == 0] = 1
    q = np.round(xin / s) * s
    if k: np.put_along_axis(q, idx, np.take_along_axis(x, idx, 1), axis=1)
    return q
def q_wcol(W):
    s = np.abs(W).max(0, keepdims=True) / 127
    return np.round(W / s) * s
res2 = {k: [] for k in (0, 4, 8, 16, 32)}; wr = []; b32w = []
for i in sorted(cap):
    x = np.concatenate(cap[i]); W = m.model.layers[i].mlp.down_proj.weight.detach().numpy().T
    Wq = q_wcol(W); y = x @ W
    wr.append(np.linalg.norm(x @ Wq - y) / np.linalg.norm(y))
    for k in res2: res2[k].append(np.linalg.norm(q_row_topk(x, k) @ Wq - y) / np.linalg.norm(y))
print(f"weights int8 per column alone: mean {np.mean(wr):.4f}")
for k, v in res2.items(): print(f"per-row int8 + top-{k} exact, int8 col weights: mean {np.mean(v):.4f} max {np.max(v):.4f}")
def q_wblk(W, b=32):
    Wt = W.T; n, k = Wt.shape; wb = Wt.reshape(n, k // b, b)
    s = np.abs(wb).max(-1, keepdims=True) / 127; s[s == 0] = 1
    return (np.round(wb / s) * s).reshape(n, k).T
cur = []
for i in sorted(cap):
    x = np.concatenate(cap[i]); W = m.model.layers[i].mlp.down_proj.weight.detach().numpy().T
    y = x @ W; cur.append(np.linalg.norm(q_blocks(x, 32) @ q_wblk(W) - y) / np.linalg.norm(y))
print(f"current (8-bit b32 weights, b32 activations): mean {np.mean(cur):.4f} max {np.max(cur):.4f}")
