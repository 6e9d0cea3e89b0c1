"""`calculet ray serve CALBIN|SOURCE|CONFIG.yaml`: replicas of `calculet serve` on a Ray Serve cluster.

Joins the cluster at --address (`ray start --head` first; `auto` finds it) or starts a local one,
deploys the application (`deployment.build_app`) and waits for Ctrl-C, which deletes it again
(--detach leaves it deployed and returns). Given a Serve config file instead of a model, deploys
its calculet applications (their `args`) and takes host and port from its `http_options`.

Importing this module imports no Ray: `calculet --help` and `calculet serve` stay Ray-free.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

from calculet.errors import RequestError

log = logging.getLogger("calculet.ray")
APP_NAME = "calculet"
BUILDER = "calculet.ray.deployment:app_builder"


def add_parser(sub) -> None:
    from calculet.ray.options import AFFINITY_MODES, ReplicaOptions
    from calculet.server.cli import add_server_arguments

    ray = sub.add_parser("ray", help="serve on a Ray Serve cluster (needs the `ray` extra)")
    verbs = ray.add_subparsers(dest="ray_command", metavar="VERB")
    p = verbs.add_parser("serve", help="deploy replicas of the server behind one OpenAI endpoint and wait for Ctrl-C")
    add_server_arguments(p)
    p.add_argument("--replicas", type=int, default=ReplicaOptions.replicas, help="fixed replica count (default %(default)s)")
    p.add_argument("--min-replicas", type=int, default=None, help="autoscale between --min-replicas and --max-replicas")
    p.add_argument("--max-replicas", type=int, default=None)
    p.add_argument("--target-ongoing", type=int, default=None, metavar="N",
                   help="autoscaling target: requests per replica (default: the calbin's lanes)")
    p.add_argument("--max-ongoing", type=int, default=None, metavar="N",
                   help="requests Serve sends one replica at once; more wait in Serve's queue (default: 2 x lanes)")
    p.add_argument("--affinity", choices=AFFINITY_MODES, default="off",
                   help="session: requests with the same x-calculet-session header (else the same `user`) go to the same replica")
    p.add_argument("--replica-cpus", type=float, default=ReplicaOptions.num_cpus, metavar="N",
                   help="Ray CPUs per model replica; also its ONNX Runtime threads when --threads is 0 (default %(default)s)")
    p.add_argument("--address", default=None,
                   help="Ray cluster to join (`auto`: the one `ray start --head` started here); default: start a local one")
    p.add_argument("--detach", action="store_true", help="return once deployed, leaving the application running")
    p.set_defaults(func=serve_command)
    ray.set_defaults(func=lambda _args: ray.print_help() or 2)


def serve_command(args) -> int:
    from calculet.ray.options import ReplicaOptions
    from calculet.server.cli import server_config

    if args.detach and not args.address:
        raise RequestError("bad_option", "--detach needs --address (a cluster started by `ray start` that outlives this "
                           "command); without it the local cluster ends with the command")
    _setup_logging()
    if len(args.model) == 1 and Path(args.model[0]).suffix in (".yaml", ".yml"):
        apps, http = read_config(Path(args.model[0]))
    else:
        options = ReplicaOptions(replicas=args.replicas, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                                 target_ongoing=args.target_ongoing, max_ongoing=args.max_ongoing, affinity=args.affinity,
                                 num_cpus=args.replica_cpus, graceful_shutdown_s=args.drain_timeout)
        apps = [(APP_NAME, "/", server_config(args), options)]
        http = {"host": args.host, "port": args.port}
    return _deploy(apps, http, args.address, args.detach)


def read_config(path: Path) -> tuple[list, dict]:
    """[(name, route_prefix, ServerConfig, ReplicaOptions)] and http_options of a Serve config file."""
    import yaml

    from calculet.ray.options import split_args

    doc = yaml.safe_load(path.read_text()) or {}
    apps = []
    for app in doc.get("applications") or []:
        if app.get("import_path") != BUILDER:
            raise RequestError("bad_option", f"{path}: application {app.get('name')!r} has import_path "
                               f"{app.get('import_path')!r}; `calculet ray serve` deploys only {BUILDER} "
                               "(use `serve deploy` for other applications)")
        apps.append((app.get("name", APP_NAME), app.get("route_prefix", "/"), *split_args(app.get("args") or {})))
    if not apps:
        raise RequestError("bad_option", f"{path}: no `applications` with import_path {BUILDER}")
    http = {k: v for k, v in (doc.get("http_options") or {}).items() if k in ("host", "port")}
    return apps, http


def _deploy(apps: list, http: dict, address: str | None, detach: bool) -> int:
    try:
        import ray
        from ray import serve
    except ModuleNotFoundError:
        raise RequestError("missing_extra", "`calculet ray` needs Ray Serve: pip install 'calculet[ray]'") from None
    from calculet.ray.deployment import build_app

    ray.init(address=address, logging_level=logging.WARNING)
    if not detach:   # SIGTERM (systemd, Kubernetes) and SIGINT, even one ignored by the parent, take the app down
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt)
    try:
        serve.start(http_options=http)
        for name, prefix, config, options in apps:
            t0 = time.perf_counter()
            serve.run(build_app(config, options), name=name, route_prefix=prefix)
            log.info("application %r ready at http://%s:%s%sv1 (%s, %.1f s)", name, http.get("host", "127.0.0.1"),
                     http.get("port", 8000), prefix if prefix.endswith("/") else prefix + "/",
                     f"{options.min_replicas}-{options.max_replicas} replicas" if options.autoscaling
                     else f"{options.replicas} replica(s)", time.perf_counter() - t0)
        if detach:
            return 0
        log.info("serving; Ctrl-C deletes the application%s", "s" if len(apps) > 1 else "")
        while True:
            time.sleep(1.0)
    except KeyboardInterrupt:   # while deploying or serving: take down what this command put up
        log.info("deleting %s", ", ".join(name for name, *_ in apps))
        for name, *_ in apps:
            try:
                serve.delete(name)
            except Exception as exc:  # noqa: BLE001  (best effort on the way out; say what was left)
                log.warning("could not delete %s: %s", name, exc)
        return 0
    finally:
        ray.shutdown()   # disconnects from a cluster given by --address; one started here goes down


def _interrupt(_signum, _frame) -> None:
    raise KeyboardInterrupt


def _setup_logging() -> None:
    from calculet.server.runner import _setup_logging as setup

    setup()
