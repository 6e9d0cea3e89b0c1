"""A compiled entry point's static signature, shared by the compiler (producer) and the runtime,
the gates and `inspect` (consumers). Graph kinds, dtypes and their sizes are declared here once.

    prefill_<S>  body, one lane, S tokens        input_ids [1, S], last_index [1] -> hidden [1, H]
    decode_<n>   body, lanes 0..n-1, one token   input_ids [n, 1]                 -> hidden [n, H]
    head_<n>     lm_head (+ sampling head)       hidden [n, H] -> logits [n, V], topk_values/ids [n, K]

Bodies also take seqlens_k [lanes], total_seq_len [] and past_key.i / past_value.i [lanes, Nkv, C, D]
per layer; in place they output present_key.i / present_value.i (aliases of the past buffers),
otherwise (portable) new_keys / new_values [layers, lanes, Nkv, S, D].
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL, DECODE, HEAD = "prefill", "decode", "head"
GRAPH_KINDS = (PREFILL, DECODE, HEAD)
BODY_KINDS = (PREFILL, DECODE)

# numpy dtype name -> bytes per element: every dtype a graph tensor, weight or KV buffer may have.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "int32": 4, "int16": 2,
               "int8": 1, "uint8": 1, "bool": 1}
KV_DTYPES = ("float32", "float16")   # the KV buffer dtypes a calbin may hold (compiler/kv_layout.py says why)
# `--kv-dtype` names (compile, serve, plan) -> numpy dtype names; not every one is built (kv_layout.kv_dtype_problem)
KV_DTYPE_OPTIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16", "int8": "int8"}

PAST_PREFIX, PRESENT_PREFIX = "past_", "present_"
PROBE_PREFIX = "probe:"  # a probe (debug) build's extra outputs: probe:<HF module> [L, S, width]
NEW_KV = ("new_keys", "new_values")   # portable bodies: this step's K/V, stored by the runtime


def nbytes(shape: tuple[int, ...], dtype: str) -> int:
    """Bytes of a dense tensor; an unknown dtype raises KeyError (gate B reports it first)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n * DTYPE_BYTES[dtype]


def kv_names(layer: int) -> tuple[str, str, str, str]:
    """past_key.i, past_value.i, present_key.i, present_value.i"""
    return (f"{PAST_PREFIX}key.{layer}", f"{PAST_PREFIX}value.{layer}",
            f"{PRESENT_PREFIX}key.{layer}", f"{PRESENT_PREFIX}value.{layer}")


def is_kv(name: str) -> bool:
    return name.startswith((PAST_PREFIX, PRESENT_PREFIX))


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name (a key of DTYPE_BYTES)

    @property
    def nbytes(self) -> int:
        return nbytes(self.shape, self.dtype)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @staticmethod
    def from_json(d: dict) -> "TensorSpec":
        return TensorSpec(d["name"], tuple(d["shape"]), d["dtype"])


@dataclass(frozen=True)
class GraphSpec:
    """One entry point. `type` is one of GRAPH_KINDS in a sound calbin; the reader does not refuse
    another value so that gate B can name it (B.graph_type) instead of failing to parse."""
    name: str
    type: str        # "prefill" | "decode" | "head"
    lanes: int       # batch rows of this graph
    tokens: int      # tokens per lane per call
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    file: str = ""   # graphs/<name>.onnx unless the manifest says otherwise (gate B checks it)

    def __post_init__(self):
        if not self.file:
            object.__setattr__(self, "file", f"graphs/{self.name}.onnx")

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    @property
    def is_body(self) -> bool:
        return self.type in BODY_KINDS

    def staging_bytes(self) -> int:
        """Bytes of the arrays one IO binding of this graph allocates (runtime/bindings.py): every input
        and output but the KV buffers, which the binding views in the lane buffers. A body's `hidden`
        output is its head's input array, so it is counted with the head, not here."""
        ins = sum(t.nbytes for t in self.inputs if not is_kv(t.name))
        outs = sum(t.nbytes for t in self.outputs if not is_kv(t.name) and not (self.is_body and t.name == "hidden"))
        return ins + outs

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.type, "file": self.file, "lanes": self.lanes, "tokens": self.tokens,
                "inputs": [t.to_json() for t in self.inputs], "outputs": [t.to_json() for t in self.outputs]}

    @staticmethod
    def from_json(d: dict) -> "GraphSpec":
        return GraphSpec(d["name"], d["type"], int(d["lanes"]), int(d["tokens"]),
                         tuple(TensorSpec.from_json(t) for t in d["inputs"]),
                         tuple(TensorSpec.from_json(t) for t in d["outputs"]), d.get("file", ""))
