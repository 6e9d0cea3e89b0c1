"""The partition section of a calbin split over several chips (`calculet compile --chips N --partition pp|tp|ep`).

A partitioned calbin is one folder:

    manifest.json        the whole model's manifest (calculet.calbin/2) plus this `partition` section;
                         its `graphs` are the logical entry points (prefill_<S>, decode_<n>, head_<n>) the
                         runtime offers, which no single file implements
    tokenizer.json
    chips/<c>/           one sub-calbin per chip: its own manifest.json (its graphs, its KV layout and
                         memory plan), graphs/*.onnx and graphs/weights.bin (only the tensors it holds)

Each logical body graph runs as a `Schedule`: segments of chip graphs (the chips of one segment run
concurrently), and between two segments one collective that moves a tensor between chips:

    pp   prefill_16:  [chip 0: prefill_16 (embed, layers 0..k-1)] ─send hidden─▶ [chip 1: prefill_16 (layers k.., norm)]
    tp   decode_4:    [chip 0: embed] ─broadcast─▶ [all: layers.0.attn] ─all_reduce─▶ [all: layers.0.mlp] ─all_reduce─▶ ...
                      ... ─▶ [chip 0: final (norm, hidden)]
    ep   decode_4:    [chip 0: embed] ─broadcast─▶ [all: layers.0 (attention, local experts)] ─all_reduce─▶ ...
                      ... ─reduce─▶ [chip 0: final (norm, hidden)]

Tensor names tie segments together: a chip graph's output `<x>_out` is the next segment's input
`<x>_in` on the same chip (a chip-local carry, no bytes between chips) unless a collective sits
between them, which reads `src` outputs and writes `dst` inputs. `hidden` (final) feeds the head graph on
`head_chip`; `input_ids`, `seqlens_k`, `total_seq_len` and `last_index` come from the host.

Bytes a collective moves between chips (the runtime counts them, `calculet plan` predicts them):
    send        nbytes                       (one chip to one chip)
    broadcast   (P - 1) x nbytes             (one chip to the P - 1 others)
    reduce      (P - 1) x nbytes             (the P - 1 others' parts to one chip, summed there)
    all_reduce  2 x (P - 1) x nbytes         (a ring: reduce-scatter then all-gather, summed over chips)
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.calbin.graphspec import nbytes
from calculet.errors import ModelError

PARTITIONS = ("pp", "tp", "ep")
COLLECTIVE_KINDS = ("send", "broadcast", "reduce", "all_reduce")
HOST_INPUTS = ("input_ids", "seqlens_k", "total_seq_len", "last_index")


def collective_bytes(kind: str, chips: int, tensor_bytes: int) -> int:
    """Bytes moved between chips by one collective over `chips` chips on a tensor of `tensor_bytes`."""
    if kind == "send":
        return tensor_bytes
    if kind in ("broadcast", "reduce"):
        return (chips - 1) * tensor_bytes
    if kind == "all_reduce":
        return 2 * (chips - 1) * tensor_bytes
    raise ModelError("bad_collective", f"unknown collective {kind!r}; known: {', '.join(COLLECTIVE_KINDS)}")


@dataclass(frozen=True)
class ChipPart:
    """What one chip holds."""
    index: int
    folder: str                       # chips/<index>, a sub-calbin
    layers: tuple[int, ...]           # decoder layers with weights or KV on this chip
    heads: tuple[int, int]            # [first, end) query heads of each of its layers (tp: a slice; pp: all)
    kv_heads: tuple[int, int]         # [first, end) KV heads (tp with kv_heads < chips: replicated)
    ffn: tuple[int, int]              # [first, end) FFN columns of each of its layers
    embedding: bool                   # holds the token embedding
    head: bool                        # holds the final norm and lm_head (the head graphs)
    weights_bytes: int                # its graphs/weights.bin
    memory_bytes: int                 # its memory plan's total (weights + KV + staging)
    experts: tuple[int, int] | None = None   # ep: [first, end) routed experts of each sparse layer; None: not ep

    def to_json(self) -> dict:
        return {"index": self.index, "folder": self.folder, "layers": list(self.layers), "heads": list(self.heads),
                "kv_heads": list(self.kv_heads), "ffn": list(self.ffn), "embedding": self.embedding,
                "head": self.head, "weights_bytes": self.weights_bytes, "memory_bytes": self.memory_bytes,
                **({} if self.experts is None else {"experts": list(self.experts)})}

    @staticmethod
    def from_json(d: dict) -> "ChipPart":
        return ChipPart(d["index"], d["folder"], tuple(d["layers"]), tuple(d["heads"]), tuple(d["kv_heads"]),
                        tuple(d["ffn"]), d["embedding"], d["head"], d["weights_bytes"], d["memory_bytes"],
                        tuple(d["experts"]) if d.get("experts") is not None else None)


@dataclass(frozen=True)
class Collective:
    """One collective between two segments: reads output `src` on chips `sources`, writes input `dst` on `targets`."""
    kind: str                         # one of COLLECTIVE_KINDS
    src: str                          # output name on the source chips
    dst: str                          # input name on the target chips
    sources: tuple[int, ...]
    targets: tuple[int, ...]
    shape: tuple[int, ...]
    dtype: str
    chips: int                        # P, the chips of the partition (all_reduce and broadcast bytes depend on it)

    def __post_init__(self):
        if self.kind not in COLLECTIVE_KINDS:
            raise ModelError("bad_collective", f"collective kind {self.kind!r} unknown; known: {', '.join(COLLECTIVE_KINDS)}")

    @property
    def tensor_bytes(self) -> int:
        return nbytes(self.shape, self.dtype)

    @property
    def link_bytes(self) -> int:
        """Bytes this collective moves between chips (see the module docstring)."""
        return collective_bytes(self.kind, self.chips, self.tensor_bytes)

    def to_json(self) -> dict:
        return {"kind": self.kind, "src": self.src, "dst": self.dst, "sources": list(self.sources),
                "targets": list(self.targets), "shape": list(self.shape), "dtype": self.dtype, "chips": self.chips}

    @staticmethod
    def from_json(d: dict) -> "Collective":
        return Collective(d["kind"], d["src"], d["dst"], tuple(d["sources"]), tuple(d["targets"]), tuple(d["shape"]),
                          d["dtype"], d["chips"])


@dataclass(frozen=True)
class Segment:
    """Chip graphs that run concurrently: (chip, graph name in that chip's sub-calbin)."""
    runs: tuple[tuple[int, str], ...]

    def to_json(self) -> list:
        return [list(r) for r in self.runs]

    @staticmethod
    def from_json(d: list) -> "Segment":
        return Segment(tuple((int(c), str(g)) for c, g in d))


@dataclass(frozen=True)
class Schedule:
    """How one logical body graph runs: segments[i], then collectives[i], then segments[i + 1], ..."""
    graph: str
    segments: tuple[Segment, ...]
    collectives: tuple[Collective, ...]

    def __post_init__(self):
        if len(self.collectives) != len(self.segments) - 1:
            raise ModelError("bad_partition", f"schedule {self.graph!r}: {len(self.segments)} segments need "
                                              f"{len(self.segments) - 1} collectives between them, got {len(self.collectives)}")

    @property
    def link_bytes(self) -> int:
        return sum(c.link_bytes for c in self.collectives)

    def to_json(self) -> dict:
        return {"graph": self.graph, "segments": [s.to_json() for s in self.segments],
                "collectives": [c.to_json() for c in self.collectives]}

    @staticmethod
    def from_json(d: dict) -> "Schedule":
        return Schedule(d["graph"], tuple(Segment.from_json(s) for s in d["segments"]),
                        tuple(Collective.from_json(c) for c in d["collectives"]))


@dataclass(frozen=True)
class Partition:
    scheme: str                       # one of PARTITIONS
    chips: tuple[ChipPart, ...]
    head_chip: int                    # the chip that runs the head graphs
    schedules: tuple[Schedule, ...]   # one per logical body graph
    replicated: tuple[str, ...]       # weight names stored on more than one chip with the same bytes, on purpose
    note: str = ""                    # a sentence on where things are and why
    sharded: tuple[str, ...] = ()     # weight names each chip holds its own slice of (tp, ep), under the one name

    def __post_init__(self):
        if self.scheme not in PARTITIONS:
            raise ModelError("bad_partition", f"partition {self.scheme!r} unknown; known: {', '.join(PARTITIONS)}")
        if [c.index for c in self.chips] != list(range(len(self.chips))):
            raise ModelError("bad_partition", f"chips must be numbered 0..{len(self.chips) - 1} in order")
        if not 0 <= self.head_chip < len(self.chips):
            raise ModelError("bad_partition", f"head_chip {self.head_chip} is not one of the {len(self.chips)} chips")

    def schedule(self, graph: str) -> Schedule:
        for s in self.schedules:
            if s.graph == graph:
                return s
        raise ModelError("graph_not_found", f"the partition has no schedule for graph {graph!r}")

    def to_json(self) -> dict:
        return {"scheme": self.scheme, "chips": [c.to_json() for c in self.chips], "head_chip": self.head_chip,
                "schedules": [s.to_json() for s in self.schedules], "replicated": list(self.replicated),
                "sharded": list(self.sharded), "note": self.note}

    @staticmethod
    def from_json(d: dict) -> "Partition":
        return Partition(d["scheme"], tuple(ChipPart.from_json(c) for c in d["chips"]), d["head_chip"],
                         tuple(Schedule.from_json(s) for s in d["schedules"]), tuple(d.get("replicated", ())),
                         d.get("note", ""), tuple(d.get("sharded", ())))

