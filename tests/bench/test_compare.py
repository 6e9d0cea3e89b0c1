"""`bench compare`: side-by-side table with B/A ratios."""

from __future__ import annotations

from pathlib import Path

from calculet.bench.compare import compare_runs, ratio


def test_a_run_against_itself_has_unit_ratios(measured_run: Path):
    text = compare_runs(measured_run.parent, measured_run)
    assert "## closed-c2/p16/o21" in text and "## closed-c4/p16/o21" in text
    rows = [line for line in text.splitlines() if line.startswith("| TTFT P50")]
    assert len(rows) == 2 and all("| 1.00× | lower |" in row for row in rows)
    assert "| output throughput (tok/s) |" in text


def test_labels_and_pairing_by_order(measured_run: Path, tmp_path: Path):
    other = tmp_path / "other"
    other.mkdir()
    lines = measured_run.read_text().replace('"closed-c2/p16/o21"', '"renamed"').replace('"closed-c4/p16/o21"', '"renamed2"')
    (other / "records.jsonl").write_text(lines)
    text = compare_runs(measured_run, other)
    assert "paired in order" in text and "## closed-c2/p16/o21 ↔ renamed" in text
    assert "| scripted | other |" in text


def test_ratio():
    """B/A, or None when either side is missing or A is zero (no ratio exists); B at zero is a ratio.

    Guards a former assertion here (`... is not None or True`) that could never fail."""
    assert ratio(2.0, 3.0) == 1.5 and ratio(0.0, 1.0) is None and ratio(None, 1.0) is None
    assert ratio(1.0, None) is None and ratio(4.0, 0.0) == 0.0
