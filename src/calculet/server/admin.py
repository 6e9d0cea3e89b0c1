"""Admin endpoints: the served models' lifecycle while the server serves (server/host.py does the work).

    GET    /admin/models                  the models, their state, chips and memory
    POST   /admin/models                  load: {"source" | "calbin", "name", "chips", "lanes", "chat_template",
                                          "max_queue", "max_prefill_tokens", "step_token_budget", "burst_prefill_tokens",
                                          "ttft_target", "in_flight",
                                          "request_timeout"}
    DELETE /admin/models/{name}           unload with drain; answers once drained
    POST   /admin/models/{name}/reload    {"source": new calbin or source} (default: the same path again);
                                          answers once the new version serves and the old one drained

Every one needs `Authorization: Bearer <admin key>` (--admin-key, else --api-key); with neither
key set they answer 403. Each runs on a thread of its own, so serving goes on meanwhile.
"""

from __future__ import annotations

import asyncio
import hmac

from fastapi import Depends, FastAPI, Request

from calculet.errors import RequestError
from calculet.server.model_spec import from_mapping


def add_admin_routes(app: FastAPI, config, host) -> None:
    secret = config.admin_secret.encode() if config.admin_secret else None

    async def admin(request: Request) -> None:
        if secret is None:
            raise RequestError("admin_disabled", "the admin endpoints are off; start the server with --admin-key KEY "
                               "(or --api-key KEY)")
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), secret):
            raise RequestError("unauthorized", "missing or wrong admin key; send the header `Authorization: Bearer <key>` "
                               "with the --admin-key (or --api-key) the server was started with")

    guard = [Depends(admin)]

    @app.get("/admin/models", dependencies=guard, tags=["admin"])
    async def list_models():
        return {"object": "list", "data": host.admin_list(), "chips": _chips(host)}

    @app.post("/admin/models", dependencies=guard, tags=["admin"])
    async def load(request: Request):
        body = await _json(request)
        spec = from_mapping(body, config.model_spec(), "POST /admin/models body")
        if spec.source is None:
            raise RequestError("missing_parameter", "source: give the calbin or source to load (or calbin)")
        model = await asyncio.to_thread(host.add, spec)
        return {**model.card(), "chips": list(model.chips), "memory_bytes": model.memory_bytes}

    @app.delete("/admin/models/{name}", dependencies=guard, tags=["admin"])
    async def unload(name: str):
        seconds = await asyncio.to_thread(host.remove, name)
        return {"id": name, "object": "model", "deleted": True, "drained_s": round(seconds, 3)}

    @app.post("/admin/models/{name}/reload", dependencies=guard, tags=["admin"])
    async def reload(name: str, request: Request):
        body = await _json(request, allow_empty=True)
        unknown = sorted(set(body) - {"source", "calbin"})
        if unknown:
            raise RequestError("bad_option", f"reload body: unknown key {unknown[0]!r}; allowed: source (or calbin)")
        source = body.get("calbin", body.get("source"))
        if source is not None and not isinstance(source, str):
            raise RequestError("bad_option", f"reload body: source must be a path, got {source!r}")
        model = await asyncio.to_thread(host.reload, name, source)
        return {**model.card(), "chips": list(model.chips), "memory_bytes": model.memory_bytes}


async def _json(request: Request, allow_empty: bool = False) -> dict:
    raw = await request.body()
    if not raw.strip() and allow_empty:
        return {}
    import json

    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise RequestError("invalid_json", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError("invalid_json", "the request body must be a JSON object")
    return body


def _chips(host) -> list[dict]:
    p = host.placement
    return [{"index": c.index, "provider": c.provider, "threads": c.intra_op_threads,
             "memory_budget": c.memory_budget_bytes or None, "memory_used": p.used(c.index)} for c in p.chips]
