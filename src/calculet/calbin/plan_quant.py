"""Weight storage formats and the per-module policy tables, with exact bytes including scales.

A 2-D weight is seen as `[rows, cols]` = `[out_features, in_features]` (Hugging Face layout; for an
embedding, rows are vocabulary entries). Quantization runs along `cols`:

| format | bytes for one `[rows, cols]` tensor                       | per element (cols large) |
|--------|-----------------------------------------------------------|--------------------------|
| fp32   | 4 · rows · cols                                           | 4                        |
| fp16   | 2 · rows · cols                                           | 2                        |
| bf16   | 2 · rows · cols                                           | 2                        |
| int8   | rows · cols + 2 · rows        (one fp16 scale per row)    | 1 + 2/cols               |
| int4   | rows · ⌈cols/B⌉ · (B/2 + 2)  (fp16 scale per block of B)  | 0.5 + 2/B (0.5625, B=32) |

int4 is symmetric (no zero points) and pads each row to a whole number of blocks, like ONNX Runtime's
`MatMulNBits`. 1-D tensors (norms, biases) are never quantized.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from calculet.errors import RequestError

# Module classes every weight belongs to (see plan_params).
MODULES = ("embedding", "attention", "mlp", "experts", "router", "lm_head", "norm", "bias")
FLOAT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
BLOCK_SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class WeightFormat:
    name: str                    # fp32 | fp16 | bf16 | int8 | int4
    block_size: int | None = None  # int4 only

    def __post_init__(self) -> None:
        assert self.name in (*FLOAT_BYTES, "int8", "int4"), self.name
        assert (self.name == "int4") == (self.block_size is not None), self

    def bytes_for(self, rows: int, cols: int) -> int:
        if self.name in FLOAT_BYTES:
            return FLOAT_BYTES[self.name] * rows * cols
        if self.name == "int8":
            return rows * cols + 2 * rows
        blocks = -(-cols // self.block_size)
        return rows * blocks * (self.block_size // 2 + 2)

    @property
    def label(self) -> str:
        if self.name == "int8":
            return "int8+fp16/row"
        if self.name == "int4":
            return f"int4+fp16/b{self.block_size}"
        return self.name


@dataclass(frozen=True)
class WeightPolicy:
    name: str
    formats: Mapping[str, WeightFormat]  # module class -> format; all of MODULES present

    def format(self, module: str) -> WeightFormat:
        return self.formats[module]


POLICIES = ("fp32", "fp16", "bf16", "int8", "w8a8", "int4", "default")

POLICY_DESCRIPTIONS = {
    "fp32": "every weight in fp32",
    "fp16": "every weight in fp16",
    "bf16": "every weight in bf16",
    "int8": "weight-only int8 with one fp16 scale per output channel; routers, norms, biases bf16",
    "w8a8": "weights stored as int8 with per-channel fp16 scales (same bytes as int8), activations "
            "quantized at run time; routers, norms, biases bf16",
    "int4": "weight-only int4 with an fp16 scale per block of --block-size; routers, norms, biases bf16",
    "default": "embeddings bf16, attention int8, MLP and experts int4 (fp16 scale per block), "
               "lm_head int8, MoE routers bf16, norms and biases bf16",
}
POLICY_HELP = "weight policies:\n" + "\n".join(
    f"  {name:8} {text}" for name, text in POLICY_DESCRIPTIONS.items())


def weight_policy(name: str, block_size: int = 32) -> WeightPolicy:
    """The per-module table for a policy name. Raises `RequestError` listing the allowed names."""
    if name not in POLICIES:
        raise RequestError("unknown_policy", f"unknown weight policy {name!r}; allowed: "
                           f"{', '.join(POLICIES)}")
    if block_size not in BLOCK_SIZES:
        raise RequestError("bad_argument", f"int4 block size {block_size} is not supported; allowed: "
                           f"{', '.join(map(str, BLOCK_SIZES))}")
    bf16, int8, int4 = WeightFormat("bf16"), WeightFormat("int8"), WeightFormat("int4", block_size)
    if name in FLOAT_BYTES:
        table = dict.fromkeys(MODULES, WeightFormat(name))
    elif name in ("int8", "w8a8", "int4"):
        q = int4 if name == "int4" else int8
        table = {**dict.fromkeys(MODULES, q), "router": bf16, "norm": bf16, "bias": bf16}
    else:  # default
        table = {"embedding": bf16, "attention": int8, "mlp": int4, "experts": int4,
                 "router": bf16, "lm_head": int8, "norm": bf16, "bias": bf16}
    return WeightPolicy(name, MappingProxyType(table))
