"""Find or build llama.cpp's `llama-server` in a cache folder outside the repository.

Order of search: `--llama-server PATH` (the caller's), `$LLAMA_SERVER`, `llama-server` on `PATH`,
then a previous build in the cache. If none is found, the llama.cpp sources are taken from the
`llama-cpp-python` source distribution on PyPI (it vendors llama.cpp under `vendor/llama.cpp`) and
only the `llama-server` target is built with CMake: with `-march=native`, or on a CPU with AMX with
every native instruction set but ggml's AMX kernels (NO_AMX_OPTIONS says why). `--avx2` builds the peer
for runs through `benchmarks/isa_view` instead: AVX2, FMA and F16C only, in `build-avx2/` beside the
native build (AVX2_OPTIONS).

    python benchmarks/vs_llamacpp/build_llama_server.py            # prints the binary's path
    python benchmarks/vs_llamacpp/build_llama_server.py --avx2     # the AVX2-only peer: build-avx2/bin/llama-server
    python benchmarks/vs_llamacpp/build_llama_server.py --jobs 2 --cache ~/.cache/calculet/llama.cpp

Nothing here is written inside the repository.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

DEFAULT_CACHE = Path(os.environ.get("CALCULET_CACHE", Path.home() / ".cache" / "calculet")) / "llama.cpp"

# CMake options: a CPU-only server with no web UI download, no HTTPS, no tests or examples.
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_NATIVE=ON",
]

# Without ggml's AMX kernels: every instruction set of `-march=native` on an AVX-512 CPU but AMX. Seen on
# 2026-12-04 on an Intel Xeon (family 6 model 167, amx_int8 granted by the kernel): the native build
# segfaults in ggml_backend_amx_mul_mat at its first decode of the default model (Q4_K_M), so on a CPU
# with AMX this build is the default (`--ggml-amx` builds the native one anyway). Its 1-stream decode
# there: 21.3 ms per token, against 21.7 for the native build run with --no-repack (which keeps it off
# the AMX path but also drops ggml's repacked AVX-512 kernels).
NO_AMX_OPTIONS = [
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
    "-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON",
    "-DGGML_AVX_VNNI=ON", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
]


# The AVX2-only peer (`--avx2`): what `-march=native` gives on an AVX2-only CPU (the AMD EPYC, family 25
# model 1, these machines also come as), for runs where ONNX Runtime sees the AVX2-only view of a larger CPU
# (benchmarks/isa_view). Not one AVX-512, VNNI or AMX kernel is compiled in, so ggml cannot pick one at run
# time either.
AVX2_OPTIONS = [
    "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
    "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
    "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF",
]
KINDS = {"native": [], "no-amx": NO_AMX_OPTIONS, "avx2": AVX2_OPTIONS}


def has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the real CPU has AMX (CALCULET_CPU_FEATURES ignored: the crash is the hardware's)."""
    from calculet.cpu_features import detect

    return detect(environ={}, cpuinfo=cpuinfo).has("amx_int8")


def cmake_options(kind: str) -> list[str]:
    """CMake options for a build `kind`: native (-march=native), no-amx or avx2 (KINDS)."""
    if kind not in KINDS:
        raise ValueError(f"unknown llama-server build {kind!r}; known: {', '.join(KINDS)}")
    if kind == "native":
        return CMAKE_OPTIONS
    return [o for o in CMAKE_OPTIONS if not o.startswith("-DGGML_NATIVE=")] + KINDS[kind]


def build_dir(cache: Path, kind: str) -> Path:
    """The native and no-AMX builds share `build/` (one CPU gets one of them); the AVX2 peer has its own."""
    return cache / ("build-avx2" if kind == "avx2" else "build")


def built_binary(cache: Path, kind: str = "native") -> Path:
    return build_dir(cache, kind) / "bin" / "llama-server"


def find_llama_server(explicit: str | None, cache: Path, avx2: bool = False) -> Path | None:
    """Return an existing llama-server, or None when it must be built. The AVX2 peer is only ever the
    cache's `build-avx2` (or the caller's explicit binary): a llama-server on PATH is built for its CPU."""
    for candidate in (explicit, os.environ.get("LLAMA_SERVER")):
        if candidate:
            path = Path(candidate).expanduser()
            if not (path.is_file() and os.access(path, os.X_OK)):
                raise FileNotFoundError(f"llama-server given as {candidate!r} is not an executable file")
            return path
    if avx2:
        cached = built_binary(cache, "avx2")
        return cached if cached.is_file() else None
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    cached = built_binary(cache)
    return cached if cached.is_file() else None


def fetch_sources(cache: Path) -> Path:
    """Download the llama-cpp-python sdist (once) and return its vendor/llama.cpp folder."""
    src = cache / "src"
    src.mkdir(parents=True, exist_ok=True)
    sdists = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        print("downloading the llama-cpp-python source distribution from PyPI ...", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "llama-cpp-python", "-d", str(src)],
            check=True,
        )
        sdists = sorted(src.glob("llama_cpp_python-*.tar.gz"))
        if not sdists:
            raise FileNotFoundError(f"pip download left no llama_cpp_python-*.tar.gz in {src}")
    sdist = sdists[-1]
    root = src / sdist.name.removesuffix(".tar.gz")
    if not (root / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as archive:
            archive.extractall(src, filter="data")
    llama_cpp = root / "vendor" / "llama.cpp"
    if not (llama_cpp / "CMakeLists.txt").is_file():
        raise FileNotFoundError(f"{sdist.name} has no vendor/llama.cpp/CMakeLists.txt")
    return llama_cpp


def build_llama_server(cache: Path, jobs: int, kind: str = "native") -> Path:
    """Configure and build only the llama-server target of build `kind`; return the binary's path."""
    llama_cpp = fetch_sources(cache)
    build = build_dir(cache, kind)
    subprocess.run(["cmake", "-S", str(llama_cpp), "-B", str(build), *cmake_options(kind)], check=True)
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "llama-server", "-j", str(jobs)], check=True
    )
    binary = built_binary(cache, kind)
    if not binary.is_file():
        raise FileNotFoundError(f"the build finished but {binary} does not exist")
    return binary


def find_or_build(explicit: str | None = None, cache: Path = DEFAULT_CACHE, jobs: int = 2, ggml_amx: bool = False,
                  avx2: bool = False) -> Path:
    """An existing llama-server, else a new build: native, or on a CPU with AMX the no-AMX one unless
    `ggml_amx`; with `avx2`, the AVX2-only peer."""
    found = find_llama_server(explicit, cache, avx2)
    if found is not None:
        return found
    if avx2:
        return build_llama_server(cache, jobs, "avx2")
    no_amx = has_amx() and not ggml_amx
    if no_amx:
        print("this CPU has AMX: building llama-server without ggml's AMX kernels (NO_AMX_OPTIONS says why)",
              file=sys.stderr)
    return build_llama_server(cache, jobs, "no-amx" if no_amx else "native")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", help="use this binary instead of searching or building")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="cache folder (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs (default: %(default)s)")
    parser.add_argument("--ggml-amx", action="store_true",
                        help="on a CPU with AMX, build the native llama-server with ggml's AMX kernels anyway (by "
                             "default it is built without them: they crashed on the AMX Xeon seen here)")
    parser.add_argument("--avx2", action="store_true",
                        help="the AVX2-only peer for runs through benchmarks/isa_view, in build-avx2/ (AVX2_OPTIONS)")
    args = parser.parse_args(argv)
    if args.avx2 and args.ggml_amx:
        parser.error("--avx2 builds without AMX; drop --ggml-amx")
    print(find_or_build(args.llama_server, args.cache.expanduser(), args.jobs, args.ggml_amx, args.avx2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
