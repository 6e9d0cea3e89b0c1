"""Session affinity: requests with the same key go to the same model replica while it has room.

A multi-turn chat that returns to the replica which served its last turn finds its KV there (once
the prefix cache exists; today affinity only routes). The key is the `x-calculet-session` header,
else the OpenAI `user` field of the body (`affinity_key`). Requests without a key are routed by
Serve's default (power of two choices on queue length).

The preferred replica is the key's rendezvous-hash winner among the running replicas, so adding or
losing a replica moves only the keys that hashed to it. When the preferred replica is full (at
`max_ongoing_requests`) the request goes to the others rather than wait.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter   # Serve's default router, by the path Serve names it
from ray.serve.request_router import PendingRequest, RunningReplica

SESSION_HEADER = b"x-calculet-session"
AFFINITY_MODES = ("off", "session")   # session: the header, else the body's `user`
ROUTER_PATH = "calculet.ray.affinity:SessionAffinityRouter"


def affinity_key(mode: str, headers, body: bytes) -> str | None:
    """The routing key of a request, or None. headers: (name, value) byte pairs, lower-case names."""
    if mode == "off":
        return None
    for name, value in headers:
        if name == SESSION_HEADER and value.strip():
            return value.decode("latin-1").strip()
    if b'"user"' not in body:   # most requests have none: do not parse them
        return None
    try:
        user = json.loads(body).get("user")
    except (ValueError, AttributeError):
        return None   # the app will say what is wrong with the body
    return user if isinstance(user, str) and user else None


def rank(key: str, replica_ids: list[str]) -> list[str]:
    """Replica ids ordered by preference for `key` (rendezvous hashing: highest score first)."""
    def score(rid: str) -> bytes:
        return hashlib.blake2b(f"{key}\x00{rid}".encode(), digest_size=8).digest()
    return sorted(replica_ids, key=score, reverse=True)


class SessionAffinityRouter(PowerOfTwoChoicesRequestRouter):
    """Serve request router for the model deployment: the `affinity` keyword of a call picks the replica."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        key: Any = pending_request.kwargs.get("affinity") if pending_request is not None else None
        if not key or not candidate_replicas:
            return await super().choose_replicas(candidate_replicas, pending_request)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        order = rank(str(key), list(by_id))
        return [[by_id[order[0]]], [by_id[i] for i in order[1:]]] if len(order) > 1 else [[by_id[order[0]]]]
