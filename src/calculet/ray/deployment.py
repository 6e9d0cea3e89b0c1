"""The Ray Serve application: model replicas behind one router, one OpenAI endpoint.

    Serve HTTP proxy ─▶ Router (ingress, no CPU reserved) ─(DeploymentHandle, streaming)─▶ Model × N

- `ModelReplica`: one calbin on one device, loaded in the constructor (Serve marks the replica
  ready only once the model is), with the engine and the very FastAPI app `calculet serve` runs
  (server/app.py): the same routes, errors, streaming and metrics. Every response names its replica
  in the `x-calculet-replica` header; /metrics and /health answer for the replica they reach.
- `Router`: forwards each HTTP request to a replica (Serve's router picks it: queue length, or the
  session affinity of `affinity.py`) and writes its messages back. When a replica dies, the requests
  it held end with a 503 `replica_unavailable` OpenAI error (a stream: an error event, then
  `data: [DONE]`); Serve starts a replacement and routes new requests to the live ones.

`build_app(server_config, options)` returns the bound application for `serve.run` or composition;
`app_builder(args)` is the same from a Serve config file (`import_path:
calculet.ray.deployment:app_builder`, see deploy/serve.yaml).
"""

from __future__ import annotations

import dataclasses
import logging

from ray import serve
from ray.exceptions import RayError, RayTaskError
from ray.serve.exceptions import BackPressureError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from calculet.errors import DeviceError, ModelError, RequestError
from calculet.ray.affinity import affinity_key
from calculet.ray.bridge import ForwardedRequest, run_asgi
from calculet.ray.options import ReplicaOptions, calbin_profile, split_args
from calculet.server.config import ServerConfig
from calculet.server.errors import error_body, error_response
from calculet.server.limits import default_max_body_bytes

log = logging.getLogger(__name__)

REPLICA_HEADER = b"x-calculet-replica"
MODEL_DEPLOYMENT = "CalculetModel"
ROUTER_DEPLOYMENT = "CalculetRouter"
QUIET = {"enable_access_log": False}   # the router logs each request once; the replica need not
ROUTER_MAX_ONGOING = 1000
ROUTER_MAX_BODY_BYTES = 64 << 20   # a source's context is known only on the replicas: the router's cap then   # the router only relays: it holds every request the replicas and Serve's queue hold


class ModelReplica:
    """One calbin on one device, serving server/app.py's FastAPI app to the router."""

    def __init__(self, config: ServerConfig):
        from calculet.server.app import create_app
        from calculet.server.metrics import ServerMetrics
        from calculet.server.host import ModelHost

        self.replica = serve.get_replica_context().replica_id.to_full_id_str()
        self.metrics = ServerMetrics()
        self.host = ModelHost(config, self.metrics)
        self.host.load()
        if self.host.state != "ready":   # Serve reports the constructor's error and retries the replica
            raise RuntimeError(f"replica {self.replica} could not load the model: {self.host.error}")
        self.app = create_app(config, self.host, self.metrics)
        self.headers = ((REPLICA_HEADER, self.replica.encode()),)
        log.info("replica %s ready (%s)", self.replica, ", ".join(f"model {m.name}, lanes {m.lanes}" for m in self.host.models()))

    async def handle(self, request: ForwardedRequest, affinity: str | None = None):
        """The app's ASGI messages for one request. `affinity` is read by the request router only."""
        async for message in run_asgi(self.app, request, self.headers):
            yield message

    def check_health(self) -> None:
        """Serve's periodic check: an engine that stopped or cannot reset its device fails it (Serve then
        replaces the replica); a device being reset is still healthy."""
        states = [engine.snapshot().state for engine in self.host.engines()]
        if not states or any(state in ("failed", "stopped") for state in states):
            raise RuntimeError(f"replica {self.replica}: engine states {states}")

    def __del__(self):
        """Serve calls this once the replica's requests finished or graceful_shutdown_timeout_s passed."""
        host = getattr(self, "host", None)
        if host is not None:
            host.draining.set()
            host.close()


def replica_lost(exc: BaseException) -> DeviceError | ModelError:
    """The error a request gets when its replica failed under it."""
    if isinstance(exc, RayTaskError):   # our replica code raised: a bug, not a lost replica
        return ModelError("replica_error", f"the model replica failed the request: {type(exc.cause).__name__}: "
                          f"{str(exc.cause)[:300]}")
    return DeviceError("replica_unavailable", f"the model replica serving this request stopped "
                       f"({type(exc).__name__}); retry, a healthy replica will take it")


def _sse(data) -> bytes:
    import json

    return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"


class Router:
    """The HTTP ingress: forwards each request to a model replica and relays what it answers."""

    def __init__(self, model, affinity: str = "off", max_body_bytes: int = ROUTER_MAX_BODY_BYTES, max_queued: int = -1):
        self.model = model.options(stream=True)
        self.max_queued = max_queued
        self.affinity = affinity
        self.max_body_bytes = max_body_bytes   # the replicas' limit (server/limits.py), so no bigger body is held here

    async def __call__(self, request: Request) -> Response:
        if request.scope["path"].removeprefix(request.scope.get("root_path", "")).startswith("/admin"):
            return error_response(RequestError("not_found", "/admin is off behind Ray Serve: each replica would change "
                                               "alone; change the models with a redeploy (a rolling update)"))
        body = await self._body(request)
        if body is None:
            return _too_large(self.max_body_bytes)
        headers = tuple((bytes(k), bytes(v)) for k, v in request.scope["headers"])
        path, root = request.scope["path"], request.scope.get("root_path", "")
        if root and path.startswith(root):   # the app's routes start at the route prefix
            path = path[len(root):] or "/"
        forwarded = ForwardedRequest(request.method, path, request.scope.get("query_string", b""),
                                     headers, body, tuple(request.client) if request.client else None)
        messages = self.model.handle.remote(forwarded, affinity=affinity_key(self.affinity, headers, body))
        try:
            start = await messages.__anext__()
        except StopAsyncIteration:
            return error_response(ModelError("replica_error", "the model replica sent no response"))
        except BackPressureError:   # every replica full and this router's queue too: the server's 429
            return error_response(RequestError("queue_full", f"every replica is busy and the router's queue is full "
                                               f"({self.max_queued} waiting, --max-queue); retry shortly"))
        except RayError as exc:
            log.warning("request lost before its response started: %s", exc)
            return error_response(replica_lost(exc))
        raw = [(bytes(k), bytes(v)) for k, v in start.get("headers", ())]
        sse = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream") for k, v in raw)
        if sse:
            response: Response = StreamingResponse(self._relay(messages), status_code=start["status"])
        else:   # one JSON body: gather it, so a replica lost halfway still gets a whole 503 body
            parts = []
            try:
                async for message in messages:
                    parts.append(message.get("body", b""))
            except RayError as exc:
                log.warning("request lost before its body was complete: %s", exc)
                return error_response(replica_lost(exc))
            response = Response(b"".join(parts), status_code=start["status"])
        response.raw_headers = raw
        return response

    async def _body(self, request: Request) -> bytes | None:
        """The whole body, or None once it passes max_body_bytes (declared or counted)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return None
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            parts.append(chunk)
        return b"".join(parts)

    async def _relay(self, messages):
        """Body chunks of a stream; if the replica is lost: an error event, then [DONE]."""
        done = False
        try:
            async for message in messages:
                chunk = message.get("body", b"")
                if chunk:
                    yield chunk
            done = True
        except RayError as exc:
            log.warning("stream lost mid-way: %s", exc)
            yield _sse(error_body(replica_lost(exc)))
            yield _sse(b"[DONE]")
            done = True
        finally:
            if not done:   # the client left: stop the replica's request (it frees its lane)
                messages.cancel()


def _too_large(limit: int) -> Response:
    """The same 413 the server's BodyLimit sends."""
    import json

    return Response(json.dumps({"error": {"message": f"the request body is larger than {limit} bytes; allowed: at most "
                                                     f"{limit} bytes (--max-body-bytes; the default follows the model's context)",
                                          "type": "invalid_request_error", "code": "body_too_large", "param": None}}),
                    status_code=413, media_type="application/json")


def build_app(config: ServerConfig | None = None, options: ReplicaOptions | None = None, *,
              name: str = MODEL_DEPLOYMENT):
    """The bound Serve application: `serve.run(build_app(ServerConfig(model=calbin), ReplicaOptions(replicas=2)))`.
    config: each replica's server options (model, queue, timeouts, ...; host/port are Serve's);
    options: replica count or autoscaling bounds, affinity, CPUs per replica."""
    config = config or ServerConfig()
    options = options or ReplicaOptions()
    if config.threads == 0:   # all cores per replica would fight the other replicas on the node
        config = dataclasses.replace(config, threads=max(1, int(options.num_cpus)))
    profile = calbin_profile(config.model)
    model_opts = options.deployment_options(profile.lanes if profile else None)
    max_body = config.max_body_bytes or (default_max_body_bytes(profile.context) if profile else ROUTER_MAX_BODY_BYTES)
    # requests waiting for a replica wait at the router, at most --max-queue of them (then 429, as the server)
    model = serve.deployment(ModelReplica, name=name).options(**model_opts, max_queued_requests=config.max_queue,
                                                               logging_config=QUIET).bind(config)
    router = serve.deployment(Router, name=ROUTER_DEPLOYMENT).options(
        ray_actor_options={"num_cpus": 0}, max_ongoing_requests=ROUTER_MAX_ONGOING)
    return router.bind(model, options.affinity, max_body, config.max_queue)


def app_builder(args: dict):
    """Serve config entry point: `args` holds ServerConfig fields (model, max_queue, ...) and
    ReplicaOptions fields (replicas, min_replicas, max_replicas, affinity, num_cpus, ...)."""
    return build_app(*split_args(args))
