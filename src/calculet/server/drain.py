"""Graceful shutdown: on SIGTERM (or Ctrl-C) the server drains instead of cutting streams.

    signal 1 ─▶ draining: new requests get 503 shutting_down + Retry-After, /health says "draining"
             ─▶ running and waiting requests go on, up to --drain-timeout seconds
             ─▶ the engine stops: what is left ends with an error (a stream gets an error event,
                then `data: [DONE]`), the HTTP server closes once every response is written
             ─▶ exit code 0
    signal 2 ─▶ stop waiting: end what is left now (same endings)

`drain_engine` is the same drain for one model (unload, or the old version after a reload).

The HTTP server keeps listening while it drains, so a client that arrives meanwhile hears 503 with
`Retry-After` rather than a refused connection.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("calculet.server")


class Drain:
    def __init__(self, host, timeout_s: float, stop_server):
        """host: ModelHost; stop_server(): tell the HTTP server to close (called from the drain thread)."""
        self.host = host
        self.timeout_s = timeout_s
        self.stop_server = stop_server
        self.hurry = threading.Event()        # a second signal: stop waiting
        self._thread: threading.Thread | None = None

    def signal(self, signum: int) -> None:
        """The process's SIGTERM/SIGINT handler (main thread): start draining, or hurry a drain on."""
        if self.host.draining.is_set():
            log.warning("second shutdown signal: ending the requests still running now")
            self.hurry.set()
            return
        self.host.draining.set()
        self._thread = threading.Thread(target=self._run, name="calculet-drain", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        engines = self.host.engines()
        for engine in engines:
            engine.begin_drain()
        if engines:
            running = [e.snapshot() for e in engines]
            log.info("shutting down: admitting no new requests, draining %d running and %d waiting request(s) "
                     "(up to %g s, --drain-timeout)", sum(s.running for s in running), sum(s.waiting for s in running),
                     self.timeout_s)
        deadline = time.monotonic() + self.timeout_s
        for engine in engines:
            if not engine.wait_idle(max(0.0, deadline - time.monotonic()), self.hurry):
                left = engine.snapshot()
                log.warning("drain timeout: ending %d running and %d waiting request(s)", left.running, left.waiting)
            engine.stop()
        self.stop_server()


def drain_engine(engine, timeout_s: float, hurry: threading.Event | None = None, what: str = "the model") -> float:
    """One model's drain (unload, or the old version after a reload): admit nothing new, let running and
    waiting requests finish for up to `timeout_s`, then stop the engine (what is left ends with an
    error). Returns the seconds it took."""
    t0 = time.monotonic()
    engine.begin_drain()
    snap = engine.snapshot()
    log.info("%s: draining %d running and %d waiting request(s) (up to %g s, --drain-timeout)", what, snap.running,
             snap.waiting, timeout_s)
    if not engine.wait_idle(timeout_s, hurry):
        left = engine.snapshot()
        log.warning("%s: drain timeout: ending %d running and %d waiting request(s)", what, left.running, left.waiting)
    engine.stop()
    return time.monotonic() - t0
