"""`calculet admin load|unload|reload|list`: the admin endpoints (server/admin.py) from the command line.

    calculet admin list   --url http://127.0.0.1:8000 --key KEY
    calculet admin load   PATH [--name NAME] [--chips 0] [--chat-template T]
    calculet admin unload NAME                 # returns once its requests have finished
    calculet admin reload NAME [PATH]          # new version of NAME; returns once traffic switched

The key comes from --key or $CALCULET_ADMIN_KEY.
"""

from __future__ import annotations

import json
import os
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("admin", help="load, unload, reload or list the models of a running `calculet serve`")
    p.add_argument("action", choices=("list", "load", "unload", "reload"))
    p.add_argument("target", nargs="?", default=None, metavar="PATH|NAME",
                   help="load: the calbin or source; unload, reload: the served name")
    p.add_argument("path", nargs="?", default=None, metavar="PATH", help="reload: the new calbin or source (default: the same path)")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default %(default)s)")
    p.add_argument("--key", default=None, help="the admin key (default: $CALCULET_ADMIN_KEY)")
    p.add_argument("--name", default=None, help="load: the served name (default: derived from the path)")
    p.add_argument("--chips", default=None, metavar="I[,J]", help="load: the chip(s) it runs on (default: 0..N-1 for a calbin compiled "
                   "for N chips)")
    p.add_argument("--chat-template", default=None, metavar="NAME|FILE", help="load: its chat template")
    p.add_argument("--max-queue", type=int, default=None, help="load: its waiting queue")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for the answer (default %(default)s)")
    p.set_defaults(func=admin)


def admin(args) -> int:
    import httpx

    from calculet.errors import RequestError

    key = args.key or os.environ.get("CALCULET_ADMIN_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = args.url.rstrip("/") + "/admin/models"
    needs_target = args.action in ("load", "unload", "reload")
    if needs_target and not args.target:
        raise RequestError("bad_option", f"`calculet admin {args.action}` needs a {'PATH' if args.action == 'load' else 'NAME'}")
    if args.action == "list":
        r = httpx.get(url, headers=headers, timeout=args.timeout)
    elif args.action == "load":
        body = {"source": args.target}
        if args.name:
            body["name"] = args.name
        if args.chips:
            try:
                body["chips"] = [int(c) for c in args.chips.split(",")]
            except ValueError:
                raise RequestError("bad_option", f"--chips {args.chips!r}: give chip indices, e.g. 0 or 0,1") from None
        if args.chat_template:
            body["chat_template"] = args.chat_template
        if args.max_queue is not None:
            body["max_queue"] = args.max_queue
        r = httpx.post(url, json=body, headers=headers, timeout=args.timeout)
    elif args.action == "unload":
        r = httpx.delete(f"{url}/{args.target}", headers=headers, timeout=args.timeout)
    else:
        r = httpx.post(f"{url}/{args.target}/reload", json={"source": args.path} if args.path else {}, headers=headers,
                       timeout=args.timeout)
    try:
        body = r.json()
    except ValueError:
        body = {"error": {"message": r.text, "code": "http_error"}}
    if r.status_code >= 400:
        err = body.get("error", {})
        print(f"error[{err.get('code', r.status_code)}] (HTTP {r.status_code}): {err.get('message', r.text)}", file=sys.stderr)
        return 2
    print(json.dumps(body, indent=2))
    return 0
