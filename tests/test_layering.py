"""Imports flow one way: a lower layer never imports a higher one.

Every `import` and `from ... import` under src/calculet is walked with `ast`, including imports
inside functions (a lazy import is still a dependency) and relative imports (resolved against the
importing module's package). The rule table below is the project's layering; read it before adding
an import that crosses a package boundary.
"""

from __future__ import annotations

import ast
from pathlib import Path

import calculet

SRC = Path(calculet.__file__).parent

# Layer of a module: its first package under calculet (a top-level module is its own name).
#
#   layer       may import (besides itself and BASE)     what it is
#   ---------   --------------------------------------   -------------------------------------------
#   BASE        nothing (but each other)                 calculet/__init__, errors, units (byte sizes),
#                                                        cpu_features (the CPU's ISA flags: compile, runtime and bench read them)
#   models      -                                        model descriptions (ModelSpec): numbers only
#   sources     models                                   safetensors / GGUF folders into a SourceModel
#   calbin      models, sources                          the package format (types), gates A-E, inspect
#   reference   models, sources, calbin                  the optional torch extra: golden outputs
#   compiler    calbin, models, sources, reference       the producer (reference: golden/ at compile
#                                                        time, imported lazily when the extra is there)
#   cache       compiler, calbin, models, sources        compile-once for `run` / `serve` given a source
#   runtime     calbin, models                           the consumer: device, program, lanes, jobs
#   engine      runtime, calbin, models                  scheduler, sampler, generation on a device
#   server      engine, runtime, calbin, models          HTTP on top of the engine
#   bench       -                                        talks HTTP: nothing of server/engine/runtime
#   ray         server, engine, runtime, calbin, models  Ray Serve replicas of the server (optional extra;
#                                                        nothing below imports it, see test below)
#   TOP         anything                                 composition: cli, __main__, validation (A-E +
#                                                        golden gate F), inspection (inspect +
#                                                        --provider placement), golden_gate, planner, llm
#                                                        (calculet.LLM), run (`calculet run`)
BASE = {"__init__", "errors", "units", "cpu_features"}
ALLOWED: dict[str, set[str]] = {
    "models": set(),
    "sources": {"models"},
    "calbin": {"models", "sources"},
    "reference": {"models", "sources", "calbin"},
    "compiler": {"calbin", "models", "sources", "reference"},
    "cache": {"compiler", "calbin", "models", "sources"},
    "runtime": {"calbin", "models"},
    "engine": {"runtime", "calbin", "models"},
    "server": {"engine", "runtime", "calbin", "models"},
    "bench": set(),
    "ray": {"server", "engine", "runtime", "calbin", "models"},
}
TOP = {"cli", "__main__", "validation", "inspection", "golden_gate", "planner", "llm", "run", "numerics"}

# Known violations owned by other work, each with the change that removes it. Keep this short:
# an entry is a debt, not a permission (test_allow_list_entries_are_still_needed fails once the
# import is gone, so the list only shrinks).
ALLOW_LIST: set[tuple[str, str]] = {
    # `calculet serve SOURCE` compiles inside ModelHost._load: the compile step belongs in the
    # composition above the server (issue 10 point 5, same move as `calculet run`).
    ("calculet.server.model", "calculet.cache"),
    ("calculet.server.model", "calculet.compiler.options"),
}


def _module_name(path: Path, src: Path = SRC) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, src: Path = SRC) -> list[str]:
    """Every module `path` imports (absolute names), at any depth of the file."""
    module = _module_name(path, src)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append(target)
            if target == "calculet" or node.module is None:  # `from calculet import engine`, `from . import lanes`
                found += [f"{target}.{alias.name}" for alias in node.names]
    return found


def layer_of(module: str) -> str | None:
    """calculet.runtime.device -> runtime; calculet.cli -> cli; calculet -> __init__; other packages -> None."""
    parts = module.split(".")
    if parts[0] != "calculet":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _known_layer(name: str) -> bool:
    return name in BASE or name in ALLOWED or name in TOP


def violations() -> list[str]:
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        importer = _module_name(path)
        mine = layer_of(importer)
        if mine in TOP or mine in BASE and mine != "__init__":
            allowed = None if mine in TOP else set()
        else:
            allowed = ALLOWED.get(mine, set())
        for target in _imports(path):
            theirs = layer_of(target)
            if theirs is None or theirs == mine or not _known_layer(theirs):
                continue  # third-party, same layer, or `from calculet import X` naming a non-module
            if theirs in BASE or allowed is None or theirs in allowed:
                continue
            if (importer, target) in ALLOW_LIST:
                continue
            problems.append(f"{importer} ({mine}) imports {target} ({theirs})")
    return sorted(set(problems))


def test_every_module_belongs_to_a_layer():
    """A new top-level package must be placed in the table, not slip past the rule."""
    unknown = {layer_of(_module_name(p)) for p in SRC.rglob("*.py")} - BASE - set(ALLOWED) - TOP
    assert not unknown, f"add these to ALLOWED or TOP in tests/test_layering.py: {sorted(unknown)}"


def test_no_lower_layer_imports_a_higher_one():
    problems = violations()
    assert not problems, "imports that point up the layers:\n  " + "\n  ".join(problems)


def test_allow_list_entries_are_still_needed():
    """An allow-list entry whose import is gone must be removed (so the list only shrinks)."""
    present = {(_module_name(p), t) for p in SRC.rglob("*.py") for t in _imports(p)}
    stale = sorted(ALLOW_LIST - present)
    assert not stale, f"remove from ALLOW_LIST, the import is gone: {stale}"


def test_the_walker_sees_function_level_and_relative_imports(tmp_path):
    """Guards the walker itself: a lazy import inside a function and a relative import both count."""
    pkg = tmp_path / "calculet" / "runtime"
    pkg.mkdir(parents=True)
    f = pkg / "x.py"
    f.write_text("def f():\n    from calculet.engine import engine\n\nfrom ..compiler import graphs\nfrom . import lanes\n")
    found = _imports(f, tmp_path / "calculet")
    assert "calculet.engine" in found and "calculet.compiler" in found and "calculet.runtime.lanes" in found
    assert layer_of("calculet.compiler.graphs") == "compiler" and "compiler" not in ALLOWED["runtime"]


def test_serve_never_imports_ray():
    """The single-process server stays Ray-free: `calculet serve`'s modules and the CLI parser
    (which registers `calculet ray`) load no `ray` module even when Ray is installed."""
    import subprocess
    import sys

    code = ("import sys, calculet.cli, calculet.server.runner, calculet.server.app, calculet.server.model, "
            "calculet.ray.cli, calculet.ray.options, calculet.ray.bridge; calculet.cli.build_parser(); "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"Ray imported by the server path: {out}"
