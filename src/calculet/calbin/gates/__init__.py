"""The structural gates, in order; each module holds one gate's rules and `run(ctx)`.

    A files     gates/files.py      what is on disk vs manifest.files (sizes, hashes, unlisted files)
    B manifest  gates/schema.py     schema version, required fields, graph types and exact names, units
    C contract  gates/contract.py   lanes, context, vocab, KV layout, dtypes: manifest == .onnx == tokenizer
    D memory    gates/memory.py     the memory plan == what the runtime allocates: weights, KV, staging, total
    E graphs    gates/graphs.py     ONNX checker, shape inference, external data, op inventory, portable ops
    P partition gates/partition.py  --chips N calbins: chip sub-calbins (A, B, D, E each), placement, collectives, memory

Gate F (golden numerics through the runtime) needs the runtime and the reference, which sit above
calbin/: it is `calculet/golden_gate.py`, and `calculet.validation` passes it in as a later gate.
"""

from calculet.calbin.gates import contract, files, graphs, memory, partition, schema

GATES = (("A", files), ("B", schema), ("C", contract), ("D", memory), ("E", graphs), ("P", partition))
