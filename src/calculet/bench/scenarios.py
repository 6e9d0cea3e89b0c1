"""`calculet bench scenario long-prompt | multi-turn`: TTFT against prompt length and against the
turn of a chat that resends its history, one request at a time, against any OpenAI-compatible server.

    long-prompt   fresh random prompts of exact token lengths (buckets up to the served context),
                  `repeats` each, completions API: TTFT against prompt length (nothing to reuse)
    multi-turn    `conversations` chats of `turns` turns, chat API: each turn resends the history
                  (earlier questions and the answers received) plus ~`words` new words, `output_tokens`
                  out: TTFT per turn (a prefix cache or llama-server's slot cache reuses the history)

Every request streams with `stream_options.include_usage` and `cache_prompt: true` (llama-server's
slot cache switch; servers that do not know it ignore it). A run is a directory: `scenario.json`
(settings and server facts) and `ttft.jsonl` (one `TurnRecord` a line; an unrecorded warm-up request
goes first). `plot_ttft` draws two or
more runs side by side (`calculet bench ttft-plot A B`).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from calculet.bench.client import request_body, stream_request
from calculet.bench.probe import probe_server
from calculet.bench.tokens import _WORDS, LocalTokenizer, RemoteTokenizer, exact_prompt
from calculet.errors import RequestError

SCENARIOS = ("long-prompt", "multi-turn")
RECORDS = "ttft.jsonl"
SETTINGS = "scenario.json"
LONG_BUCKETS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@dataclass(frozen=True)
class ScenarioConfig:
    scenario: str
    url: str                                 # base URL, with or without /v1
    model: str
    out: Path
    label: str | None = None
    api_key: str | None = None
    timeout_s: float = 600.0
    seed: int = 0
    output_tokens: int = 48
    # long-prompt
    buckets: tuple[int, ...] | None = None   # None: LONG_BUCKETS below the context, plus one near it
    repeats: int = 3
    max_context: int | None = None           # when the server does not say
    tokenizer: Path | None = None            # tokenizer.json; else the server's /tokenize
    # multi-turn
    turns: int = 5
    words: int = 120
    conversations: int = 3

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise RequestError("bad_scenario", f"scenario {self.scenario!r}; allowed: {', '.join(SCENARIOS)}")
        for name, low in (("output_tokens", 1), ("repeats", 1), ("turns", 1), ("words", 1), ("conversations", 1)):
            if getattr(self, name) < low:
                raise RequestError("bad_option", f"--{name.replace('_', '-')} must be >= {low}, got {getattr(self, name)}")
        if self.buckets is not None and (not self.buckets or min(self.buckets) < 1):
            raise RequestError("bad_option", f"--buckets must be prompt lengths >= 1, got {self.buckets}")

    @property
    def base_url(self) -> str:
        return self.url.rstrip("/").removesuffix("/v1")

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class TurnRecord:
    """One request: `x` is the prompt bucket (long-prompt) or the turn, from 1 (multi-turn)."""
    scenario: str
    label: str
    x: int
    conversation: int = 0
    prompt_tokens: int | None = None         # as the server's usage says
    cached_tokens: int | None = None         # usage.prompt_tokens_details.cached_tokens, when given
    ttft_ms: float | None = None
    e2e_ms: float = 0.0
    output_tokens: int | None = None
    status: str = "error"
    error: str | None = None


def long_prompt_buckets(context: int | None, output_tokens: int, given: tuple[int, ...] | None) -> list[int]:
    """Prompt lengths that leave room for the output: the given ones, else the doubling buckets
    below the context plus one near its end."""
    if context is None:
        if given is None:
            raise RequestError("no_context", "the server does not say its context; give --max-context or --buckets")
        return sorted(given)
    room = context - output_tokens - 8     # a few tokens for the template and BOS the server may add
    chosen = sorted(b for b in (given or LONG_BUCKETS) if b <= room)
    if given is None and room > 0 and (not chosen or room - chosen[-1] > 64):
        chosen.append(room)
    if not chosen:
        raise RequestError("prompt_too_long", f"no bucket fits the context {context} with {output_tokens} output tokens")
    return chosen


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


class _Session:
    """Sends one streaming request at a time and keeps its text and usage."""

    def __init__(self, config: ScenarioConfig, label: str):
        self.config, self.label = config, label
        self.http = httpx.AsyncClient(timeout=config.timeout_s, headers=config.headers)
        self.origin = time.perf_counter_ns()

    async def send(self, api: str, prompt_body: dict[str, Any], x: int, conversation: int) -> tuple[TurnRecord, str]:
        cfg = self.config
        body = request_body(cfg.model, prompt_body, cfg.output_tokens, fixed_output=True)
        body["cache_prompt"] = True
        text: list[str] = []
        usage: dict[str, Any] = {}

        def on_chunk(chunk: dict[str, Any]) -> None:
            for choice in chunk.get("choices") or []:
                text.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
            if isinstance(chunk.get("usage"), dict):
                usage.update(chunk["usage"])

        path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
        r = await stream_request(self.http, cfg.base_url + path, body, lambda: time.perf_counter_ns() - self.origin, on_chunk)
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if cached is None and isinstance(r.server_timings, dict):   # llama-server: timings.cache_n
            timings = r.server_timings.get("timings")
            cached = timings.get("cache_n") if isinstance(timings, dict) else None
        ttft = (r.t_first_token_ns - r.t_sent_ns) / 1e6 if r.t_first_token_ns is not None else None
        record = TurnRecord(cfg.scenario, self.label, x, conversation, r.prompt_tokens, cached, ttft,
                            (r.t_done_ns - r.t_sent_ns) / 1e6, r.output_tokens, r.status, r.error)
        return record, "".join(text)

    async def close(self) -> None:
        await self.http.aclose()


async def _long_prompt(session: _Session, buckets: list[int], counter, rng: random.Random, emit) -> None:
    for bucket in buckets:
        for _ in range(session.config.repeats):
            prompt = exact_prompt(counter, bucket, rng)   # fresh text: no prefix to reuse
            record, _ = await session.send("completions", {"prompt": prompt}, bucket, 0)
            emit(record)


async def _multi_turn(session: _Session, rng: random.Random, emit) -> None:
    cfg = session.config
    for conversation in range(cfg.conversations):
        messages: list[dict[str, str]] = []
        for turn in range(1, cfg.turns + 1):
            messages.append({"role": "user", "content": _words(rng, cfg.words)})
            record, answer = await session.send("chat", {"messages": list(messages)}, turn, conversation)
            emit(record)
            if record.status != "ok":
                break
            messages.append({"role": "assistant", "content": answer})


def run_scenario(config: ScenarioConfig, log=print) -> Path:
    """Run the scenario; the path of its ttft.jsonl."""
    facts = probe_server(config.base_url, config.model, config.headers)
    context = config.max_context or facts.context
    label = config.label or config.base_url
    config.out.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(config).items() if k != "api_key"}
    settings.update(label=label, context=context, context_source=facts.context_source, started_unix=time.time())
    buckets: list[int] = []
    counter = None
    if config.scenario == "long-prompt":
        buckets = long_prompt_buckets(context, config.output_tokens, config.buckets)
        counter = LocalTokenizer(config.tokenizer) if config.tokenizer else RemoteTokenizer(
            config.base_url, config.model, config.headers)
        settings["buckets"] = buckets
    (config.out / SETTINGS).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    path = config.out / RECORDS
    rng = random.Random(config.seed)

    with path.open("w", encoding="utf-8") as f:
        def emit(record: TurnRecord) -> None:
            f.write(json.dumps(asdict(record)) + "\n")
            f.flush()
            ttft = f"{record.ttft_ms:.1f} ms" if record.ttft_ms is not None else "-"
            log(f"{record.scenario} x={record.x} conv={record.conversation} prompt={record.prompt_tokens} "
                f"cached={record.cached_tokens} ttft={ttft} {record.status}{' ' + record.error if record.error else ''}")

        async def main() -> None:
            session = _Session(config, label)
            try:   # one unrecorded request first: a server's first request pays its one-time costs
                warm = _words(random.Random(f"warm-up {config.seed}"), 16)
                api, body = (("completions", {"prompt": warm}) if config.scenario == "long-prompt"
                             else ("chat", {"messages": [{"role": "user", "content": warm}]}))
                await session.send(api, body, 0, -1)
                if config.scenario == "long-prompt":
                    await _long_prompt(session, buckets, counter, rng, emit)
                else:
                    await _multi_turn(session, rng, emit)
            finally:
                await session.close()

        asyncio.run(main())
    return path


# --- reading and plotting ---------------------------------------------------------------------
@dataclass(frozen=True)
class TTFTSeries:
    label: str
    scenario: str
    points: dict[int, list[float]] = field(default_factory=dict)   # x -> TTFTs (ms) of the ok requests
    cached: dict[int, list[int]] = field(default_factory=dict)     # x -> cached tokens, when reported

    def medians(self) -> list[tuple[int, float]]:
        return [(x, _median(v)) for x, v in sorted(self.points.items()) if v]


def _median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def read_series(run: Path) -> TTFTSeries:
    path = run / RECORDS if run.is_dir() else run
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows:
        raise RequestError("empty_run", f"{path} has no records")
    series = TTFTSeries(rows[0]["label"], rows[0]["scenario"])
    for row in rows:
        if row["status"] == "ok" and row["ttft_ms"] is not None:
            series.points.setdefault(row["x"], []).append(row["ttft_ms"])
            if row.get("cached_tokens") is not None:
                series.cached.setdefault(row["x"], []).append(row["cached_tokens"])
    return series


def ttft_table(series: list[TTFTSeries]) -> str:
    """Median TTFT (ms) per x, one column per run (Markdown)."""
    xs = sorted({x for s in series for x in s.points})
    head = "prompt tokens" if series[0].scenario == "long-prompt" else "turn"
    lines = [f"| {head} | " + " | ".join(s.label for s in series) + " |", "|---" * (len(series) + 1) + "|"]
    for x in xs:
        cells = []
        for s in series:
            v = s.points.get(x)
            cached = s.cached.get(x)
            cells.append(f"{_median(v):.0f} ms" + (f" (cached {int(_median(cached))})" if cached else "") if v else "-")
        lines.append(f"| {x} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_ttft(runs: list[Path], out: Path) -> Path:
    """Median TTFT against prompt length (long-prompt) or turn (multi-turn), one line per run."""
    from calculet.bench.plots import _pyplot, _save

    series = [read_series(r) for r in runs]
    kinds = {s.scenario for s in series}
    if len(kinds) != 1:
        raise RequestError("mixed_scenarios", f"runs of different scenarios cannot share a plot: {sorted(kinds)}")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for s in series:
        points = s.medians()
        ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=s.label)
    if series[0].scenario == "long-prompt":
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt tokens")
        ax.set_title("TTFT against prompt length (median)")
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("turn (history resent each turn)")
        ax.set_title("TTFT per chat turn (median over conversations)")
    ax.set_ylabel("TTFT (ms)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    out.parent.mkdir(parents=True, exist_ok=True)
    return _save(plt, fig, out)
