"""Compiler options: built once from the command line, validated, passed down unchanged."""

from __future__ import annotations

from dataclasses import dataclass

from calculet.compiler.quantize import WEIGHT_POLICIES, policy_table
from calculet.errors import RequestError

TARGETS = ("cpu",)


@dataclass(frozen=True)
class CompileOptions:
    lanes: int = 8
    context: int = 1024
    prefill_chunks: tuple[int, ...] = (16, 128)
    target: str = "cpu"
    weights: str = "default"
    block_size: int = 32
    golden: bool = True          # write golden/ when the reference extra is installed
    golden_tokens: int = 32

    def __post_init__(self):
        if not 1 <= self.lanes <= 256:
            raise RequestError("bad_option", f"--lanes must be in 1..256, got {self.lanes}")
        if not 16 <= self.context <= 131072:
            raise RequestError("bad_option", f"--context must be in 16..131072, got {self.context}")
        if not self.prefill_chunks:
            raise RequestError("bad_option", "--prefill-chunks needs at least one size, e.g. 16,128")
        for s in self.prefill_chunks:
            if not 1 <= s <= self.context:
                raise RequestError("bad_option", f"--prefill-chunks: {s} must be in 1..context ({self.context})")
        if len(set(self.prefill_chunks)) != len(self.prefill_chunks):
            raise RequestError("bad_option", f"--prefill-chunks has duplicates: {self.prefill_chunks}")
        if self.target not in TARGETS:
            raise RequestError("bad_option", f"--target {self.target!r} is not supported; supported: {', '.join(TARGETS)}")
        if self.weights not in WEIGHT_POLICIES:
            raise RequestError("bad_option", f"--weights {self.weights!r} is not supported; supported: {', '.join(WEIGHT_POLICIES)}")
        policy_table(self.weights, self.block_size)  # validates the block size


def parse_chunks(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise RequestError("bad_option", f"--prefill-chunks must be comma-separated integers like 16,128, got {text!r}") from None
    return sizes
