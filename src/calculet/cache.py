"""Compile-once cache: a source given to `run` or `serve` is compiled into the user cache folder and reused.

Each build's key holds a fingerprint of the compiler's code, so a changed compiler never reuses an old
build; beside each build a small file (`<build>.compiler`) records that fingerprint, and a new compile
removes the builds of other compilers, which nothing can reuse (the default model's build is about
0.75 GB: without this every upgrade left one more behind).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from calculet import __version__
from calculet.calbin.manifest import MANIFEST


COMPILER_MARK = ".compiler"   # <build>.calbin.compiler: the fingerprint of the compiler that made it


def cache_root() -> Path:
    base = os.environ.get("CALCULET_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "calculet")
    return Path(base)


def is_calbin(path: str | None) -> bool:
    return path is not None and (Path(path) / MANIFEST).is_file()


def _compiler_fingerprint() -> str:
    """Hash of the code that decides what a calbin holds, so a changed compiler never reuses an old build."""
    root = Path(__file__).parent
    h = hashlib.sha256()
    for folder in ("compiler", "models", "sources", "calbin"):
        for path in sorted((root / folder).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _source_key(source: str | None, options, compiler: str) -> str:
    """The build's key: this package's version, `compiler` (_compiler_fingerprint), the source's files and the options."""
    from calculet.sources.resolve import default_model_path

    path = Path(source if source is not None else default_model_path()).resolve()
    stat_of = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    fingerprint = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in stat_of]
    blob = json.dumps({"v": __version__, "compiler": compiler, "files": fingerprint,
                       "options": options.cache_key()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _resolved(source: str | None, options, log):
    from calculet.compiler.context_choice import resolve_context
    from calculet.models import family_for
    from calculet.sources.resolve import load_config

    config = load_config(source).config
    return resolve_context(family_for(config).parse_config(config), options, log)


def ensure_calbin(source: str | None, options, log=print) -> Path:
    """A calbin path for `source`: itself when it already is one, else a cached compile of it.

    Cached compiles skip golden/ (a reference run costs minutes); `calculet compile` writes it."""
    if is_calbin(source):
        return Path(source)
    from calculet.compiler.compile import compile_calbin

    from dataclasses import replace

    options = replace(options, golden=False)
    if options.context is None:   # the key holds the context chosen now (it depends on the host's memory)
        options = _resolved(source, options, log)
    name = Path(source).name if source else "default-gemma3-270m"
    compiler = _compiler_fingerprint()
    target = cache_root() / f"{name}-{_source_key(source, options, compiler)}.calbin"
    mark = _mark(target)
    if (target / MANIFEST).is_file():
        if not mark.is_file():   # made before builds were marked; its key holds this compiler's fingerprint
            mark.write_text(compiler)
        return target
    log(f"compiling into the cache: {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    mark.write_text(compiler)   # before the build appears, so a pruning neighbour keeps it
    try:
        out = compile_calbin(source, target, options, log=log)
    except BaseException:
        mark.unlink(missing_ok=True)
        raise
    prune_stale(target.parent, compiler, log)
    return out


def _mark(build: Path) -> Path:
    return build.with_name(build.name + COMPILER_MARK)


def prune_stale(root: Path, current: str, log=print) -> list[Path]:
    """Remove the cached builds in `root` that another compiler than `current` (_compiler_fingerprint) made:
    their mark names another fingerprint, or they have none (made before builds were marked). Folders being
    compiled (`.<name>.tmp-*`) and anything that is not a calbin are left alone. Returns what was removed."""
    removed = []
    for build in sorted(root.glob("*.calbin")):
        mark = _mark(build)
        made_by = mark.read_text().strip() if mark.is_file() else None
        if made_by == current or not (build / MANIFEST).is_file():
            continue
        size = sum(f.stat().st_size for f in build.rglob("*") if f.is_file())
        shutil.rmtree(build, ignore_errors=True)
        mark.unlink(missing_ok=True)
        removed.append(build)
        log(f"removed {build.name} from the cache: made by another compiler ({size / 2**30:.2f} GiB)")
    return removed
