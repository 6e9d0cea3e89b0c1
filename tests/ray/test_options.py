"""ReplicaOptions -> Serve deployment options, the Serve config's args, and the affinity key and ranking."""

from __future__ import annotations

import pytest

from calculet.errors import RequestError
from calculet.ray.options import ReplicaOptions, split_args


def test_fixed_and_autoscaled_options():
    fixed = ReplicaOptions(replicas=3, num_cpus=2).deployment_options(lanes=4)
    assert fixed["num_replicas"] == 3 and fixed["max_ongoing_requests"] == 8 and "autoscaling_config" not in fixed
    assert fixed["ray_actor_options"] == {"num_cpus": 2}
    auto = ReplicaOptions(min_replicas=1, max_replicas=4).deployment_options(lanes=8)
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1,
                                          "target_ongoing_requests": 8}
    assert "num_replicas" not in auto
    assert ReplicaOptions(min_replicas=0, max_replicas=2, target_ongoing=3).deployment_options(None)[
        "autoscaling_config"]["target_ongoing_requests"] == 3


@pytest.mark.parametrize("kw, says", [
    ({"replicas": 0}, "--replicas must be in 1..1024"),
    ({"min_replicas": 1}, "needs both --min-replicas and --max-replicas"),
    ({"min_replicas": 3, "max_replicas": 2}, "0 <= min <= max"),
    ({"affinity": "sticky"}, "--affinity must be one of off, session"),
    ({"num_cpus": 0}, "--replica-cpus must be in (0, 1024]"),
])
def test_bad_options_say_what_is_allowed(kw, says):
    with pytest.raises(RequestError) as err:
        ReplicaOptions(**kw)
    assert says in err.value.message


def test_autoscaling_a_source_needs_a_target():
    with pytest.raises(RequestError, match="--target-ongoing"):
        ReplicaOptions(min_replicas=1, max_replicas=2).deployment_options(lanes=None)


def test_serve_config_args_split_and_unknown_keys_are_named():
    server, options = split_args({"model": "m.calbin", "max_queue": 7, "replicas": 2, "affinity": "session",
                                  "provider_options": {"device_type": "CPU"}})
    assert (server.model, server.max_queue, options.replicas, options.affinity) == ("m.calbin", 7, 2, "session")
    assert server.provider_options == (("device_type", "CPU"),)
    with pytest.raises(RequestError, match=r"unknown calculet args \['replica'\]"):
        split_args({"replica": 2})


def test_affinity_key_and_rank():
    pytest.importorskip("ray.serve")
    from calculet.ray.affinity import affinity_key, rank

    assert affinity_key("off", [(b"x-calculet-session", b"s1")], b"") is None
    assert affinity_key("session", [(b"x-calculet-session", b" s1 ")], b'{"user": "u"}') == "s1"
    assert affinity_key("session", [], b'{"model": "m", "user": "alice"}') == "alice"
    assert affinity_key("session", [], b'{"user": 3}') is None and affinity_key("session", [], b'{"user"') is None
    ids = ["a", "b", "c"]
    assert rank("k", ids) == rank("k", list(reversed(ids)))   # order of the replica list does not matter
    # rendezvous hashing: losing a replica moves only the keys that preferred it
    keys = [f"s{i}" for i in range(200)]
    before = {k: rank(k, ids)[0] for k in keys}
    after = {k: rank(k, ["a", "c"])[0] for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "b")
    assert len(set(before.values())) == 3


def test_the_shipped_serve_config_reads():
    """deploy/serve.yaml is what `calculet ray serve CONFIG` and `serve deploy` read: it must parse into our types."""
    from pathlib import Path

    from calculet.ray.cli import read_config

    apps, http = read_config(Path(__file__).parents[2] / "deploy" / "serve.yaml")
    [(name, prefix, server, options)] = apps
    assert (name, prefix, http) == ("calculet", "/", {"host": "0.0.0.0", "port": 8000})
    assert (server.model, server.served_model_name) == ("/models/model.calbin", "model")
    assert (options.replicas, options.affinity, options.num_cpus) == (2, "session", 2)
