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


@pytest.fixture(scope="session")
def slow_calbin(tmp_path_factory):
    """A random Llama made big enough (8 layers, hidden 512: ~15 ms a step here) that a 1000-token
    request certainly holds its lane for seconds: 2 lanes, context 1024."""
    import tiny_models
    from calculet.compiler.compile import compile_calbin
    from calculet.compiler.options import CompileOptions

    folder = tiny_models.make_tiny_model("llama", tmp_path_factory.mktemp("hf-slow"), hidden_size=512, intermediate_size=2048,
                                         num_hidden_layers=8, num_attention_heads=8, head_dim=64)
    out = tmp_path_factory.mktemp("calbin-slow") / "model.calbin"
    options = CompileOptions(lanes=2, context=1024, prefill_chunks=(16, 128), golden=False)
    return compile_calbin(str(folder), out, options, log=lambda _m: None)
