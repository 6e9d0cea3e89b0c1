"""Graceful shutdown: on SIGTERM (or Ctrl-C) the server drains instead of cutting streams.

    signal 1 ─▶ draining: new requests get 503 shutting_down + Retry-After, /health says "draining"
             ─▶ running and waiting requests go on, up to --drain-timeout seconds
             ─▶ the engine stops: what is left ends with an error (a stream gets an error event,
                then `data: [DONE]`), the HTTP server closes once every response is written
             ─▶ exit code 0
    signal 2 ─▶ stop waiting: end what is left now (same endings)

The HTTP server keeps listening while it drains, so a client that arrives meanwhile hears 503 with
`Retry-After` rather than a refused connection.
"""

from __future__ import annotations

import logging
import threading

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
        model = self.host.model
        if model is not None:
            engine = model.engine
            engine.begin_drain()
            running = engine.snapshot()
            log.info("shutting down: admitting no new requests, draining %d running and %d waiting request(s) "
                     "(up to %g s, --drain-timeout)", running.running, running.waiting, self.timeout_s)
            if not engine.wait_idle(self.timeout_s, self.hurry):
                left = engine.snapshot()
                log.warning("drain timeout: ending %d running and %d waiting request(s)", left.running, left.waiting)
            engine.stop()
        self.stop_server()
