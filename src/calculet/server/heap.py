"""Keep the loaded models' Python objects out of the cyclic garbage collector's full passes.

A served model leaves ~100,000 long-lived Python objects behind its load (the engine, the
tokenizer's tables, the FastAPI app, ONNX Runtime's bindings). CPython's full (generation-2)
collection walks every one of them while holding the GIL, so each full pass stalls the engine thread
and with it every decoding stream: measured on the default model under 8 streams (~99,000 objects
after its load), a full pass inside the serving window took 36 ms (benchmarks/RESULTS.md, 2026-12-05 (6)). After a load (and after an unload or reload) `settle()` collects once and
moves what survived into the permanent generation (`gc.freeze()`); later full passes walk only the
objects made since. Nothing is leaked by it: frozen objects are still freed by reference counting,
and every settle first unfreezes, so the cycles of a model that was unloaded are collected there.
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("calculet.server")


@dataclass(frozen=True)
class HeapSettle:
    collected: int       # unreachable objects the collection freed
    frozen: int          # objects now in the permanent generation
    seconds: float       # time of the whole settle (the GIL is held throughout)


def settle() -> HeapSettle:
    """Unfreeze, collect everything, then freeze the survivors; call it with no request half-built."""
    t0 = time.perf_counter()
    gc.unfreeze()
    collected = gc.collect()
    gc.freeze()
    report = HeapSettle(collected, gc.get_freeze_count(), time.perf_counter() - t0)
    log.info("heap settled: %d objects frozen out of the collector's full passes, %d collected, %.0f ms",
             report.frozen, report.collected, report.seconds * 1e3)
    return report
