"""Compiler options: built once from the command line, validated, passed down unchanged."""

from __future__ import annotations

from dataclasses import dataclass

from calculet.calbin.graphspec import KV_DTYPE_OPTIONS
from calculet.calbin.manifest import TARGETS
from calculet.calbin.partition import PARTITIONS
from calculet.compiler.kv_layout import kv_dtype_problem
from calculet.compiler.prefill_int8 import DECODE_INT8
from calculet.compiler.quantize import WEIGHT_POLICIES, policy_table
from calculet.errors import RequestError

PORTABLE_POLICIES = ("fp32", "fp16", "int8")
# Fusion passes, each switchable for A/B runs (--no-fuse NAME):
#   sampling-head  TopK on the logits inside the head graph (host reads K candidates, not the vocabulary)
#   skip-norm      residual Add + RMSNorm -> SkipSimplifiedLayerNormalization
#   qkv            q/k/v projections packed into one weight: one MatMul + Split
#   gate-up        MLP gate and up projections packed: one MatMul + Split
#   coarse-head    an int8 lm_head gets an int4 copy that picks K candidates, rescored exactly from
#                  the int8 rows (needs sampling-head; halves the bytes a decode step reads for the head)
# Attention is always the fused GroupQueryAttention with in-place KV (the runtime's contract).
FUSIONS = ("sampling-head", "skip-norm", "qkv", "gate-up", "coarse-head")
SAMPLING_HEAD_K = 64
MAX_CHIPS = 8
MAX_PREFILL_INT8_OUTLIERS = 256
PREFILL_INT8_OUTLIERS = 32   # the default: float32 channels per projection (compiler/prefill_int8.py)
PREFILL_INT8_SMOOTH = 0.0    # the default: float32 outlier channels; None (auto) or an alpha: smoothing (faster, coarser)


@dataclass(frozen=True)
class CompileOptions:
    lanes: int = 8
    context: int | None = None   # None: what the model was trained for, within the KV budget (compiler/context_choice.py)
    prefill_chunks: tuple[int, ...] = (16, 64, 128)
    target: str = "cpu"
    weights: str = "auto"        # a WEIGHT_POLICIES name, or auto: chosen by the CPU's ISA at compile (isa_policy.py)
    block_size: int = 32
    golden: bool = True          # write golden/ when the reference extra is installed
    golden_tokens: int = 32
    decode_lanes: tuple[int, ...] = (1,)     # extra decode batch sizes besides `lanes`
    fusions: frozenset[str] = frozenset(FUSIONS)
    expert_stats: bool = False   # MoE: bodies also output each row's routed experts (`expert_mask`)
    probes: bool = False         # debug build: every module's output is also a graph output (compare --probe)
    quant: tuple = ()            # per-module overrides of the policy (compiler/quant_spec.Override, from --quant)
    chips: int = 1               # --chips N: split the model over N chips (needs a partition)
    partition: str = ""          # --partition pp|tp|ep (calbin/partition.py); "" on one chip
    kv_memory: int | None = None # KV budget in bytes for choosing (or checking) the context; None: auto
    kv_rings: bool = True        # sliding-window layers keep a ring of window + largest chunk rows (compiler/kv_layout.py)
    kv_dtype: str = "fp32"       # --kv-dtype: a KV_DTYPE_OPTIONS name (kv_layout.kv_dtype_problem: which runs where)
    prefill_int8_outliers: int = PREFILL_INT8_OUTLIERS  # the prefill-int8 pass (compiler/prefill_int8.py): float32 input channels per projection; 0: off
    decode_int8: str = "gate-up"  # --decode-int8: a DECODE_INT8 name; where the pass moves decode projections to its int8 rows (prefill_int8.decode_int8)
    prefill_int8_smooth: float | None = PREFILL_INT8_SMOOTH   # 0: float32 outlier channels; None: smoothing, alpha searched per projection; else smoothing with this alpha

    @property
    def kv_numpy_dtype(self) -> str:
        """The KV buffers' numpy dtype name, as the manifest's KV layout records it."""
        return KV_DTYPE_OPTIONS[self.kv_dtype]

    def cache_key(self) -> str:
        """Stable across processes (a frozenset's repr order is not)."""
        import json
        from dataclasses import asdict

        fields = asdict(self)
        fields["fusions"] = sorted(self.fusions)
        if self.weights == "auto" or self.prefill_int8_outliers:  # the CPU decides: a cache shared by two CPUs keeps both
            from calculet.cpu_features import detect

            fields["cpu_features"] = list(detect().flags)
        return json.dumps(fields, sort_keys=True, default=list)

    @property
    def sampling_head_k(self) -> int:
        return SAMPLING_HEAD_K if "sampling-head" in self.fusions else 0

    def __post_init__(self):
        if not 1 <= self.lanes <= 256:
            raise RequestError("bad_option", f"--lanes must be in 1..256, got {self.lanes}")
        if self.context is not None and not 16 <= self.context <= 131072:
            raise RequestError("bad_option", f"--context must be in 16..131072, got {self.context}")
        if self.kv_memory is not None and self.kv_memory < 1:
            raise RequestError("bad_option", f"--kv-memory must be > 0 bytes, got {self.kv_memory}")
        if not self.prefill_chunks:
            raise RequestError("bad_option", "--prefill-chunks needs at least one size, e.g. 16,128")
        for s in self.prefill_chunks:
            if not 1 <= s <= (self.context or 131072):
                raise RequestError("bad_option", f"--prefill-chunks: {s} must be in 1..context ({self.context or 131072})")
        if len(set(self.prefill_chunks)) != len(self.prefill_chunks):
            raise RequestError("bad_option", f"--prefill-chunks has duplicates: {self.prefill_chunks}")
        if self.target not in TARGETS:
            raise RequestError("bad_option", f"--target {self.target!r} is not supported; supported: {', '.join(TARGETS)}")
        if self.weights not in WEIGHT_POLICIES + ("auto",):
            raise RequestError("bad_option", f"--weights {self.weights!r} is not supported; supported: auto, "
                               f"{', '.join(WEIGHT_POLICIES)}")
        policy_table("default" if self.weights == "auto" else self.weights, self.block_size)  # validates the block size
        if self.target == "portable" and self.weights not in PORTABLE_POLICIES + ("auto",):
            raise RequestError("bad_option", f"--target portable supports --weights {' or '.join(PORTABLE_POLICIES)} "
                               f"(standard ONNX: fp32, fp16, or int8 via DequantizeLinear); got {self.weights!r}")
        for n in self.decode_lanes:
            if not 1 <= n <= self.lanes:
                raise RequestError("bad_option", f"--decode-lanes: {n} must be in 1..lanes ({self.lanes})")
        if self.quant and self.target == "portable" and any(o.fmt.kind == "int4" for o in self.quant):
            raise RequestError("bad_option", "--target portable supports int8 weights only; --quant asks for int4")
        if not 1 <= self.chips <= MAX_CHIPS:
            raise RequestError("bad_option", f"--chips must be in 1..{MAX_CHIPS}, got {self.chips}")
        if self.chips > 1 and self.partition not in PARTITIONS:
            raise RequestError("bad_option", f"--chips {self.chips} needs --partition {' or '.join(PARTITIONS)}, "
                                             f"got {self.partition or 'none'}")
        if self.chips == 1 and self.partition:
            raise RequestError("bad_option", f"--partition {self.partition} needs --chips 2 or more")
        if self.chips > 1 and (self.target != "cpu" or self.expert_stats or self.probes):
            raise RequestError("bad_option", "--chips > 1 builds --target cpu calbins without --expert-stats or "
                                             "--probes (the chip graphs update KV in place)")
        problem = kv_dtype_problem(self.kv_dtype, self.target)
        if problem:
            raise RequestError("bad_option", problem)
        if self.kv_dtype != "fp32" and self.chips > 1:
            raise RequestError("bad_option", f"--kv-dtype {self.kv_dtype} is built for one chip; --chips {self.chips} "
                                             "keeps fp32 KV (the partitioned chip graphs declare float32 buffers)")
        if not 0 <= self.prefill_int8_outliers <= MAX_PREFILL_INT8_OUTLIERS:
            raise RequestError("bad_option", f"--prefill-int8-outliers must be in 0..{MAX_PREFILL_INT8_OUTLIERS} "
                                             f"(0: off), got {self.prefill_int8_outliers}")
        if self.prefill_int8_smooth is not None and not 0.0 <= self.prefill_int8_smooth < 1.0:
            raise RequestError("bad_option", f"--prefill-int8-smooth must be auto or in [0, 1) (0: float32 outlier "
                                             f"channels instead of smoothing), got {self.prefill_int8_smooth}")
        if self.decode_int8 not in DECODE_INT8:
            raise RequestError("bad_option", f"--decode-int8 must be one of {', '.join(DECODE_INT8)}, got {self.decode_int8!r}")
        unknown = set(self.fusions) - set(FUSIONS)
        if unknown:
            raise RequestError("bad_option", f"unknown fusion {sorted(unknown)}; known: {', '.join(FUSIONS)}")


def parse_chunks(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise RequestError("bad_option", f"--prefill-chunks must be comma-separated integers like 16,128, got {text!r}") from None
    return sizes


def parse_fusions(fuse: list[str] | None, no_fuse: list[str] | None) -> frozenset[str]:
    """--fuse NAME adds (or `--fuse all`), --no-fuse NAME removes (or `--no-fuse all`), from the default: all."""
    chosen = set(FUSIONS)
    for name in fuse or []:
        chosen |= set(FUSIONS) if name == "all" else {name}
    for name in no_fuse or []:
        chosen -= set(FUSIONS) if name == "all" else {name}
        if name != "all" and name not in FUSIONS:
            raise RequestError("bad_option", f"--no-fuse {name!r}: unknown fusion; known: {', '.join(FUSIONS)}")
    return frozenset(chosen)
