"""The few CUDA runtime calls the CUDA provider's device-resident KV needs, through ctypes.

ONNX Runtime allocates the KV buffers on the GPU (`OrtValue.ortvalue_from_shape_and_type(..., "cuda")`)
but has no Python call that copies or zeroes part of one. These do: zero a lane's rows, copy a
portable graph's new K/V rows into the lanes' buffers (device to device), count the GPUs. The library
is the CUDA runtime that onnxruntime-gpu itself loads (`libcudart.so.12`, from the system or the
`nvidia-cuda-runtime-cu12` wheel); nothing here is imported without `--provider cuda`.
"""

from __future__ import annotations

import ctypes
import glob
import os

from calculet.errors import DeviceError

_MEMCPY_DEVICE_TO_DEVICE = 3
_SONAMES = ("libcudart.so.12", "libcudart.so.13", "libcudart.so")


def _wheel_candidates() -> list[str]:
    """libcudart from the nvidia-* wheels onnxruntime-gpu[cuda] installs (site-packages/nvidia/...)."""
    try:
        import nvidia  # namespace package of the NVIDIA wheels
    except ImportError:
        return []
    found = []
    for root in getattr(nvidia, "__path__", []):
        found += sorted(glob.glob(os.path.join(root, "*", "lib", "libcudart.so*")))
    return found


class CudaRuntime:
    """A loaded libcudart. Every call checks its status and raises DeviceError with CUDA's message."""

    def __init__(self):
        self.lib = None
        tried = []
        for name in _SONAMES + tuple(_wheel_candidates()):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError as exc:
                tried.append(f"{name}: {exc}")
        if self.lib is None:
            raise DeviceError("cuda_runtime_missing",
                              "cannot load the CUDA runtime (libcudart) that onnxruntime-gpu needs: "
                              f"{'; '.join(tried[:3])}; install `onnxruntime-gpu[cuda,cudnn]` or a CUDA 12 toolkit")
        lib = self.lib
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaMemcpy2D.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                                     ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
        lib.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        lib.cudaGetDeviceCount.argtypes = [ctypes.POINTER(ctypes.c_int)]

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = self.lib.cudaGetErrorString(status).decode(errors="replace")
            raise DeviceError("cuda_call_failed", f"{what} failed: CUDA error {status} ({message})")

    def device_count(self) -> tuple[int, str]:
        """(GPUs this process can see, why none when 0). No driver (CUDA error 35, 'driver version is
        insufficient', which is also what a machine without the NVIDIA driver gives) or no device
        (error 100) count as none; other errors raise."""
        n = ctypes.c_int(0)
        status = self.lib.cudaGetDeviceCount(ctypes.byref(n))
        if status in (35, 100):  # cudaErrorInsufficientDriver, cudaErrorNoDevice
            return 0, f"CUDA error {status}: {self.lib.cudaGetErrorString(status).decode(errors='replace')}"
        self._check(status, "cudaGetDeviceCount")
        return n.value, "" if n.value else "the driver lists no device"

    def memset(self, ptr: int, nbytes: int) -> None:
        self._check(self.lib.cudaMemset(ptr, 0, nbytes), "cudaMemset")

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int) -> None:
        """`height` rows of `width` bytes, device to device, with the given row pitches (bytes)."""
        self._check(self.lib.cudaMemcpy2D(dst, dst_pitch, src, src_pitch, width, height, _MEMCPY_DEVICE_TO_DEVICE),
                    "cudaMemcpy2D")

    def synchronize(self) -> None:
        """Device-to-device copies return before they finish; ONNX Runtime's next run is on its own stream."""
        self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
