"""Per-module quantization overrides: `--quant attn=int8,mlp=int4/b32,lm_head=int8,embed=fp16`.

Each item is `MODULE[:LAYERS]=FORMAT[/bBLOCK]` and overrides the `--weights` policy for that module
class (in the layers given, for attn and mlp); later items win over earlier ones.

    MODULE   attn | mlp | lm_head | embed | router (router weights stay fp32: only `router=fp32`)
    LAYERS   one layer or an inclusive range: `mlp:0-3=int8`, `attn:5=fp32`
    FORMAT   fp32 | fp16 | int8 (weight-only) | int4 (weight-only) | w8a8 | w4a8 (int8 activations)
    BLOCK    16, 32, 64, 128 or 256 (default: --block-size)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from calculet.compiler.quantize import FP32, QuantFormat
from calculet.errors import RequestError

MODULES = {"attn": "attention", "mlp": "mlp", "lm_head": "lm_head", "embed": "embedding", "router": "router"}
FORMATS = {"fp32": ("fp32", "fp32"), "fp16": ("fp16", "fp16"), "int8": ("int8", "fp32"), "int4": ("int4", "fp32"),
           "w8a8": ("int8", "int8"), "w4a8": ("int4", "int8")}
BLOCKS = (16, 32, 64, 128, 256)
_ITEM = re.compile(r"^(?P<module>[a-z_]+)(?::(?P<first>\d+)(?:-(?P<last>\d+))?)?=(?P<fmt>[a-z0-9]+)(?:/b(?P<block>\d+))?$")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Override:
    module: str                         # module class: attention, mlp, lm_head, embedding, router
    layers: tuple[int, int] | None      # inclusive range, or None for every layer
    fmt: QuantFormat

    def applies(self, cls: str, layer: int | None) -> bool:
        if cls != self.module:
            return False
        return self.layers is None or (layer is not None and self.layers[0] <= layer <= self.layers[1])

    def to_json(self) -> dict:
        return {"module": self.module, "layers": list(self.layers) if self.layers else None, **self.fmt.to_json()}


def parse_quant(text: str, block_size: int = 32) -> tuple[Override, ...]:
    """Parse the --quant string; every mistake names the item and what is allowed."""
    out = []
    for item in (x.strip() for x in (text or "").split(",")):
        if not item:
            continue
        m = _ITEM.match(item)
        if m is None:
            raise RequestError("bad_option", f"--quant item {item!r} is not MODULE[:LAYERS]=FORMAT[/bBLOCK], "
                               "e.g. attn=int8, mlp:0-3=int4/b32")
        module = MODULES.get(m["module"])
        if module is None:
            raise RequestError("bad_option", f"--quant {item!r}: module {m['module']!r} is unknown; allowed: {', '.join(MODULES)}")
        if m["fmt"] not in FORMATS:
            raise RequestError("bad_option", f"--quant {item!r}: format {m['fmt']!r} is unknown; allowed: {', '.join(FORMATS)}")
        block = int(m["block"]) if m["block"] else block_size
        if block not in BLOCKS:
            raise RequestError("bad_option", f"--quant {item!r}: block {block} is not allowed; allowed: {', '.join(map(str, BLOCKS))}")
        layers = None
        if m["first"] is not None:
            if module not in ("attention", "mlp"):
                raise RequestError("bad_option", f"--quant {item!r}: layer ranges apply to attn and mlp only")
            first = int(m["first"])
            last = int(m["last"]) if m["last"] is not None else first
            if last < first:
                raise RequestError("bad_option", f"--quant {item!r}: layer range {first}-{last} is empty")
            layers = (first, last)
        kind, compute = FORMATS[m["fmt"]]
        if module == "router" and kind != "fp32":
            raise RequestError("bad_option", f"--quant {item!r}: router weights stay fp32; allowed: router=fp32")
        out.append(Override(module, layers, QuantFormat(kind, block, compute)))
    return tuple(out)


def check_layers(overrides: tuple[Override, ...], num_layers: int) -> None:
    for o in overrides:
        if o.layers and o.layers[1] >= num_layers:
            raise RequestError("bad_option", f"--quant layer range {o.layers[0]}-{o.layers[1]} is outside the model's "
                               f"layers 0-{num_layers - 1}")


def format_for(name: str, cls: str, table: dict[str, QuantFormat], overrides: tuple[Override, ...]) -> QuantFormat:
    """The format of tensor `name` (module class `cls`): the last matching override, else the policy's."""
    match = _LAYER.match(name)
    layer = int(match.group(1)) if match else None
    fmt = table.get(cls, FP32)
    for o in overrides:
        if o.applies(cls, layer):
            fmt = o.fmt
    return fmt


def canonical(overrides: tuple[Override, ...]) -> str:
    """The --quant string that reproduces `overrides` (recorded in the compile command)."""
    inv = {v: k for k, v in MODULES.items()}
    fmt_names = {v: k for k, v in FORMATS.items()}
    items = []
    for o in overrides:
        where = "" if o.layers is None else f":{o.layers[0]}" + (f"-{o.layers[1]}" if o.layers[1] != o.layers[0] else "")
        items.append(f"{inv[o.module]}{where}={fmt_names[(o.fmt.kind, o.fmt.compute)]}/b{o.fmt.block}")
    return ",".join(items)
