"""The CPU's instruction-set features that decide which ONNX Runtime kernels are fast.

One job: say which of a short list of x86 features this CPU has, and where that answer came from.
It sits in the base layer so that `compile` (the ISA-aware weight policy), the runtime (the load-time
check against the compile-time choice) and `bench` (every run's header) all read the same answer.

Sources, first that answers wins:
    CALCULET_CPU_FEATURES   comma-separated names from FEATURES, or `none`: simulates another CPU
                            (tests, and choosing a policy for a machine you are not on)
    /proc/cpuinfo           the kernel's `flags` line (Linux)
    numpy                   numpy's own runtime dispatch table (any OS numpy supports)
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

from calculet.errors import RequestError

ENV = "CALCULET_CPU_FEATURES"
# Our name -> the /proc/cpuinfo flag and numpy's __cpu_features__ key (None: numpy does not report it).
FEATURES: dict[str, tuple[str, str | None]] = {
    "avx2": ("avx2", "AVX2"),
    "fma": ("fma", "FMA3"),
    "f16c": ("f16c", "F16C"),
    "avx512f": ("avx512f", "AVX512F"),
    "avx512_vnni": ("avx512_vnni", "AVX512VNNI"),   # vpdpbusd on 512-bit registers
    "avx_vnni": ("avx_vnni", "AVXVNNI"),            # the same dot product on 256-bit registers (Alder Lake, Zen 5)
    "amx_int8": ("amx_int8", None),                 # tile matrix multiply (Sapphire Rapids)
}
INT8_DOT = ("amx_int8", "avx512_vnni", "avx_vnni")  # any of these: int8 dot products in one instruction
# Without one of them ONNX Runtime's x86 u8 x s8 GEMM (MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul)
# adds each pair of products in 16 bits with saturation (vpmaddubsw): 2 x 255 x 127 overflows 32,767, while
# 2 x 255 x 63 = 32,130 fits. Measured through benchmarks/isa_view on the default model's 8-row coarse head:
# full-range codes moved coarse logits by up to 29 % of the row's largest; 7-bit codes match the VNNI result.
# int8_code_range below 127 tells the compiler to store pair-bounded codes instead (compiler/int8_pairs.py: any
# |code| up to 127, neighbours along K summing to at most 128), which that kernel multiplies exactly too.
FULL_INT8_RANGE, PAIR_SAFE_INT8_RANGE = 127, 63


@dataclass(frozen=True)
class CpuFeatures:
    flags: tuple[str, ...]      # the FEATURES this CPU has, in FEATURES order
    source: str                 # "/proc/cpuinfo", "numpy", "env CALCULET_CPU_FEATURES" or "unknown"
    machine: str = ""           # platform.machine(): x86_64, aarch64, ...
    model: str = ""             # the CPU's model name where the source tells it

    def __post_init__(self):
        unknown = set(self.flags) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown CPU features {sorted(unknown)}; known: {', '.join(FEATURES)}")

    def has(self, name: str) -> bool:
        if name not in FEATURES:
            raise ValueError(f"unknown CPU feature {name!r}; known: {', '.join(FEATURES)}")
        return name in self.flags

    @property
    def int8_dot(self) -> str | None:
        """The fastest int8 dot-product feature present (amx_int8, avx512_vnni, avx_vnni), or None."""
        return next((f for f in INT8_DOT if f in self.flags), None)

    @property
    def int8_code_range(self) -> int:
        """The largest |int8 weight code| ONNX Runtime's u8 x s8 GEMM multiplies exactly on this CPU: 127 with
        an int8 dot product (or off x86), 63 on x86 without one (16-bit pair sums; see PAIR_SAFE_INT8_RANGE)."""
        return PAIR_SAFE_INT8_RANGE if self.x86 and self.int8_dot is None else FULL_INT8_RANGE

    @property
    def x86(self) -> bool:
        return self.machine.lower() in ("x86_64", "amd64", "i386", "i686", "x86") or bool(self.flags)

    @property
    def label(self) -> str:
        """`avx2 fma f16c avx512f avx512_vnni (/proc/cpuinfo)`."""
        return f"{' '.join(self.flags) or 'none of ' + '/'.join(FEATURES)} ({self.source})"

    def missing(self, wanted: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f for f in wanted if f not in self.flags)

    def to_json(self) -> dict:
        return {"flags": list(self.flags), "source": self.source, "machine": self.machine, "model": self.model}

    @staticmethod
    def from_json(d: dict) -> "CpuFeatures":
        known = tuple(f for f in d["flags"] if f in FEATURES)  # a newer calculet may record more names
        return CpuFeatures(known, d["source"], d.get("machine", ""), d.get("model", ""))


def parse_env(text: str) -> tuple[str, ...]:
    """`avx2,fma,f16c` -> the names in FEATURES order; `none` -> (); a bad name says what is allowed."""
    names = [x.strip().lower() for x in text.split(",") if x.strip()]
    if names == ["none"]:
        return ()
    unknown = [n for n in names if n not in FEATURES]
    if unknown or not names:
        raise RequestError("bad_cpu_features", f"{ENV}={text!r}: unknown feature(s) {unknown or '(empty)'}; allowed: "
                           f"{', '.join(FEATURES)} (comma-separated), or none")
    return tuple(f for f in FEATURES if f in names)


def from_cpuinfo(text: str) -> tuple[tuple[str, ...], str] | None:
    """(features, model) from /proc/cpuinfo text; None when it has no `flags` line (e.g. ARM). The model is the
    `model name` with the `cpu family` and `model` numbers where given (`AMD EPYC (family 25 model 17)`): machines
    of one kind share a model name and differ in instruction set by generation, so a figure names both."""
    flags, fields = None, {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and flags is None:
            flags = set(value.split())
        elif key in ("model name", "cpu family", "model") and key not in fields:
            fields[key] = value.strip()
    if flags is None:
        return None
    model = fields.get("model name", "")
    if "cpu family" in fields and "model" in fields:
        model = f"{model or 'x86'} (family {fields['cpu family']} model {fields['model']})"
    return tuple(name for name, (flag, _) in FEATURES.items() if flag in flags), model


def _from_numpy() -> tuple[str, ...] | None:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as table  # numpy >= 2
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as table  # numpy 1.x
        except ImportError:
            return None
    return tuple(name for name, (_, key) in FEATURES.items() if key and table.get(key))


def detect(environ: dict | None = None, cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFeatures:
    """This CPU's features (or the simulated ones in CALCULET_CPU_FEATURES)."""
    environ = os.environ if environ is None else environ
    machine = platform.machine()
    try:
        parsed = from_cpuinfo(cpuinfo.read_text(errors="replace"))
    except OSError:
        parsed = None
    if environ.get(ENV):
        # The simulated features decide; the record still says which CPU ran it and what it really has.
        real = f"; the CPU has {' '.join(parsed[0]) or 'none of them'}" if parsed is not None else ""
        return CpuFeatures(parse_env(environ[ENV]), f"env {ENV}{real}", machine, parsed[1] if parsed else "")
    if parsed is not None:
        return CpuFeatures(parsed[0], str(cpuinfo), machine, parsed[1])
    found = _from_numpy()
    if found is not None:
        return CpuFeatures(found, "numpy", machine, platform.processor())
    return CpuFeatures((), "unknown", machine, platform.processor())
