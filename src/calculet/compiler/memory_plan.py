"""The static memory plan: every buffer the runtime needs, laid out in one reservation, in bytes.

Regions never overlap; in-place KV outputs are declared aliases of their input region instead of
regions of their own. Per-graph staging buffers come in ping/pong pairs so one job's inputs can be
prepared while another's outputs are read; the two halves of a pair never alias.
"""

from __future__ import annotations

from calculet.calbin.manifest import KVLayout
from calculet.compiler.workspace import workspace_bytes
from calculet.models.base import ModelSpec

ALIGN = 64
UNIT = "bytes"


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def build_memory_plan(spec: ModelSpec, kv: KVLayout, weights_bytes: int, graphs: list[dict]) -> dict:
    regions: list[dict] = []
    aliases: list[dict] = []
    offset = 0

    def add(name: str, kind: str, size: int) -> None:
        nonlocal offset
        size = _aligned(size)
        regions.append({"name": name, "kind": kind, "offset": offset, "size": size})
        offset += size

    add("weights", "weights", weights_bytes)
    for i in range(kv.num_layers):
        for part in ("key", "value"):
            add(f"kv.{part}.{i}", "kv", kv.bytes_per_buffer)
            if kv.in_place:
                aliases.append({"name": f"present_{part}.{i}", "alias_of": f"kv.{part}.{i}", "reason": "in-place KV update"})
    workspace = 0
    for g in graphs:
        in_bytes = sum(_nbytes(t) for t in g["inputs"] if not t["name"].startswith("past_"))
        out_bytes = sum(_nbytes(t) for t in g["outputs"] if not t["name"].startswith("present_"))
        for half in ("ping", "pong"):
            add(f"{g['name']}.inputs.{half}", "staging", in_bytes)
            add(f"{g['name']}.outputs.{half}", "staging", out_bytes)
        workspace = max(workspace, workspace_bytes(spec, g["lanes"], g["tokens"], kv.context))
    add("workspace", "workspace", workspace)
    return {
        "unit": UNIT,
        "alignment": ALIGN,
        "regions": regions,
        "aliases": aliases,
        "total_bytes": offset,
        "device_memory_required_bytes": offset,
    }


def _nbytes(t: dict) -> int:
    n = 1
    for d in t["shape"]:
        n *= int(d)
    return n * {"float32": 4, "float16": 2, "int64": 8, "int32": 4, "uint8": 1}[t["dtype"]]
