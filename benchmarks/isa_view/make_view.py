"""Prepare an ONNX Runtime that sees this CPU as an AVX2-only one (no AVX-512, no VNNI, no BF16, no AMX),
or (`--kind no-amx`) as the same CPU without AMX.

Issue 14 asks for figures on both kinds of CPU of this machine class: AVX-512 VNNI, and AVX2 + FMA + F16C
only. Where only the first kind is at hand, this gives the second kind's kernel choices on the same
cores and memory: ONNX Runtime (MLAS and its cpuinfo) picks its kernels from CPUID, so a copy of the
package whose CPUID instructions answer without the AVX-512 family runs exactly the code paths an
AVX2-only CPU runs. It does not make the cores slower or the caches smaller: it isolates the
instruction set, which is what decides ONNX Runtime's int8 kernels.

    python benchmarks/isa_view/make_view.py                 # builds ~/.cache/calculet/isa_view/avx2
    . ~/.cache/calculet/isa_view/avx2/env.sh                # LD_PRELOAD, PYTHONPATH, CALCULET_CPU_FEATURES
    python -c "import onnxruntime"                          # now the patched copy, answering as AVX2-only
    python benchmarks/isa_view/make_view.py --kind no-amx   # ~/.cache/calculet/isa_view/no-amx: AMX hidden only

The no-AMX view is for an Intel CPU with AMX: it shows what the same graphs do on an AVX-512 VNNI CPU of
the generation before (ONNX Runtime's u8 x s8 GEMM uses AMX tiles where CPUID reports them).

Steps: copy the installed `onnxruntime` package into OUT/site; in each of its shared objects that
`import onnxruntime` loads, rewrite every CPUID instruction that objdump finds (0F A2) as INT3 + NOP (CC 90); build cpuid_view.c into
OUT/cpuid_view.so, whose SIGTRAP handler runs the real CPUID and clears the AVX-512 family's bits;
write OUT/env.sh; then check in a child process that a session runs and CPUID was answered by the view.
Pair it with a llama-server built without AVX-512 (README.md) for a like-for-like comparison.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
VIEWS = Path(os.environ.get("CALCULET_CACHE", Path.home() / ".cache" / "calculet")) / "isa_view"
DEFAULT_OUT = VIEWS / "avx2"
FEATURES = "avx2,fma,f16c"          # what calculet's own detection should report inside the AVX2-only view
KINDS = ("avx2", "no-amx")
CPUID = b"\x0f\xa2"
TRAP = b"\xcc\x90"                  # INT3, NOP: the handler steps over the NOP


@dataclass(frozen=True)
class Section:
    name: str
    size: int
    vma: int
    offset: int


def sections(lib: Path) -> list[Section]:
    """The object's sections with their addresses and file offsets (`objdump -h`)."""
    out = subprocess.run(["objdump", "-h", "-w", str(lib)], check=True, capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[0].isdigit():
            found.append(Section(parts[1], int(parts[2], 16), int(parts[3], 16), int(parts[5], 16)))
    return found


def cpuid_addresses(lib: Path) -> list[int]:
    """Addresses of the CPUID instructions in the object's code, as objdump disassembles it."""
    out = subprocess.run(["objdump", "-d", "-w", "--no-show-raw-insn", str(lib)],
                         check=True, capture_output=True, text=True).stdout
    return [int(m.group(1), 16) for m in re.finditer(r"^\s*([0-9a-f]+):\s+cpuid\s*$", out, re.M)]


def patch(lib: Path) -> int:
    """Rewrite the CPUID instructions of `lib` in place; return how many."""
    secs = sections(lib)
    data = bytearray(lib.read_bytes())
    count = 0
    for address in cpuid_addresses(lib):
        sec = next((s for s in secs if s.vma <= address < s.vma + s.size), None)
        if sec is None:
            raise ValueError(f"{lib.name}: CPUID at {address:#x} lies in no section")
        offset = address - sec.vma + sec.offset
        if bytes(data[offset:offset + 2]) != CPUID:
            raise ValueError(f"{lib.name}: expected 0F A2 at file offset {offset:#x}, found {data[offset:offset + 2].hex()}")
        data[offset:offset + 2] = TRAP
        count += 1
    lib.write_bytes(bytes(data))
    return count


def installed_package(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"error: the package {name!r} is not installed in {sys.executable}'s environment")
    return Path(next(iter(spec.submodule_search_locations)))


CHECK = r"""
import numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
print("onnxruntime from", ort.__file__)
g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "g",
                      [helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 8]),
                       helper.make_tensor_value_info("b", TensorProto.FLOAT, [8, 4])],
                      [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4, 4])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
a, b = np.ones((4, 8), np.float32), np.ones((8, 4), np.float32)
assert (s.run(None, {"a": a, "b": b})[0] == 8).all()
print("session ran")
"""


LOADED = r"""
import re, sys, importlib
importlib.import_module(sys.argv[1])
print("\n".join(sorted(set(re.findall(r"(/\S+\.so[.0-9]*)$", open("/proc/self/maps").read(), re.M)))))
"""


def loaded_objects(package: str, folder: Path) -> list[Path]:
    """The shared objects under `folder` that importing `package` maps (the C API library is not among them)."""
    out = subprocess.run([sys.executable, "-c", LOADED, package], check=True, capture_output=True, text=True).stdout
    return sorted({Path(p).resolve() for p in out.split()} & {p.resolve() for p in folder.rglob("*.so*")})


def view_features(kind: str) -> str:
    """What calculet's own detection should report inside a view of `kind` (CALCULET_CPU_FEATURES)."""
    if kind == "avx2":
        return FEATURES
    from calculet.cpu_features import detect

    real = detect(environ={})
    if not real.has("amx_int8"):
        raise SystemExit(f"error: this CPU ({real.label}) has no AMX: the no-AMX view would change nothing")
    return ",".join(f for f in real.flags if f != "amx_int8")


def view_environment(out: Path, features: str = FEATURES, **extra: str) -> dict[str, str]:
    """This process's environment with the view at `out` in use (what env.sh exports), plus `extra`."""
    path = os.pathsep.join(p for p in (str(out / "site"), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, LD_PRELOAD=str(out / "cpuid_view.so"), PYTHONPATH=path, CALCULET_CPU_FEATURES=features,
                **extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=KINDS, default="avx2",
                        help="avx2: no AVX-512, VNNI, BF16 or AMX; no-amx: only AMX hidden (default: %(default)s)")
    parser.add_argument("--out", type=Path, help=f"where the view goes (default: {VIEWS}/KIND)")
    parser.add_argument("--package", default="onnxruntime", help="the Python package to copy and patch")
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"), help="C compiler for the CPUID handler")
    args = parser.parse_args(argv)
    for tool in ("objdump", args.cc):
        if shutil.which(tool) is None:
            raise SystemExit(f"error: {tool} is not on PATH (binutils and a C compiler are needed)")

    out = (args.out or VIEWS / args.kind).expanduser()
    features = view_features(args.kind)
    site = out / "site"
    source = installed_package(args.package)
    target = site / args.package
    if target.exists():
        shutil.rmtree(target)
    site.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target, symlinks=True)
    total = 0
    for loaded in loaded_objects(args.package, source):
        lib = target / loaded.relative_to(source.resolve())
        n = patch(lib)
        total += n
        print(f"{lib.relative_to(site)}: {n} CPUID instructions rewritten")
    if total == 0:
        raise SystemExit(f"error: no CPUID instruction found in {target}; nothing would change")

    shim = out / "cpuid_view.so"
    flags = ["-DVIEW_NO_AMX"] if args.kind == "no-amx" else []
    subprocess.run([args.cc, "-O2", "-Wall", "-shared", "-fPIC", *flags, "-o", str(shim), str(HERE / "cpuid_view.c")],
                   check=True)
    env_sh = out / "env.sh"
    answer = "an AVX2-only CPU" if args.kind == "avx2" else "this CPU without AMX"
    env_sh.write_text(
        f"# source this file: ONNX Runtime then answers CPUID as {answer} (benchmarks/isa_view)\n"
        f"export LD_PRELOAD={shim}${{LD_PRELOAD:+:$LD_PRELOAD}}\n"
        f"export PYTHONPATH={site}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"export CALCULET_CPU_FEATURES={features}\n"
    )

    check = subprocess.run([sys.executable, "-c", CHECK], env=view_environment(out, features, CPUID_VIEW_LOG="1"),
                           capture_output=True, text=True)
    answered = [line for line in check.stderr.splitlines() if line.startswith("cpuid_view:")]
    print(check.stdout.strip())
    if check.returncode != 0 or str(site) not in check.stdout or not answered:
        sys.stderr.write(check.stderr[-4000:])
        raise SystemExit("error: the check failed (see above): the view is not in use")
    leaf7 = [line for line in answered if "leaf 0x7.0" in line]
    print(f"{len(answered)} CPUID calls answered by the view ({len(leaf7)} of leaf 7); e.g. {leaf7[:1]}")
    print(f"ready: . {env_sh}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
