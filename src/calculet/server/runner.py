"""Run the server: bind at once (so /health can say "loading"), load the models in the background,
log one line with the URL when both are ready. With one model, a model that fails to load ends the
process (exit 2); with several, the others are served and only none loading ends it.
SIGTERM and Ctrl-C drain (server/drain.py) and exit 0."""

from __future__ import annotations

import logging
import sys
import threading
import time
from contextlib import asynccontextmanager

log = logging.getLogger(__name__)


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("calculet")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False


def run_server(config) -> int:
    import uvicorn

    from calculet.server.app import create_app
    from calculet.server.drain import Drain
    from calculet.server.metrics import ServerMetrics
    from calculet.server.host import ModelHost

    _setup_logging()
    metrics = ServerMetrics()
    host = ModelHost(config, metrics)
    state = {"exit": 0}

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=_load_then_announce, name="calculet-load", daemon=True).start()
        yield
        host.close()
        app.state.text_pool.close()

    app = create_app(config, host, metrics)
    app.router.lifespan_context = lifespan
    # loop and parser pinned: uvicorn's "auto" picks uvloop/httptools when installed (the `ray` extra
    # installs both), and the body limit and drain were built and tested on asyncio + h11.
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level="warning", access_log=False,
                               loop="asyncio", http="h11",
                               timeout_graceful_shutdown=5)   # after the drain: time to write the last frames

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame):  # instead of uvicorn's: drain first, and do not re-raise the signal
            drain.signal(sig)

    server = DrainingServer(uv_config)
    drain = Drain(host, config.drain_timeout_s, stop_server=lambda: setattr(server, "should_exit", True))

    def _load_then_announce() -> None:
        t0 = time.perf_counter()
        specs = host.specs
        log.info("loading %s", ", ".join(s.source or "the embedded default model" for s in specs))
        host.load()
        if host.state != "ready":
            log.error("cannot serve: %s", host.error.one_line() if hasattr(host.error, "one_line") else host.error)
            state["exit"] = 2
            server.should_exit = True
            return
        while not server.started and not server.should_exit:
            time.sleep(0.01)
        for m in host.models():
            log.info("ready at %s/v1 (model %s on chip %s, lanes %d, context %d, loaded in %.1f s)", config.url, m.name,
                     ",".join(map(str, m.chips)), m.lanes, m.context, time.perf_counter() - t0)

    server.run()
    if not server.started and state["exit"] == 0:
        return 1  # could not bind: uvicorn has said why
    return state["exit"]
