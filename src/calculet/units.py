"""Byte sizes: parse `32GiB` / `16GB`, print `N B (x.xxx GiB)` (the planner's device memory, compile's --kv-memory).

Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB, GB, TB) are powers
of 1000. A size always needs a unit: a bare `32` is rejected rather than guessed.
"""

from __future__ import annotations

import re

from calculet.errors import RequestError

UNITS: dict[str, int] = {
    "B": 1,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
    "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4,
}
MIN_DEVICE_BYTES = 16 * 1024**2   # 16 MiB: smaller than any accelerator we could plan for
MAX_DEVICE_BYTES = 16 * 1024**4   # 16 TiB: larger than any single chip made

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")


def parse_size(text: str, *, what: str = "size",
               minimum: int = MIN_DEVICE_BYTES, maximum: int = MAX_DEVICE_BYTES) -> int:
    """`"32GiB"` -> 34359738368. Raises `RequestError(bad_size)` naming the allowed form and range."""
    match = _SIZE.match(str(text))
    if not match:
        if re.match(r"^\s*\d+(?:\.\d+)?\s*$", str(text)):
            raise RequestError("bad_size", f"{what} {text!r} has no unit; write it like 32GiB, 512MiB "
                               f"or 16GB (units: {', '.join(_unit_names())})")
        raise RequestError("bad_size", f"{what} {text!r} is not a size; write it like 32GiB, 512MiB "
                           f"or 16GB (units: {', '.join(_unit_names())})")
    number, unit = match.groups()
    factor = UNITS.get(unit.upper())
    if factor is None:
        raise RequestError("bad_size", f"{what} {text!r} has an unknown unit {unit!r}; "
                           f"allowed: {', '.join(_unit_names())}")
    value = int(round(float(number) * factor))
    if not minimum <= value <= maximum:
        raise RequestError("bad_size", f"{what} {text!r} = {value:,} B is out of range; allowed "
                           f"{human_bytes(minimum)} to {human_bytes(maximum)}")
    return value


def human_bytes(n: int) -> str:
    """The largest binary unit that keeps the number at least 1: `3.750 GiB`, `296.750 MiB`."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= factor:
            return f"{n / factor:.3f} {unit}"
    return f"{n} B"


def show_bytes(n: int) -> str:
    """Bytes and a human form, e.g. `4,026,531,840 B (3.750 GiB)`."""
    if abs(n) < 1024:
        return f"{n:,} B"
    return f"{n:,} B ({human_bytes(n)})"


def _unit_names() -> list[str]:
    return ["B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"]
