"""`calculet` command line: one subcommand per module, each registering itself.

Each entry of `_COMMANDS` names a module that exposes `add_parser(subparsers)`; the parser it adds
sets `func(args) -> int`. Modules keep their heavy imports inside `func` so `calculet --help` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from calculet.errors import CalculetError

_COMMANDS = [
    "calculet.compiler.cli",   # compile
    "calculet.run",            # run
    "calculet.inspection",     # inspect (calbin/cli.py, plus --provider placement through the runtime)
    "calculet.validation",     # validate (gates A-E from calbin/, gate F through the runtime)
    "calculet.planner.cli",    # plan
    "calculet.server.cli",     # serve
    "calculet.server.admin_cli",  # admin (load, unload, reload, list on a running server)
    "calculet.ray.cli",        # ray serve (Ray imported only when it runs)
    "calculet.bench.cli",      # bench
    "calculet.numerics.cli",   # reference make, compare, eval perplexity
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="calculet", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that command is not built yet
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except CalculetError as exc:
        if args.debug:
            traceback.print_exc()
        print(exc.one_line(), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (OSError, ValueError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
