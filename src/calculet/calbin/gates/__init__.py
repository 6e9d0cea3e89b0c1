"""The gates `calculet validate` runs, in order; each module holds one gate's rules and `run(ctx)`.

    A files     gates/files.py      what is on disk vs manifest.files (sizes, hashes, unlisted files)
    B manifest  gates/schema.py     schema version, required fields, graph types and exact names, units
    C contract  gates/contract.py   lanes, context, vocab, KV layout, dtypes: manifest == .onnx == tokenizer
    D memory    gates/memory.py     the memory plan: bounds, overlaps, aliases, ping/pong, totals, plausibility
    E graphs    gates/graphs.py     ONNX checker, shape inference, external data, op inventory, portable ops
    F numerics  gates/numerics.py   golden prompts through the runtime vs the reference
"""

from calculet.calbin.gates import contract, files, graphs, memory, numerics, schema

GATES = (("A", files), ("B", schema), ("C", contract), ("D", memory), ("E", graphs), ("F", numerics))
