"""Where the KV buffers live: host memory (CPU, OpenVINO) or the GPU (CUDA), and the few operations
the runtime does on them besides running graphs.

Both stores hold, per K and V, one buffer [layers, lanes, kv_heads, context, head_dim] in the layout's
dtype (float32, or float16 for a calbin compiled with --kv-dtype fp16; portable graphs hand back new
K/V in that dtype too). A body graph binds layer l's rows [first_lane, first_lane + rows) as its
past_* input (and, for graphs that update the cache in place, as its present_* output): those rows
are contiguous, so a binding is a view (host) or a pointer into the buffer (GPU), never a copy. Portable graphs hand back the step's
new K/V instead ([layers, rows, kv_heads, S, head_dim]); `write_new` stores them, on the host with
numpy, on the GPU with device-to-device copies, so the KV never makes a round trip through the host.

    HostKV(layout)                      numpy buffers; OrtValues share their memory
    CudaKV(layout, device_id, cudart)   OrtValues on 'cuda'; new K/V rows copied on the device
"""

from __future__ import annotations

import mmap

import numpy as np

from calculet.calbin.manifest import KVLayout


def _zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zeroed KV buffer whose pages become resident only where written, in 4 KiB pages: NumPy asks
    for transparent huge pages on large arrays, and then one write makes 2 MiB resident per lane and
    layer (a lane fills only its first rows of a full-context buffer; a 640-row ring is 640 KiB per
    lane and layer). Measured on the served default model (context 32,768): the device holds 968 MiB
    once configured instead of 1,180, and the 8-lane decode step is no slower (4 KiB 32.9 ms vs huge
    33.2 ms at 200 tokens per lane, 5 alternating rounds)."""
    dtype = np.dtype(dtype)
    if not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.zeros(shape, dtype)
    count = int(np.prod(shape))
    memory = mmap.mmap(-1, max(count * dtype.itemsize, 1))   # anonymous: zero pages until written
    memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype, count=count).reshape(shape)


class HostKV:
    """numpy buffers, one K and one V array per buffer length [layers of that length, B, Nkv, length, D]
    (sliding-window layers compiled with a ring are shorter); `keys[i]`/`values[i]` are layer i's views."""

    device = "cpu"

    def __init__(self, layout: KVLayout):
        self.layout = layout
        self.groups: list[tuple[tuple[int, ...], np.ndarray, np.ndarray]] = []
        self.keys: list[np.ndarray] = [None] * layout.num_layers
        self.values: list[np.ndarray] = [None] * layout.num_layers
        for length in sorted(set(layout.layer_lengths), reverse=True):
            layers = tuple(i for i, n in enumerate(layout.layer_lengths) if n == length)
            shape = (len(layers), *layout.layer_shape(layers[0]))
            keys, values = _zeros(shape, layout.dtype), _zeros(shape, layout.dtype)
            self.groups.append((layers, keys, values))
            for j, layer in enumerate(layers):
                self.keys[layer], self.values[layer] = keys[j], values[j]
        self._keep = []                      # OrtValues bound to graphs must outlive the bindings

    @property
    def buffers(self) -> tuple[np.ndarray, ...]:
        return tuple(a for _, k, v in self.groups for a in (k, v))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.buffers)

    def bind(self, io, name: str, part: str, layer: int, first_lane: int, rows: int, output: bool) -> None:
        import onnxruntime as ort

        buffers = self.keys if part == "key" else self.values
        value = ort.OrtValue.ortvalue_from_numpy(buffers[layer][first_lane:first_lane + rows])  # a view
        self._keep.append(value)
        (io.bind_ortvalue_output if output else io.bind_ortvalue_input)(name, value)

    def clear(self, lane: int) -> None:
        for array in self.buffers:
            array[:, lane].fill(0.0)

    def new_buffer(self, shape: tuple[int, ...]):
        """An output buffer for a graph's new K/V (the KV dtype), bound with `bind_new`."""
        return np.zeros(shape, self.layout.dtype)

    def bind_new(self, io, name: str, buffer) -> None:
        import onnxruntime as ort

        value = ort.OrtValue.ortvalue_from_numpy(buffer)
        self._keep.append(value)
        io.bind_ortvalue_output(name, value)

    def write_new(self, src_rows, lanes, starts, counts, new_keys, new_values) -> None:
        """Row src_rows[i] of the new K/V ([layers, R, Nkv, S, D]), its first counts[i] tokens, goes to
        positions starts[i].. of lane lanes[i], all layers at once (a ring layer: row p mod ring)."""
        for layers, keys, values in self.groups:
            length, which = keys.shape[3], np.array(layers)
            ring = length != self.layout.context
            for r, lane, start, n in zip(src_rows, lanes, starts, counts):
                slots = np.arange(start, start + n) % length if ring else slice(start, start + n)
                keys[:, lane][:, :, slots] = new_keys[:, r, :, :n][which]      # [layers, Nkv, n, D]
                values[:, lane][:, :, slots] = new_values[:, r, :, :n][which]


class CudaKV:
    """OrtValues on the GPU, one K and one V per layer (each [B, Nkv, length, D]: rings are shorter)."""

    device = "cuda"

    def __init__(self, layout: KVLayout, device_id: int, cudart):
        import onnxruntime as ort

        self.layout, self.device_id, self.cudart = layout, device_id, cudart
        self.dtype = np.dtype(layout.dtype)
        self._item = self.dtype.itemsize      # bytes per value
        self._k, self._v = [], []
        for layer in range(layout.num_layers):
            for out in (self._k, self._v):
                value = ort.OrtValue.ortvalue_from_shape_and_type(list(layout.layer_shape(layer)), self.dtype, "cuda",
                                                                 device_id)
                cudart.memset(value.data_ptr(), self._layer_bytes(layer))
                out.append(value)
        cudart.synchronize()

    def _lane_bytes(self, layer: int) -> int:
        return self.layout.kv_heads * self.layout.layer_lengths[layer] * self.layout.head_dim * self._item

    def _layer_bytes(self, layer: int) -> int:
        return self.layout.lanes * self._lane_bytes(layer)

    @property
    def buffers(self) -> tuple:
        return tuple(self._k) + tuple(self._v)

    @property
    def nbytes(self) -> int:
        return 2 * sum(self._layer_bytes(layer) for layer in range(self.layout.num_layers))

    def _ptr(self, part: str, layer: int, lane: int) -> int:
        base = (self._k if part == "key" else self._v)[layer].data_ptr()
        return base + lane * self._lane_bytes(layer)

    def bind(self, io, name: str, part: str, layer: int, first_lane: int, rows: int, output: bool) -> None:
        _, kv_heads, length, head_dim = self.layout.layer_shape(layer)
        ptr = self._ptr(part, layer, first_lane)   # rows [first_lane, first_lane + rows) are contiguous
        (io.bind_output if output else io.bind_input)(name, "cuda", self.device_id, self.dtype,
                                                      [rows, kv_heads, length, head_dim], ptr)

    def clear(self, lane: int) -> None:
        for part in ("key", "value"):
            for layer in range(self.layout.num_layers):
                self.cudart.memset(self._ptr(part, layer, lane), self._lane_bytes(layer))
        self.cudart.synchronize()

    def new_buffer(self, shape: tuple[int, ...]):
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_shape_and_type(list(shape), self.dtype, "cuda", self.device_id)

    def bind_new(self, io, name: str, buffer) -> None:
        io.bind_ortvalue_output(name, buffer)

    def write_new(self, src_rows, lanes, starts, counts, new_keys, new_values) -> None:
        """As HostKV.write_new, with device-to-device copies: per layer, row and contiguous run of
        positions (a ring wraps at most once per run), the kv_heads blocks of n * head_dim floats are one
        2-D copy (source pitch S * D, destination pitch length * D; bytes = values x the KV dtype's size)."""
        layers, rows, kv_heads, steps, head_dim = new_keys.shape()
        item = self._item
        src_row_bytes = kv_heads * steps * head_dim * item
        for part, new in (("key", new_keys), ("value", new_values)):
            base = new.data_ptr()
            for r, lane, start, n in zip(src_rows, lanes, starts, counts):
                for layer in range(layers):
                    length = self.layout.layer_lengths[layer]
                    src = base + (layer * rows + r) * src_row_bytes
                    done = 0
                    while done < n:  # positions start+done.. up to the end of the buffer, then from row 0
                        slot = (start + done) % length
                        run = min(n - done, length - slot)
                        self.cudart.copy_2d(self._ptr(part, layer, lane) + slot * head_dim * item, length * head_dim * item,
                                            src + done * head_dim * item, steps * head_dim * item,
                                            run * head_dim * item, kv_heads)
                        done += run
        self.cudart.synchronize()
