"""Gate D, memory: the memory plan is a sound layout of one reservation, in bytes.

    0 ─ weights ─ kv.key.0 ─ kv.value.0 ─ … ─ <graph>.inputs.ping ─ <graph>.outputs.ping ─ <graph>.inputs.pong ─ … ─ workspace ─ total_bytes

Regions lie inside [0, total_bytes) and never overlap, except pairs declared in `aliases` (in-place
KV: present_key.i is an alias of kv.key.i, not a region). The two halves of a ping/pong staging pair
must never alias: one job fills one half while another job's outputs are read from the other.
total_bytes is the sum of the region sizes, and device_memory_required_bytes must be plausible for
this model: at least weights + KV + staging computed from the manifest, and within PLAUSIBLE_FACTOR
of it (a "16777216 MB" typed where bytes were meant is off by a factor of a million).
"""

from __future__ import annotations

from calculet.calbin.gates.context import GateContext
from calculet.calbin.gates.schema import DTYPE_BYTES
from calculet.calbin.validate_report import Check, Rule, Severity

BOUNDS = Rule("D.bounds", "every region lies inside the reservation [0, total_bytes) and is not empty")
ALIGNMENT = Rule("D.alignment", "every region starts at a multiple of the plan's alignment", Severity.WARNING)
OVERLAP = Rule("D.overlap", "no two regions overlap unless declared as aliases")
ALIAS = Rule("D.alias", "aliases point at existing regions; each present_* KV output aliases its own kv.* region")
PINGPONG = Rule("D.pingpong", "ping/pong staging halves exist in pairs of equal size and never alias or overlap")
TOTAL = Rule("D.total", "total_bytes equals the sum of the region sizes")
RESERVATION = Rule("D.reservation", "device_memory_required_bytes covers total_bytes")
COMPONENTS = Rule("D.components", "the plan holds the weights, every KV buffer and each graph's staging, each large enough, names unique")
DEVICE_MEMORY = Rule("D.device_memory_plausible",
                     "device_memory_required_bytes is within a sane factor of weights + KV + staging computed from the manifest")
RULES = (BOUNDS, ALIGNMENT, OVERLAP, ALIAS, PINGPONG, TOTAL, RESERVATION, COMPONENTS, DEVICE_MEMORY)

PLAUSIBLE_FACTOR = 4.0  # workspace and alignment add tens of percent, never a multiple of the model


def run(ctx: GateContext) -> list[Check]:
    plan = ctx.section("memory_plan")
    regions = [r for r in plan.get("regions", []) if isinstance(r, dict)]
    aliases = [a for a in plan.get("aliases", []) if isinstance(a, dict)]
    total, required = plan["total_bytes"], plan["device_memory_required_bytes"]
    alias_pairs = {frozenset((a["name"], a["alias_of"])) for a in aliases}
    floor = _floor(ctx)
    ratio = required / floor["total"] if floor["total"] else float("inf")
    return [
        BOUNDS.check(_bounds(regions, total), f"{len(regions)} regions inside {total} bytes"),
        ALIGNMENT.check(_alignment(regions, plan.get("alignment", 1)), f"offsets aligned to {plan.get('alignment')} bytes"),
        OVERLAP.check(_overlaps(regions, alias_pairs), "no undeclared overlaps"),
        ALIAS.check(_alias_problems(ctx, regions, aliases), f"{len(aliases)} aliases resolve"),
        PINGPONG.check(_pingpong(regions, alias_pairs), "ping/pong halves are separate"),
        TOTAL.check([] if total == sum(r["size"] for r in regions) else
                    [f"total_bytes {total} != sum of region sizes {sum(r['size'] for r in regions)}"],
                    f"total {total} bytes = sum of regions"),
        RESERVATION.check([] if required >= total else [f"device_memory_required_bytes {required} < total_bytes {total}"],
                          f"reservation {required} bytes >= total"),
        COMPONENTS.check(_components(ctx, regions), "weights, KV and staging regions present and large enough"),
        DEVICE_MEMORY.check(_plausible(required, floor, ratio),
                            f"{required} bytes = {ratio:.2f} x weights + KV + staging",
                            {"device_memory_required_bytes": required, "floor": floor, "ratio": round(ratio, 4),
                             "max_ratio": PLAUSIBLE_FACTOR}),
    ]


def _nbytes(t: dict) -> int:
    n = 1
    for d in t.get("shape", []):
        n *= int(d)
    return n * DTYPE_BYTES[t["dtype"]]


def _staging(g: dict) -> tuple[int, int]:
    """Bytes of a graph's non-KV inputs and outputs (what the staging halves hold)."""
    ins = sum(_nbytes(t) for t in g.get("inputs", []) if not t["name"].startswith("past_"))
    outs = sum(_nbytes(t) for t in g.get("outputs", []) if not t["name"].startswith("present_"))
    return ins, outs


def _floor(ctx: GateContext) -> dict:
    """The least this calbin can need, from the manifest alone: weights + every KV buffer + staging pairs."""
    kv = ctx.manifest.kv
    weights = int(ctx.section("weights").get("bytes", 0))
    kv_bytes = 2 * kv.num_layers * kv.bytes_per_buffer
    staging = sum(2 * sum(_staging(g)) for g in ctx.graphs())
    return {"weights": weights, "kv": kv_bytes, "staging": staging, "total": weights + kv_bytes + staging}


def _bounds(regions: list[dict], total: int) -> list[str]:
    problems = []
    for r in regions:
        if r["size"] <= 0:
            problems.append(f"region {r['name']!r} is empty (size {r['size']})")
        if r["offset"] + r["size"] > total:
            problems.append(f"region {r['name']!r} [{r['offset']}, {r['offset'] + r['size']}) ends past total_bytes {total}")
    return problems


def _alignment(regions: list[dict], alignment) -> list[str]:
    if not isinstance(alignment, int) or alignment < 1:
        return [f"alignment {alignment!r} is not a positive number of bytes"]
    return [f"region {r['name']!r} starts at {r['offset']}, not a multiple of {alignment}" for r in regions if r["offset"] % alignment]


def _is_pingpong_pair(a: str, b: str) -> bool:
    return a.endswith((".ping", ".pong")) and b.endswith((".ping", ".pong")) and a[:-5] == b[:-5] and a != b


def _overlaps(regions: list[dict], alias_pairs: set) -> list[str]:
    """Sweep by offset; an overlap between declared aliases is allowed (ping/pong pairs are D.pingpong's)."""
    problems = []
    ordered = sorted(regions, key=lambda r: (r["offset"], r["size"]))
    for i, a in enumerate(ordered):
        end = a["offset"] + a["size"]
        for b in ordered[i + 1:]:
            if b["offset"] >= end:
                break
            if frozenset((a["name"], b["name"])) in alias_pairs or _is_pingpong_pair(a["name"], b["name"]):
                continue
            problems.append(f"regions {a['name']!r} [{a['offset']}, {end}) and {b['name']!r} "
                            f"[{b['offset']}, {b['offset'] + b['size']}) overlap and are not declared aliases")
    return problems


def _alias_problems(ctx: GateContext, regions: list[dict], aliases: list[dict]) -> list[str]:
    names = {r["name"]: r for r in regions}
    problems = []
    seen = set()
    for a in aliases:
        if a["name"] in seen:
            problems.append(f"alias {a['name']!r} is declared twice")
        seen.add(a["name"])
        if a["alias_of"] not in names:
            problems.append(f"alias {a['name']!r} points at {a['alias_of']!r}, which is not a region")
        if a["name"].startswith(("present_key.", "present_value.")):
            part, layer = a["name"].removeprefix("present_").split(".", 1)
            if a["alias_of"] != f"kv.{part}.{layer}":
                problems.append(f"alias {a['name']!r} points at {a['alias_of']!r}, expected kv.{part}.{layer}")
    if ctx.manifest.kv.in_place:
        outputs = {t["name"] for g in ctx.graphs() for t in g.get("outputs", []) if t["name"].startswith("present_")}
        for name in sorted(outputs - seen):
            problems.append(f"KV output {name!r} is updated in place (kv.in_place) but has no alias in the plan")
    return problems


def _pingpong(regions: list[dict], alias_pairs: set) -> list[str]:
    by_name = {r["name"]: r for r in regions}
    problems = []
    stems = sorted({n[:-5] for n in by_name if n.endswith((".ping", ".pong"))})
    for stem in stems:
        ping, pong = by_name.get(stem + ".ping"), by_name.get(stem + ".pong")
        if ping is None or pong is None:
            problems.append(f"staging {stem!r} has only its {'pong' if ping is None else 'ping'} half")
            continue
        if ping["size"] != pong["size"]:
            problems.append(f"staging {stem!r}: ping is {ping['size']} bytes, pong {pong['size']}")
        if frozenset((ping["name"], pong["name"])) in alias_pairs:
            problems.append(f"staging {stem!r}: ping and pong are declared aliases; the two halves must never alias")
        if ping["offset"] < pong["offset"] + pong["size"] and pong["offset"] < ping["offset"] + ping["size"]:
            problems.append(f"staging {stem!r}: ping [{ping['offset']}, +{ping['size']}) and pong [{pong['offset']}, "
                            f"+{pong['size']}) share memory")
    return problems


def _components(ctx: GateContext, regions: list[dict]) -> list[str]:
    kv = ctx.manifest.kv
    by_name: dict[str, dict] = {}
    problems = []
    for r in regions:
        if r["name"] in by_name:
            problems.append(f"region name {r['name']!r} is used twice")
        by_name[r["name"]] = r

    def need(name: str, least: int, what: str) -> None:
        r = by_name.get(name)
        if r is None:
            problems.append(f"no region {name!r} ({what})")
        elif r["size"] < least:
            problems.append(f"region {name!r} is {r['size']} bytes, {what} needs {least}")

    need("weights", int(ctx.section("weights").get("bytes", 0)), "weights.bytes")
    if 2 * kv.num_layers > len(regions):
        return problems + [f"kv.num_layers {kv.num_layers} needs {2 * kv.num_layers} KV regions; the plan has {len(regions)} regions in all"]
    for i in range(kv.num_layers):
        for part in ("key", "value"):
            need(f"kv.{part}.{i}", kv.bytes_per_buffer, f"one {kv.dtype} KV buffer {list(kv.shape)}")
    for g in ctx.graphs():
        ins, outs = _staging(g)
        for half in ("ping", "pong"):
            need(f"{g['name']}.inputs.{half}", ins, f"graph {g['name']!r} inputs")
            need(f"{g['name']}.outputs.{half}", outs, f"graph {g['name']!r} outputs")
    return problems


def _plausible(required: int, floor: dict, ratio: float) -> list[str]:
    if required < floor["total"]:
        return [f"device_memory_required_bytes {required} is less than weights + KV + staging = {floor['total']} bytes"]
    if ratio > PLAUSIBLE_FACTOR:
        return [f"device_memory_required_bytes {required} is {ratio:.3g} x weights + KV + staging ({floor['total']} bytes); "
                f"at most {PLAUSIBLE_FACTOR:g} x is plausible (a unit mistake, e.g. MB written as bytes?)"]
    return []
