"""Decode step time with the sliding-window layers on KV rings against full-context buffers (GQA),
and per KV dtype (--kv-dtypes fp32,fp16: GQA reads a float16 cache natively, a ring layer casts its
step's K/V on write and the whole ring back to float32 on read).

    python benchmarks/kv_ring_decode.py [--context 1024,4096] [--lanes 8] [--fill N] [--steps 64] [--rounds 3]
                                        [--kv-dtypes fp32,fp16] [--builds ring,gqa] [--target cpu]
    python benchmarks/kv_ring_decode.py --source tiny-hf-folder --context 256 --fill 100 --steps 8   # smoke run

Compiles the model (default: the embedded Gemma 3 270M, default weight policy) twice per context,
`kv_rings` on and off, fills every lane with `--fill` tokens, and times `--steps` decode jobs over
all lanes (default fill: the context less the steps, where GQA's past is longest), alternating the two builds for `--rounds` rounds (best round reported), so load on a
shared machine hits both alike. A ring layer attends over window + largest chunk rows at every
step whatever the lane's length; GroupQueryAttention's window covers at most `window` past rows.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def _device(source, path: Path, context: int, lanes: int, rings: bool, kv_dtype: str = "fp32", target: str = "cpu"):
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions
    from calculet.runtime.device import Device

    compile_calbin(source, path, CompileOptions(lanes=lanes, context=context, golden=False, kv_rings=rings,
                                                kv_dtype=kv_dtype, target=target), log=lambda _m: None)
    device = Device()
    device.configure(device.load(path))
    return device


def _fill(device, fill: int) -> tuple[int, ...]:
    from calculet.runtime.chunking import plan_chunks
    from calculet.runtime.jobs import PrefillJob

    lanes = tuple(device.lanes.allocate() for _ in range(device.lanes.count))
    for lane in lanes:
        pos = 0
        for n in plan_chunks(fill, 0, device.program.chunk_sizes, device.lanes.context):
            device.run(PrefillJob(lane, tuple(range(10 + pos, 10 + pos + n)), want_logits=False), 600)
            pos += n
    return lanes


def _time(device, lanes: tuple[int, ...], steps: int) -> float:
    from calculet.runtime.jobs import DecodeJob

    start_lengths = [device.lanes.length(lane) for lane in lanes]
    t0 = time.perf_counter()
    for i in range(steps):
        device.run(DecodeJob(lanes, tuple(100 + i for _ in lanes), full_logits=False), 600)
    took = (time.perf_counter() - t0) / steps
    for lane, n in zip(lanes, start_lengths):   # back to the filled length for the next round
        device.lanes.rewind(lane, n)
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", default=None, help="model source (default: the embedded Gemma 3 270M)")
    p.add_argument("--context", default="1024,4096")
    p.add_argument("--lanes", type=int, default=8)
    p.add_argument("--fill", type=int, default=None, help="tokens in every lane before timing (default: context - steps - 1)")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kv-dtypes", default="fp32", help="comma-separated --kv-dtype values to compare (fp32, fp16)")
    p.add_argument("--builds", default="ring,gqa", help="ring (sliding-window layers on rings), gqa (--no-kv-ring)")
    p.add_argument("--target", default="cpu")
    args = p.parse_args(argv)
    builds = [(b == "ring", dt) for b in args.builds.split(",") for dt in args.kv_dtypes.split(",")]
    print("context  build      lane length  ms/step (best of rounds)")
    with tempfile.TemporaryDirectory() as tmp:
        for context in (int(c) for c in args.context.split(",")):
            devices = {(rings, dt): _device(args.source, Path(tmp) / f"{context}-{rings}-{dt}.calbin", context,
                                            args.lanes, rings, dt, args.target) for rings, dt in builds}
            fill = args.fill if args.fill is not None else context - args.steps - 1
            lanes = {key: _fill(d, fill) for key, d in devices.items()}
            best = {key: float("inf") for key in devices}
            for _ in range(args.rounds):
                for key, d in devices.items():
                    best[key] = min(best[key], _time(d, lanes[key], args.steps))
            for (rings, dt), d in devices.items():
                kv = d.program.manifest.kv
                print(f"{context:>7}  {'ring' if rings else 'GQA '} {dt}  fill {fill:>6}  {best[rings, dt] * 1e3:8.2f}   "
                      f"(KV {kv.bytes_per_lane / 2**20:.2f} MiB per lane, ring {kv.ring})")
                d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
