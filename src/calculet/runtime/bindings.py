"""IO bindings kept alive between steps: per staging slot (ping and pong, see runtime/jobs.py), one
per body graph and first lane, one per head graph.

Each binding owns small staging arrays bound once as OrtValues that share memory with numpy. A body
binds its lanes' KV buffers as both the past_* input and the present_* output, so every run updates
them in place, and binds its `hidden` output to the input array of the head graph it feeds, so the
hand-over between the two graphs copies nothing. A step only writes a few integers and runs.

With the CUDA provider the KV buffers, the body's new K/V outputs and the body-to-head `hidden`
tensor are OrtValues on the GPU (the lanes' `CudaKV` store places them); only the small integer
inputs (staged on the host, copied in by ONNX Runtime) and the head's outputs (logits and candidates,
which the sampler reads) cross to and from the host each step.
"""

from __future__ import annotations

import numpy as np

from calculet.calbin.graphspec import GraphSpec
from calculet.runtime.lanes import Lanes


class _Bound:
    def __init__(self, session, graph: GraphSpec):
        self.graph = graph
        self.session = session
        self.io = session.io_binding()
        self._keep = []  # OrtValues must outlive the binding

    def _value(self, array: np.ndarray):
        import onnxruntime as ort

        value = ort.OrtValue.ortvalue_from_numpy(array)
        self._keep.append(value)
        return value

    def _bind_in(self, name: str, array: np.ndarray) -> None:
        self.io.bind_ortvalue_input(name, self._value(array))

    def _bind_out(self, name: str, array: np.ndarray) -> None:
        self.io.bind_ortvalue_output(name, self._value(array))

    def run(self) -> None:
        self.session.run_with_iobinding(self.io)


class HeadBinding(_Bound):
    """hidden [R, H] -> logits [R, V] (+ topk_values / topk_ids [R, K]).

    device "cuda": `hidden` is an OrtValue on the GPU (the body writes it there); else a numpy array."""

    def __init__(self, session, graph: GraphSpec, device: str = "cpu", device_id: int = 0):
        super().__init__(session, graph)
        if device == "cuda":
            import onnxruntime as ort

            self.hidden = ort.OrtValue.ortvalue_from_shape_and_type(list(graph.inputs[0].shape), np.float32, "cuda",
                                                                   device_id)
            self._keep.append(self.hidden)
            self.io.bind_ortvalue_input("hidden", self.hidden)
        else:
            self.hidden = np.zeros(graph.inputs[0].shape, np.float32)
            self._bind_in("hidden", self.hidden)
        self.outputs: dict[str, np.ndarray] = {}
        for t in graph.outputs:
            self.outputs[t.name] = np.zeros(t.shape, dtype=t.dtype)
            self._bind_out(t.name, self.outputs[t.name])


class BodyBinding(_Bound):
    """A prefill or decode body over lanes [first_lane, first_lane + lanes), writing into `head`."""

    def __init__(self, session, graph: GraphSpec, lanes: Lanes, first_lane: int, head: HeadBinding):
        super().__init__(session, graph)
        self.first_lane = first_lane
        self.head = head
        self.inputs: dict[str, np.ndarray] = {}
        for t in graph.inputs:
            if not t.name.startswith("past_"):
                self.inputs[t.name] = np.zeros(t.shape, dtype=t.dtype)
                self._bind_in(t.name, self.inputs[t.name])
        outputs = {t.name: t for t in graph.outputs}
        self.in_place = "new_keys" not in outputs
        store = lanes.store
        for layer in range(lanes.layout.num_layers):
            for part in ("key", "value"):
                # rows [first_lane, first_lane + lanes) of the layer's buffer: a view, never a copy
                store.bind(self.io, f"past_{part}.{layer}", part, layer, first_lane, graph.lanes, output=False)
                if self.in_place:
                    store.bind(self.io, f"present_{part}.{layer}", part, layer, first_lane, graph.lanes, output=True)
        self.new_kv: dict[str, object] = {}
        if not self.in_place:  # portable graphs hand back this step's K/V for the runtime to store
            for name in ("new_keys", "new_values"):
                self.new_kv[name] = store.new_buffer(outputs[name].shape)
                store.bind_new(self.io, name, self.new_kv[name])
        if isinstance(head.hidden, np.ndarray):
            self._bind_out("hidden", head.hidden)
        else:
            self.io.bind_ortvalue_output("hidden", head.hidden)
        self.expert_mask = None  # MoE calbins compiled with --expert-stats: [sparse layers, rows, experts]
        if "expert_mask" in outputs:
            self.expert_mask = np.zeros(outputs["expert_mask"].shape, np.uint8)
            self._bind_out("expert_mask", self.expert_mask)

    def run(self, head: bool = True) -> None:
        super().run()
        if head:
            self.head.run()
