"""PNG plots of a run: latency CDFs, throughput against load, TTFT against prompt length.

matplotlib is imported inside the functions (with the Agg backend) so the CLI stays fast.
"""

from __future__ import annotations

from pathlib import Path

from calculet.bench.metrics import ScenarioSummary
from calculet.bench.records import RequestRecord


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: Path) -> Path:
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _cdf(ax, values_ms: list[float], label: str) -> None:
    if not values_ms:
        return
    data = sorted(values_ms)
    n = len(data)
    ax.step([data[0], *data], [0.0, *((i + 1) / n for i in range(n))], where="post", label=label)


def latency_cdfs(records: list[RequestRecord], path: Path) -> Path:
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    by_scenario: dict[str, list[RequestRecord]] = {}
    for r in records:
        if not r.warmup and r.ok:
            by_scenario.setdefault(r.scenario, []).append(r)
    panels = (
        ("TTFT", lambda rs: [r.ttft_s for r in rs if r.ttft_s is not None]),
        ("TPOT", lambda rs: [r.tpot_s for r in rs if r.tpot_s is not None]),
        ("ITL (every chunk gap)", lambda rs: [g for r in rs for g in r.itls_s()]),
        ("E2E", lambda rs: [r.e2e_s for r in rs]),
    )
    for ax, (title, pick) in zip(axes.flat, panels):
        for scenario, rs in by_scenario.items():
            _cdf(ax, [v * 1e3 for v in pick(rs)], scenario)
        ax.set_title(title)
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples ≤ x")
        ax.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if labels:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize="small")
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return _save(plt, fig, path)


def throughput_vs_load(summaries: list[ScenarioSummary], path: Path) -> Path:
    """Output tokens/s (top) and successful requests/s (bottom) against concurrency (closed loop) or
    offered rate (open loop), one line per prompt bucket."""
    plt = _pyplot()
    kinds = [k for k in ("closed", "open") if any((s.load == "closed") == (k == "closed") for s in summaries)]
    fig, axes = plt.subplots(2, len(kinds), figsize=(6 * len(kinds), 7), squeeze=False, sharex="col")
    for column, kind in enumerate(kinds):
        buckets: dict[int | None, list[ScenarioSummary]] = {}
        for s in summaries:
            if (s.load == "closed") == (kind == "closed"):
                buckets.setdefault(s.prompt_bucket, []).append(s)
        top, bottom = axes[0][column], axes[1][column]
        for bucket, group in buckets.items():
            group.sort(key=lambda s: (s.concurrency or 0) if kind == "closed" else (s.rate or 0))
            xs = [(s.concurrency if kind == "closed" else s.rate) for s in group]
            name = f"prompt {bucket}" if bucket is not None else "prompts file"
            top.plot(xs, [s.output_token_throughput for s in group], marker="o", label=name)
            bottom.plot(xs, [s.request_throughput for s in group], marker="o", label=name)
        top.set_title("closed loop" if kind == "closed" else "open loop")
        top.set_ylabel("output tokens / s")
        bottom.set_ylabel("successful requests / s")
        bottom.set_xlabel("concurrent clients" if kind == "closed" else "offered rate (req/s)")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
        top.legend(fontsize="small")
    fig.tight_layout()
    return _save(plt, fig, path)


def ttft_vs_prompt_length(records: list[RequestRecord], path: Path) -> Path:
    """Every successful request's TTFT against its prompt length (server's count, else the target)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    points: dict[str, tuple[list[int], list[float]]] = {}
    for r in records:
        length = r.prompt_tokens if r.prompt_tokens is not None else r.prompt_tokens_target
        if r.warmup or not r.ok or r.ttft_s is None or length is None:
            continue
        load = r.scenario.split("/")[0]
        xs, ys = points.setdefault(load, ([], []))
        xs.append(length)
        ys.append(r.ttft_s * 1e3)
    for load, (xs, ys) in points.items():
        ax.scatter(xs, ys, s=10, alpha=0.6, label=load)
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("TTFT (ms)")
    if points and max(max(xs) for xs, _ in points.values()) > 50 * max(1, min(min(xs) for xs, _ in points.values())):
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize="small")
    fig.tight_layout()
    return _save(plt, fig, path)


def write_plots(records: list[RequestRecord], summaries: list[ScenarioSummary], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [
        latency_cdfs(records, folder / "latency_cdfs.png"),
        throughput_vs_load(summaries, folder / "throughput_vs_load.png"),
        ttft_vs_prompt_length(records, folder / "ttft_vs_prompt_length.png"),
    ]
