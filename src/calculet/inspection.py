"""`calculet inspect`, composed: calbin/'s description of a calbin, plus, with `--provider`, which nodes
of its graphs that execution provider runs and which fall back to the CPU (runtime/node_placement.py:
measured by opening the sessions and running each graph once, so it takes a load's time).
"""

from __future__ import annotations

import argparse
import json

from calculet.calbin import cli as calbin_cli


def add_placement_arguments(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--provider", action="append", default=[], choices=["cpu", "cuda", "openvino"],
                   help=f"{what} which nodes this execution provider runs and which fall back to the CPU "
                        "(repeatable; loads the calbin on it and runs each graph once)")
    p.add_argument("--provider-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option for the --provider(s), as for `calculet run`")


def placements(calbin: str, providers: list[str], options: list[str]):
    """One Placement per provider (a provider that cannot run the calbin raises its usual error)."""
    from calculet.runtime.node_placement import measure_placement
    from calculet.runtime.program import DeviceConfig
    from calculet.runtime.providers import parse_provider_options

    opts = parse_provider_options(options)
    return [measure_placement(calbin, DeviceConfig(p, provider_options=opts if p != "cpu" else ())) for p in providers]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = calbin_cli.add_parser(sub)
    add_placement_arguments(p, "also measure")
    p.set_defaults(func=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from calculet.calbin.inspect import inspect_calbin
    from calculet.calbin.inspect_render import render_text
    from calculet.runtime.node_placement import render_placement

    report = inspect_calbin(args.calbin)
    placed = placements(args.calbin, args.provider, args.provider_option)
    if args.json:
        data = json.loads(report.to_json_text())
        if placed:
            data["placement"] = [p.to_dict() for p in placed]
        print(json.dumps(data, indent=1))
    else:
        print(render_text(report))
        for p in placed:
            print()
            print(render_placement(p))
    return 0
