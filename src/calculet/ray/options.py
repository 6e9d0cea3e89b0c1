"""How the model deployment scales and routes: built once (from flags or a Serve config's `args`),
validated, turned into Serve's deployment options. No Ray import: `calculet ray serve --help` and
the checks run without a cluster."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from calculet.errors import RequestError

AFFINITY_MODES = ("off", "session")   # = affinity.AFFINITY_MODES (that module imports Ray)


@dataclass(frozen=True)
class ReplicaOptions:
    replicas: int = 1                       # fixed count (ignored when max_replicas is set)
    min_replicas: int | None = None         # autoscaling: both bounds set
    max_replicas: int | None = None
    target_ongoing: int | None = None       # autoscaling target per replica; None: the calbin's lanes
    max_ongoing: int | None = None          # requests Serve sends one replica at once; None: 2 x lanes
    affinity: str = "off"                   # off | session (x-calculet-session header, else `user`)
    num_cpus: float = 1.0                   # Ray CPUs reserved per model replica
    graceful_shutdown_s: float = 30.0       # a stopped replica's running requests may finish this long

    def __post_init__(self):
        if not 1 <= self.replicas <= 1024:
            raise RequestError("bad_option", f"--replicas must be in 1..1024, got {self.replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise RequestError("bad_option", "autoscaling needs both --min-replicas and --max-replicas")
        if self.max_replicas is not None and not 0 <= self.min_replicas <= self.max_replicas <= 1024:
            raise RequestError("bad_option", f"replica bounds must satisfy 0 <= min <= max <= 1024, got "
                               f"min {self.min_replicas}, max {self.max_replicas}")
        for name, value in (("--target-ongoing", self.target_ongoing), ("--max-ongoing", self.max_ongoing)):
            if value is not None and not 1 <= value <= 65536:
                raise RequestError("bad_option", f"{name} must be in 1..65536, got {value}")
        if self.affinity not in AFFINITY_MODES:
            raise RequestError("bad_option", f"--affinity must be one of {', '.join(AFFINITY_MODES)}, got {self.affinity!r}")
        if not 0 < self.num_cpus <= 1024:
            raise RequestError("bad_option", f"--replica-cpus must be in (0, 1024], got {self.num_cpus}")
        if not 0 <= self.graceful_shutdown_s <= 3600:
            raise RequestError("bad_option", f"graceful shutdown must be in 0..3600 s, got {self.graceful_shutdown_s}")

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    def deployment_options(self, lanes: int | None) -> dict:
        """Serve options of the model deployment. lanes: the calbin's, when known before loading it."""
        per_replica = self.target_ongoing or lanes
        max_ongoing = self.max_ongoing or (2 * lanes if lanes else None)
        if self.autoscaling and per_replica is None:
            raise RequestError("bad_option", "autoscaling a source (not a compiled calbin) needs --target-ongoing "
                               "(requests per replica to aim for; usually the calbin's lanes)")
        opts: dict = {"ray_actor_options": {"num_cpus": self.num_cpus},
                      "graceful_shutdown_timeout_s": self.graceful_shutdown_s,
                      "health_check_period_s": 5.0, "health_check_timeout_s": 30.0}
        if max_ongoing:
            opts["max_ongoing_requests"] = max_ongoing
        if self.autoscaling:
            opts["autoscaling_config"] = {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas,
                                          "initial_replicas": max(self.min_replicas, 1),
                                          "target_ongoing_requests": per_replica}
        else:
            opts["num_replicas"] = self.replicas
        if self.affinity != "off":
            from calculet.ray.affinity import ROUTER_PATH   # imports Ray: only when affinity is asked for

            opts["request_router_config"] = {"request_router_class": ROUTER_PATH}
        return opts


def calbin_profile(model: str | None):
    """The profile (lanes, context) of a compiled calbin, read from its manifest; None for a source
    (compiled later, on each replica)."""
    if model is None or not (Path(model) / "manifest.json").is_file():
        return None
    from calculet.calbin.manifest import read_manifest

    return read_manifest(model).profile


def split_args(args: dict):
    """A Serve config's `args` -> (ServerConfig, ReplicaOptions); an unknown key is an error naming the allowed ones."""
    from calculet.server.config import ServerConfig

    server_fields = {f.name for f in dataclasses.fields(ServerConfig)}
    option_fields = {f.name for f in dataclasses.fields(ReplicaOptions)}
    unknown = sorted(set(args) - server_fields - option_fields)
    if unknown:
        raise RequestError("bad_option", f"unknown calculet args {unknown}; allowed: {sorted(server_fields | option_fields)}")
    server = {k: v for k, v in args.items() if k in server_fields}
    if isinstance(server.get("provider_options"), dict):
        server["provider_options"] = tuple((str(k), str(v)) for k, v in server["provider_options"].items())
    return ServerConfig(**server), ReplicaOptions(**{k: v for k, v in args.items() if k in option_fields})
