"""The manifest's `isa` section: the compiling CPU's features and why the weight policy was chosen.

The compiler writes it (compiler/isa_policy.py); the runtime calls `load_warnings` with the loading
CPU's features and logs what it returns. A calbin without the section (compiled before it existed)
stays readable: `Manifest.isa` is then None and only the kernel checks run.

`--weights auto` picks the weight policy whose ONNX Runtime kernels are fastest on the CPU among
those that pass golden gate F. The rule, for the cpu target (x86; what ONNX Runtime's MLAS dispatches
for MatMulNBits, read in onnxruntime/core/mlas/lib/qnbitgemm.cpp, platform.cpp and the
sqnbitgemm_kernel_avx*.cpp tables):

    CPU has                       policy    why
    AMX / AVX-512 VNNI / AVX-VNNI default   int8 weights, int8 compute (accuracy_level 4): the 8-bit
                                            kernel's dot products are one vpdpbusd per 4 bytes
    AVX2 (no VNNI)                default   the same kernels with the dot product emulated
                                            (vpmaddubsw + vpmaddwd); its integer sums are exact, so
                                            results equal the VNNI kernels' to float rounding (4e-7
                                            relative; checked through benchmarks/isa_view)
    no AVX2                       fp32      MLAS registers its n-bit GEMM kernels from AVX2 up;
                                            below, MatMulNBits dequantizes every weight per call

Why not w4a8 on AVX2, though it was faster there: on an AVX2-only AMD EPYC (family 25 model 1: AVX2,
FMA, F16C; no AVX-512, no VNNI), default model, 1 stream, 2 threads (issue 14): default 54.0 tok/s,
TTFT 531 ms; w4a8 59.9 tok/s, 394 ms; 8 streams default 104, w4a8 99 tok/s. But w4a8 fails golden
gate F on the default model on either kind of CPU (teacher-forced agreement 0.69 against the 0.70
the int4 bounds ask; max logit error 6.4-6.8; over 100 prompts 0.60 and perplexity 35 against 14:
the GGUF's 4- and 6-bit grids re-quantized to int4 blocks compound), so `auto` no longer picks it.
The AVX2 build differs from the VNNI one in its u8 x s8 GEMMs instead, because there that kernel adds
pairs of products in 16 bits and saturates (CpuFeatures.int8_code_range): the prefill-int8 pass stores
pair-bounded codes (compiler/int8_pairs.py: neighbours along K within 128 in magnitude, which that kernel
multiplies exactly), and so does the coarse head's several-row int8 copy (7-bit codes until 2026-12-07).
CALCULET_CPU_FEATURES simulates another CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from calculet.cpu_features import CpuFeatures


@dataclass(frozen=True)
class PolicyChoice:
    requested: str                  # what the command line asked for: "auto" or a policy name
    chosen: str                     # the policy compiled (quantization.policy)
    reason: str                     # one sentence: the rule that fired and the evidence behind it
    assumes: tuple[str, ...] = ()   # CPU features the choice relied on (checked again at load)

    def to_json(self) -> dict:
        return {"requested": self.requested, "chosen": self.chosen, "reason": self.reason, "assumes": list(self.assumes)}

    @staticmethod
    def from_json(d: dict) -> "PolicyChoice":
        return PolicyChoice(d["requested"], d["chosen"], d["reason"], tuple(d.get("assumes", ())))


@dataclass(frozen=True)
class IsaInfo:
    compile_cpu: CpuFeatures
    choice: PolicyChoice

    def to_json(self) -> dict:
        return {"compile_cpu": self.compile_cpu.to_json(), "choice": self.choice.to_json()}

    @staticmethod
    def from_json(d: dict) -> "IsaInfo":
        return IsaInfo(CpuFeatures.from_json(d["compile_cpu"]), PolicyChoice.from_json(d["choice"]))


AUTO = "auto"
_AVX2_EVIDENCE = ("AVX2-only EPYC, default model, 1 stream: w4a8 59.9 vs default 54.0 tok/s, but teacher-forced "
                  "agreement 0.69 on the golden set (issue 14)")


def choose_policy(cpu: CpuFeatures) -> PolicyChoice:
    """The cpu target's weight policy for `cpu`, with the reason and the features it relies on."""
    if not cpu.x86:
        return PolicyChoice(AUTO, "default", f"{cpu.machine or 'this'} CPU is not x86: the ISA rule covers x86 only; "
                            "kept the default policy")
    dot = cpu.int8_dot
    if dot:
        return PolicyChoice(AUTO, "default", f"{dot}: ONNX Runtime's 8-bit MatMulNBits kernel with int8 compute "
                            "(accuracy_level 4) does its dot products in one instruction; int8 weights keep the "
                            "default numerics", (dot,))
    if cpu.has("avx2"):
        return PolicyChoice(AUTO, "default", "AVX2 without VNNI: ONNX Runtime emulates the 8-bit kernel's int8 dot "
                            "products (vpmaddubsw + vpmaddwd) with exact integer sums; w4a8 would be faster at 1 stream but fails "
                            f"golden gate F on GGUF sources ({_AVX2_EVIDENCE})", ("avx2",))
    return PolicyChoice(AUTO, "fp32", "no AVX2: ONNX Runtime registers its n-bit MatMulNBits kernels from AVX2 up, "
                        "below that every quantized matmul dequantizes its weight per call; fp32 uses SGEMM")




# ONNX Runtime's MLAS has no 8-bit MatMulNBits kernel with fp32 compute (qnbitgemm.cpp's variants:
# 8-bit blocks exist with int8 compute only); at accuracy_level 1 the node dequantizes the whole
# weight to fp32 on every call. Measured on one [2048 x 640] weight, 1 row: ~470x slower than the same
# codes at accuracy_level 4 (3x at 128 rows).
SLOW_8BIT = ("8-bit MatMulNBits weights with fp32 compute (the `int8` weight-only format), for which ONNX Runtime has "
             "no kernel: each call dequantizes the whole weight to fp32 (~470x slower per decode row than int8 compute)")


def slow_8bit_tensors(manifest) -> int:
    """How many MatMulNBits weights are 8-bit with fp32 compute (an embedding lookup is not a matmul)."""
    return sum(1 for f in manifest.quantization.tensors.values()
               if f.kind == "int8" and f.compute == "fp32" and f.module != "embedding")


def wide_int8_tensors(manifest, now: CpuFeatures) -> list[str]:
    """The int8 tensors meant for u8 x s8 GEMMs whose codes exceed what `now`'s kernel multiplies exactly
    (CpuFeatures.int8_code_range). Pair-bounded codes (`pair_sum`) are exact on every kernel; a calbin from
    before the `code_range` field stored 127."""
    limit = now.int8_code_range
    return [name for name, f in manifest.quantization.tensors.items() if f.pair_sum is None and (
            f.code_range is not None and f.code_range > limit
            or f.code_range is None and name == "lm_head.coarse8" and limit < 127)]


def load_warnings(manifest, now: CpuFeatures) -> list[str]:
    """What to tell the operator when `manifest`'s calbin is loaded on `now`: features the compile-time
    choice assumed but this CPU lacks, a different choice `auto` would make here, known-slow kernels."""
    out, isa = [], manifest.isa
    if isa is not None:
        lacking = now.missing(isa.choice.assumes)
        if lacking:
            out.append(f"this CPU lacks {', '.join(lacking)}, which the compile-time weight policy "
                       f"{isa.choice.chosen!r} assumed ({isa.choice.reason}); it runs, but slower than intended. "
                       f"CPU at compile: {isa.compile_cpu.label}; here: {now.label}")
        here = choose_policy(now).chosen
        if manifest.target == "cpu" and isa.choice.requested == AUTO and here != isa.choice.chosen:
            out.append(f"`--weights auto` would choose {here!r} on this CPU ({now.label}); this calbin holds "
                       f"{isa.choice.chosen!r}: recompile on this machine for its fastest policy")
    if "prefill-int8" in manifest.passes:
        quant = manifest.quantization.tensors
        kinds = {"uint8" if t.dtype == "uint8" else
                 "paired" if getattr(quant.get(t.name.removesuffix(".weight")), "pair_sum", None) else "full"
                 for t in manifest.weights.tensors if t.name.endswith(".rows8.weight")}
        if "full" in kinds and now.int8_code_range < 127:
            out.append(f"this calbin's prefill chunks use per-token u8 x s8 GEMMs with full-range codes (the "
                       f"prefill-int8 pass), built on a CPU with an int8 dot product; on this one ({now.label}) ONNX "
                       "Runtime's kernel saturates 16-bit pair sums and prefill logits may drift: recompile on this "
                       "machine (the pass then stores pair-bounded codes, which that kernel multiplies exactly)")
        elif "paired" in kinds and now.int8_code_range == 127:
            out.append(f"this calbin's prefill chunks use pair-bounded int8 codes (the prefill-int8 pass as built for "
                       f"a CPU without an int8 dot product: about 0.4 bits coarser); this one ({now.label}) has one and "
                       "multiplies full-range codes exactly: recompile on this machine")
        elif "uint8" in kinds:
            out.append(f"this calbin's prefill chunks use u8 x u8 GEMMs (the prefill-int8 pass as built before "
                       f"pair-bounded codes); on this CPU ({now.label}) u8 x s8 is 1.3-2x as fast: recompile on this "
                       "machine")
    wide = wide_int8_tensors(manifest, now)
    if wide:
        out.append(f"{', '.join(wide)}: full-range int8 codes for a u8 x s8 GEMM, built on a CPU with an int8 dot "
                   f"product; on this one ({now.label}) ONNX Runtime adds pairs of products in 16 bits and saturates, "
                   "so those products drift (the coarse head's candidates are still rescored exactly): recompile on "
                   "this machine (its codes are then pair-bounded)")
    slow = slow_8bit_tensors(manifest)
    if manifest.target == "cpu" and slow:
        out.append(f"{slow} weight(s) use {SLOW_8BIT}; recompile with --weights default (the same int8 "
                   "weights with int8 activations)")
    return out
