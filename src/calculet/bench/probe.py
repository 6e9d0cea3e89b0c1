"""What the harness asks the server before a run: is it up, does it serve the model, its context.

Nothing here is required of a server: every answer is optional and recorded as found in `run.json`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from calculet.errors import RequestError


@dataclass(frozen=True)
class ServerFacts:
    models: list[str] = field(default_factory=list)   # ids listed by /v1/models
    context: int | None = None                        # tokens per request, when the server says
    context_source: str | None = None
    raw: dict[str, Any] = field(default_factory=dict)  # the answers, trimmed, for run.json


def _context_from_models(entry: dict[str, Any]) -> int | None:
    for key in ("max_model_len", "context_length", "max_context", "n_ctx"):
        if isinstance(entry.get(key), int):
            return entry[key]
    meta = entry.get("meta")
    if isinstance(meta, dict) and isinstance(meta.get("n_ctx_train"), int):
        return meta["n_ctx_train"]
    return None


def probe_server(base_url: str, model: str, headers: dict[str, str], timeout_s: float = 10.0) -> ServerFacts:
    """List the server's models and find its context length; raise when the server is not there."""
    raw: dict[str, Any] = {}
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        try:
            response = client.get(base_url + "/v1/models")
        except httpx.HTTPError as exc:
            raise RequestError("server_unreachable", f"cannot reach {base_url}/v1/models: {exc}") from None
        models: list[str] = []
        context, source = None, None
        if response.status_code == 200:
            data = response.json().get("data", [])
            raw["models_listing"] = data[:8]
            models = [str(m.get("id")) for m in data if isinstance(m, dict)]
            for entry in data:
                if isinstance(entry, dict) and entry.get("id") == model:
                    context = _context_from_models(entry)
                    source = "/v1/models" if context else None
        elif response.status_code in (401, 403):
            raise RequestError("unauthorized", f"{base_url}/v1/models answered HTTP {response.status_code}: "
                               "give --api-key")
        # llama.cpp's /props holds the context each slot really has (smaller than n_ctx_train).
        try:
            props = client.get(base_url + "/props")
            if props.status_code == 200:
                settings = props.json().get("default_generation_settings", {})
                raw["props"] = {k: props.json().get(k) for k in ("total_slots", "build_info", "model_path")}
                n_ctx = settings.get("n_ctx")
                if isinstance(n_ctx, int) and n_ctx > 0:
                    context, source = n_ctx, "/props"
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
    if models and model not in models:
        raw["warning"] = f"model {model!r} is not among the served models {models}"
    return ServerFacts(models=models, context=context, context_source=source, raw=raw)
