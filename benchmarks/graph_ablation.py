"""What a group of nodes costs inside a compiled graph: the call timed with and without it.

    python benchmarks/graph_ablation.py CALBIN [--graph prefill_128] [--rounds 15] \
        --bypass scaled='RowsInt8/Scaled$' outliers='RowsInt8/Sum$' gelu='mlp/act/Gelu$'

Each `--bypass NAME=REGEX[;REGEX...]` makes a variant of the graph in which every node whose name
matches is removed and its first output replaced by its first input (`REGEX@I`: by input I). The
variant computes something else (the numbers are wrong on purpose); only its time means anything:
the call without those nodes. Sessions are set up as the runtime sets them up (its spinning thread
pool, the KV buffers bound in place, so no per-call copy of them), the prefill graph runs as a lane's
first chunk (position 0), and the variants run alternately, each round every variant once in a new
random order (a call is faster or slower by what ran just before it). A decode graph
(`--graph decode_1`) runs as a step of every lane at `--position`. Prints per variant the median
and worst round and the difference of medians to the unchanged graph. `NAME=` with no pattern is a
second unchanged copy: its difference is the noise floor of the run.

Why it exists: ONNX Runtime's profiler adds tens of microseconds per node, so on a graph of ~1,700
nodes its per-op shares overstate the small elementwise nodes; removing nodes and timing the call
does not (benchmarks/RESULTS.md, 2026-12-05 (2)).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
import time

import numpy as np


def bypass(model, pattern: str, index: int = 0) -> int:
    """Drop the nodes of `model` whose name matches `pattern`; their output 0 becomes their input `index`.
    Returns how many were dropped. Nodes left without consumers are dropped too (prune): ONNX Runtime
    runs them anyway (bypassing only the `Add` after the float32 outlier products left their `MatMul`
    running: 11.5 ms of a 128-token chunk saved against 25.7 with the products gone, Zen 4)."""
    graph, renamed, kept = model.graph, {}, []
    for node in graph.node:
        if re.search(pattern, node.name):
            renamed[node.output[0]] = node.input[index]
        else:
            kept.append(node)

    def resolve(name: str) -> str:
        while name in renamed:
            name = renamed[name]
        return name

    for node in kept:
        for i, name in enumerate(node.input):
            node.input[i] = resolve(name)
    if any(out.name in renamed for out in graph.output):
        raise SystemExit(f"--bypass {pattern!r} removes a node that makes a graph output; pick inner nodes")
    del graph.node[:]
    graph.node.extend(prune(kept, {out.name for out in graph.output}))
    return len(renamed)


def reads(node) -> set[str]:
    """The names `node` reads: its inputs and, for an `If` or `Loop`, every name its subgraphs read (their
    outer-scope values among them)."""
    names = set(node.input)
    for attr in node.attribute:
        for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
            for inner in sub.node:
                names |= reads(inner)
    return names


def prune(nodes: list, outputs: set[str]) -> list:
    """`nodes` without those whose outputs nothing reads (not a graph output, not another kept node's
    input, not a name a subgraph reads), repeated until none is left to drop; the order is kept."""
    while True:
        read = outputs.union(*(reads(node) for node in nodes))
        live = [node for node in nodes if any(out in read for out in node.output)]
        if len(live) == len(nodes):
            return live
        nodes = live


def decode_feeds(spec, position: int, rng) -> dict[str, np.ndarray]:
    """A decode step of every lane at `position` (that many tokens already cached; the KV buffers zero):
    what the runtime feeds, with random token ids."""
    feeds = {t.name: np.zeros(t.shape, t.dtype) for t in spec.inputs}
    feeds["input_ids"][...] = rng.integers(3, 20000, size=feeds["input_ids"].shape)
    feeds["seqlens_k"][...] = position
    if "total_seq_len" in feeds:
        feeds["total_seq_len"][...] = position + 1
    return feeds


def parse_variant(text: str) -> tuple[str, list[tuple[str, int]]]:
    name, eq, patterns = text.partition("=")
    if not name or not eq:
        raise SystemExit(f"--bypass wants NAME=REGEX[;REGEX...] (NAME= alone: a second unchanged copy), got {text!r}")
    out = []
    for item in filter(None, patterns.split(";")):
        pattern, _, index = item.partition("@")
        out.append((pattern, int(index or 0)))
    return name, out


def main(argv: list[str] | None = None) -> int:
    import onnx
    import onnxruntime as ort

    from calculet.calbin.first_chunk import first_chunk_feeds
    from calculet.calbin.graphspec import PAST_PREFIX, PRESENT_PREFIX
    from calculet.calbin.manifest import read_manifest
    from calculet.cpu_features import detect
    from calculet.runtime.program import session_spinning

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("calbin")
    p.add_argument("--graph", default="prefill_128", help="a prefill or decode graph of the calbin")
    p.add_argument("--position", type=int, default=200,
                   help="a decode graph: the tokens already in every lane's cache (default 200)")
    p.add_argument("--bypass", nargs="+", default=[], metavar="NAME=REGEX[@I][;...]")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)

    manifest = read_manifest(args.calbin)
    spec = next((g for g in manifest.graphs if g.name == args.graph), None)
    if spec is None or spec.type not in ("prefill", "decode"):
        names = [g.name for g in manifest.graphs if g.type in ("prefill", "decode")]
        raise SystemExit(f"--graph {args.graph!r} is not a prefill or decode graph of {args.calbin}: {names}")
    path = os.path.join(args.calbin, spec.file)
    base = onnx.load(path, load_external_data=False)
    variants = dict([("unchanged", [])] + [parse_variant(v) for v in args.bypass])

    sessions = {}
    for name, patterns in variants.items():
        model = onnx.ModelProto()
        model.CopyFrom(base)
        dropped = [bypass(model, pattern, index) for pattern, index in patterns]
        if patterns:
            print(f"{name}: dropped {dropped} nodes for {[pt for pt, _ in patterns]}")
        if patterns and not all(dropped):
            raise SystemExit(f"variant {name!r}: a pattern matched no node")
        # next to the original, so its external weights resolve; removed as soon as the session holds it
        fd, file = tempfile.mkstemp(suffix=".onnx", dir=os.path.dirname(path))
        os.close(fd)
        try:
            onnx.save(model, file)
            so = ort.SessionOptions()
            so.log_severity_level = 3
            so.intra_op_num_threads = args.threads
            so.inter_op_num_threads = 1
            session_spinning(so, "run")
            sessions[name] = ort.InferenceSession(file, so, providers=["CPUExecutionProvider"])
        finally:
            os.remove(file)

    rng = np.random.default_rng(0)
    if spec.type == "prefill":
        feeds = first_chunk_feeds(spec, [int(t) for t in rng.integers(3, 20000, size=spec.tokens)])
    else:
        feeds = decode_feeds(spec, args.position, rng)
    values = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    bindings = {}
    for name, session in sessions.items():
        b = session.io_binding()
        for k, v in values.items():
            b.bind_ortvalue_input(k, v)
        for out in session.get_outputs():
            if out.name.startswith(PRESENT_PREFIX):   # in place, as the runtime binds them
                b.bind_ortvalue_output(out.name, values[PAST_PREFIX + out.name.removeprefix(PRESENT_PREFIX)])
            else:
                b.bind_output(out.name)
        bindings[name] = b
    times = {name: [] for name in sessions}
    for name, session in sessions.items():
        for _ in range(2):
            session.run_with_iobinding(bindings[name])
    order = list(sessions)
    for _ in range(args.rounds):
        rng.shuffle(order)
        for name in order:
            session = sessions[name]
            t0 = time.perf_counter()
            session.run_with_iobinding(bindings[name])
            times[name].append((time.perf_counter() - t0) * 1e3)
    print(f"CPU: {detect().label}; {args.threads} threads; {args.graph} of {args.calbin}; {args.rounds} alternating rounds")
    base_ms = statistics.median(times["unchanged"])
    print("| variant | median ms | worst ms | vs unchanged |")
    print("|---|---|---|---|")
    for name, t in times.items():
        median = statistics.median(t)
        print(f"| {name} | {median:.1f} | {max(t):.1f} | {median - base_ms:+.1f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
