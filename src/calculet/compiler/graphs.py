"""The compiled entry points and their static signatures, and the graph each one becomes.

Entry points (one shape profile: B lanes, context C, prefill chunk sizes S1 < S2 < ...):

    prefill_<S>  one lane, S tokens (right-padded)   input_ids [1, S]  last_index [1]  -> logits [1, V]
    decode       B lanes, one token each              input_ids [B, 1]                   -> logits [B, V]

Both take seqlens_k int32 [lanes] (each lane's length after this step, minus one), total_seq_len
int32 [] (the longest such length), and past_key.i / past_value.i float32 [lanes, Nkv, C, D] per
layer, which they update in place (present_* outputs alias the past_* buffers).

    input_ids ─ embed ─┬─ layer 0 ─ ... ─ layer n-1 ─ norm ─ (gather last_index) ─ lm_head ─ logits
                       └─ each layer reads/writes its KV buffer at every lane's own position
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import numpy as np
from onnx import ModelProto

from calculet.compiler import layers
from calculet.compiler.builder import GraphBuilder
from calculet.compiler.weights import WeightStore
from calculet.models.base import ModelSpec, lm_head_name

PREFILL, DECODE = "prefill", "decode"
GRAPH_TYPES = (PREFILL, DECODE)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict) -> "TensorSpec":
        return TensorSpec(d["name"], tuple(d["shape"]), d["dtype"])


@dataclass(frozen=True)
class GraphSpec:
    name: str
    type: str        # "prefill" | "decode"
    lanes: int       # batch rows of this graph
    tokens: int      # tokens per lane per call
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    @property
    def file(self) -> str:
        return f"graphs/{self.name}.onnx"

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.type, "file": self.file, "lanes": self.lanes, "tokens": self.tokens,
                "inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs]}

    @staticmethod
    def from_json(d: dict) -> "GraphSpec":
        return GraphSpec(d["name"], d["type"], int(d["lanes"]), int(d["tokens"]),
                         tuple(TensorSpec.from_json(t) for t in d["inputs"]),
                         tuple(TensorSpec.from_json(t) for t in d["outputs"]))


def _signature(spec: ModelSpec, name: str, kind: str, lanes: int, tokens: int, context: int) -> GraphSpec:
    kv_shape = (lanes, spec.num_kv_heads, context, spec.head_dim)
    inputs = [
        TensorSpec("input_ids", (lanes, tokens), "int64"),
        TensorSpec("seqlens_k", (lanes,), "int32"),
        TensorSpec("total_seq_len", (), "int32"),
    ]
    if kind == PREFILL:
        inputs.append(TensorSpec("last_index", (1,), "int64"))
    outputs = [TensorSpec("logits", (lanes, spec.vocab_size), "float32")]
    for i in range(spec.num_layers):
        pk, pv, nk, nv = layers.kv_names(i)
        inputs += [TensorSpec(pk, kv_shape, "float32"), TensorSpec(pv, kv_shape, "float32")]
        outputs += [TensorSpec(nk, kv_shape, "float32"), TensorSpec(nv, kv_shape, "float32")]
    return GraphSpec(name, kind, lanes, tokens, tuple(inputs), tuple(outputs))


def entry_points(spec: ModelSpec, lanes: int, context: int, prefill_chunks: tuple[int, ...]) -> list[GraphSpec]:
    graphs = [_signature(spec, f"prefill_{s}", PREFILL, 1, s, context) for s in sorted(prefill_chunks)]
    graphs.append(_signature(spec, "decode", DECODE, lanes, 1, context))
    return graphs


def add_rope_tables(spec: ModelSpec, context: int, weights: WeightStore) -> dict:
    """cos/sin caches [C, D/2] per layer type, stored with the weights."""
    tables = {}
    for layer_type, rope in (("full", spec.rope_full), ("sliding", spec.rope_sliding)):
        if layer_type not in spec.layer_types:
            continue
        cos, sin = rope.cos_sin(spec.head_dim, context)
        names = (f"rope.{layer_type}.cos", f"rope.{layer_type}.sin")
        for name, table in zip(names, (cos, sin)):
            if name not in weights:
                weights.add(name, table)
        tables[layer_type] = names
    return tables


def build_graph(spec: ModelSpec, family: ModuleType, gs: GraphSpec, weights: WeightStore,
                rope_tables: dict, target: str = "cpu") -> ModelProto:
    g = GraphBuilder(gs.name, weights, target)
    for t in gs.inputs:
        g.input(t.name, np.dtype(t.dtype), t.shape)
    ctx = layers.AttentionInputs(
        seqlens_k="seqlens_k",
        total_seq_len="total_seq_len",
        rope={k: (g.weight(c), g.weight(s)) for k, (c, s) in rope_tables.items()},
    )
    x = family.embed(g, spec, "input_ids")                                   # [L, S, H]
    for i in range(spec.num_layers):
        x = family.build_layer(g, spec, i, x, ctx)                          # [L, S, H]
    x = layers.rmsnorm(g, x, "model.norm.weight", spec.rms_norm_eps, "/model/norm")
    if gs.type == PREFILL:
        x = g.op("Gather", [x, "last_index"], name="/model/last_token/Gather", axis=1)  # [1, 1, H]
    x = g.op("Reshape", [x, g.const([gs.lanes, spec.hidden_size])], name="/model/flatten/Reshape")  # [L, H]
    head = lm_head_name(spec, weights)
    if weights.quant(head) is not None:
        logits = layers.linear(g, x, head, "/lm_head")                                          # [L, V]
    else:
        logits = g.op("Gemm", [x, g.weight(head)], name="/lm_head/Gemm", transB=1)              # [L, V]
    for t in gs.outputs:
        g.output(logits if t.name == "logits" else t.name, t.name, np.dtype(t.dtype), t.shape)
    return g.build()
