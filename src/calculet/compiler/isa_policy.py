"""`--weights auto` at compile: resolve it to the policy calbin/isa.py's rule picks for this CPU.

The rule and its evidence live with the manifest's `isa` section (calbin/isa.py), so the runtime can
say at load what `auto` would choose on the loading CPU. CALCULET_CPU_FEATURES simulates another CPU.
"""

from __future__ import annotations

from dataclasses import replace

from calculet.calbin.isa import AUTO, PolicyChoice, choose_policy
from calculet.compiler.quantize import policy_table
from calculet.cpu_features import CpuFeatures, detect


def concrete_policy(weights: str, target: str = "cpu", cpu: CpuFeatures | None = None) -> str:
    """`weights` itself, or for `auto` the policy resolve_weights picks (on this CPU unless `cpu` is given)."""
    if weights != AUTO:
        return weights
    if target == "portable":
        return "int8"
    return choose_policy(cpu or detect()).chosen


def resolve_weights(options, cpu: CpuFeatures):
    """(options with a concrete --weights, the PolicyChoice to record). `auto` picks by `cpu`; a named
    policy is kept as given. The portable target leaves kernels to its execution provider: auto -> int8."""
    if options.weights != AUTO:
        return options, PolicyChoice(options.weights, options.weights, "named on the command line")
    if options.target == "portable":
        choice = PolicyChoice(AUTO, "int8", "portable target: standard-ONNX int8 (DequantizeLinear); the execution "
                              "provider picks its kernels")
    else:
        choice = choose_policy(cpu)
    return replace(options, weights=choice.chosen), choice


def uses_slow_8bit(options) -> bool:
    """Whether a matmul of this build is 8-bit weight-only (fp32 compute): ONNX Runtime has no kernel for
    it and dequantizes per call (calbin/isa.py SLOW_8BIT). The `int8` policy and `--quant ...=int8`."""
    table = policy_table(concrete_policy(options.weights, options.target), options.block_size)
    formats = [table.get(m) for m in ("attention", "mlp", "lm_head")]
    formats += [o.fmt for o in options.quant if o.module in ("attention", "mlp", "lm_head")]
    return any(f is not None and (f.kind, f.compute) == ("int8", "fp32") for f in formats)
