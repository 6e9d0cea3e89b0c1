"""Gate A, files: the folder holds exactly the files the manifest lists, with their sizes (and hashes).

    manifest.files = {"graphs/decode.onnx": {"bytes": 14379, "sha256": "6e57…"}, ...}

manifest.json itself is the only file not listed (it cannot hold its own hash).
"""

from __future__ import annotations

import os
from pathlib import Path

from calculet.calbin.manifest import MANIFEST, sha256_file
from calculet.calbin.validate_report import Check, Rule
from calculet.calbin.gates.context import GateContext, inside

PATH_SAFE = Rule("A.path_safe", "every listed path is relative and stays inside the calbin folder")
EXISTS = Rule("A.exists", "every listed file exists and is a regular file")
SIZE = Rule("A.size", "every listed file has the size in bytes the manifest records")
SHA256 = Rule("A.sha256", "every listed file has the SHA-256 the manifest records (--full-hash)")
UNLISTED = Rule("A.unlisted", "the folder holds no file the manifest does not list")
REFERENCES = Rule("A.references", "every file the manifest refers to (tokenizer, weights, graphs, golden) is listed")
RULES = (PATH_SAFE, EXISTS, SIZE, SHA256, UNLISTED, REFERENCES)


def run(ctx: GateContext) -> list[Check]:
    files = ctx.raw.get("files")
    if not isinstance(files, dict):
        reason = "the manifest has no `files` table (see B.required_field)"
        return [PATH_SAFE.check([reason], "")] + [r.skip(reason) for r in RULES[1:]]
    unsafe = [rel for rel in files if not inside(ctx.folder, rel)]
    listed = {rel: entry for rel, entry in files.items() if rel not in unsafe}
    checks = [PATH_SAFE.check([f"{rel!r} is absolute, climbs out with '..' or leaves the folder through a link" for rel in unsafe],
                              f"{len(files)} listed paths stay inside the folder")]
    missing = [rel for rel in listed if not (ctx.folder / rel).is_file()]
    checks.append(EXISTS.check([f"{rel}: listed but missing" for rel in missing], f"{len(listed)} listed files exist"))
    present = {rel: entry for rel, entry in listed.items() if rel not in missing}
    checks.append(_sizes(ctx.folder, present))
    checks.append(_hashes(ctx.folder, present) if ctx.options.full_hash
                  else SHA256.skip("not run: pass --full-hash to read every byte and compare SHA-256"))
    extra = sorted(_all_files(ctx.folder) - set(files) - {MANIFEST})
    checks.append(UNLISTED.check([f"{rel}: on disk but not listed in the manifest" for rel in extra],
                                 "no unlisted files", {"unlisted": extra}))
    refs = _references(ctx)
    checks.append(REFERENCES.check([f"{what} {rel!r} is not listed in manifest.files" for what, rel in refs if rel not in files],
                                   f"{len(refs)} referenced files are listed"))
    return checks


def _sizes(folder: Path, present: dict) -> Check:
    problems = []
    for rel, entry in present.items():
        want = entry.get("bytes") if isinstance(entry, dict) else None
        if not isinstance(want, int) or isinstance(want, bool):
            problems.append(f"{rel}: the manifest entry has no integer `bytes` (got {want!r})")
            continue
        got = (folder / rel).stat().st_size
        if got != want:
            problems.append(f"{rel}: {got} bytes on disk, the manifest says {want} bytes")
    return SIZE.check(problems, f"{len(present)} files have their listed sizes")


def _hashes(folder: Path, present: dict) -> Check:
    problems = []
    for rel, entry in present.items():
        want = entry.get("sha256") if isinstance(entry, dict) else None
        got = sha256_file(folder / rel)
        if got != want:
            problems.append(f"{rel}: SHA-256 {got[:12]}… differs from the manifest's {str(want)[:12]}… (corrupt or modified)")
    return SHA256.check(problems, f"{len(present)} files match their SHA-256")


def _all_files(folder: Path) -> set[str]:
    found = set()
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in names:
            found.add((Path(root) / name).relative_to(folder).as_posix())
        for name in dirs:  # a link to a directory is not walked; report it as an entry of its own
            if (Path(root) / name).is_symlink():
                found.add((Path(root) / name).relative_to(folder).as_posix())
    return found


def _references(ctx: GateContext) -> list[tuple[str, str]]:
    refs = []
    partitioned = bool(ctx.raw.get("partition"))   # graphs and weights live in the chips' sub-calbins (gate P)
    for what, section in (("tokenizer file", "tokenizer"), ("weights file", "weights"), ("golden file", "golden")):
        rel = ctx.section(section).get("file")
        if isinstance(rel, str) and not (partitioned and section == "weights"):
            refs.append((what, rel))
    for g in ([] if partitioned else ctx.graphs()):
        if isinstance(g.get("file"), str):
            refs.append((f"graph {g.get('name')!r} file", g["file"]))
    return refs
