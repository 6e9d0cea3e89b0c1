"""Real server processes for the server tests: `python -m calculet serve CALBIN --port P` on 127.0.0.1.

Each test module starts its server once (module-scoped fixtures) and talks to it with the official
`openai` client and httpx. A server's log is printed when it fails to come up.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from serving import Server, free_port  # noqa: F401  (re-exported for the server tests)


@pytest.fixture(scope="module")
def start_server(tmp_path_factory):
    """start_server(calbin, *args, env=None, api_key=None, timeout=60) -> a healthy Server, stopped after the module."""
    started = []

    def start(calbin, *args, env=None, api_key=None, timeout=60.0) -> Server:
        log_path = tmp_path_factory.mktemp("server") / "server.log"
        server = Server(calbin, log_path, *args, env=env, api_key=api_key)
        started.append(server)
        return server.wait_ready(timeout)

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="session")
def served_default_calbin(request):
    """The default model's calbin: $CALCULET_TEST_DEFAULT_CALBIN when set (reuse a compiled one), else
    the session's `default_calbin`. Skips while the GGUF reader is missing."""
    pytest.importorskip("calculet.sources.gguf")
    given = os.environ.get("CALCULET_TEST_DEFAULT_CALBIN")
    if given:
        return Path(given)
    return request.getfixturevalue("default_calbin")
