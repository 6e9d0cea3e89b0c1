"""IO bindings kept alive between steps: one per (graph, first lane).

Each binding owns small input staging arrays (input_ids, seqlens_k, ...) and a logits array, bound
once as OrtValues that share memory with numpy; the KV buffers of its lanes are bound as both the
past_* input and the present_* output, so every run updates them in place. A step only writes a
few integers into the staging arrays and runs.
"""

from __future__ import annotations

import numpy as np

from calculet.compiler.graphs import GraphSpec
from calculet.runtime.lanes import Lanes


class Binding:
    def __init__(self, session, graph: GraphSpec, lanes: Lanes, first_lane: int):
        import onnxruntime as ort

        self.graph = graph
        self.session = session
        self.first_lane = first_lane
        rows = slice(first_lane, first_lane + graph.lanes)
        self.inputs: dict[str, np.ndarray] = {}
        self.io = session.io_binding()
        self._keep = []  # OrtValues must outlive the binding
        for t in graph.inputs:
            if t.name.startswith("past_"):
                continue
            array = np.zeros(t.shape, dtype=t.dtype)
            self.inputs[t.name] = array
            self._bind_input(t.name, ort.OrtValue.ortvalue_from_numpy(array))
        for layer in range(lanes.layout.num_layers):
            for part, buffers in (("key", lanes.keys), ("value", lanes.values)):
                value = ort.OrtValue.ortvalue_from_numpy(buffers[layer][rows])  # a view: shares memory
                self._bind_input(f"past_{part}.{layer}", value)
                self.io.bind_ortvalue_output(f"present_{part}.{layer}", value)
        self.logits = np.zeros((graph.lanes, graph.outputs[0].shape[1]), np.float32)
        logits_value = ort.OrtValue.ortvalue_from_numpy(self.logits)
        self._keep.append(logits_value)
        self.io.bind_ortvalue_output("logits", logits_value)

    def _bind_input(self, name: str, value) -> None:
        self._keep.append(value)
        self.io.bind_ortvalue_input(name, value)

    def run(self) -> None:
        self.session.run_with_iobinding(self.io)
