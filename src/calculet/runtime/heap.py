"""Process memory housekeeping shared by the loaders (the runtime's Program, the engine's tokenizer)."""

from __future__ import annotations


def trim_heap() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim). Loading a model or a large tokenizer
    parses big temporary structures; without this their pages stay resident. No-op off glibc."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
