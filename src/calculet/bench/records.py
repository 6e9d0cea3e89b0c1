"""One record per request: the raw facts every benchmark figure is recomputed from.

A run is a directory:

    RUN/run.json        the configuration, the clock origin and what the harness learned about the server
    RUN/records.jsonl   one `RequestRecord` per line, warm-up requests included (flagged)
    RUN/prompts.jsonl   the prompts that were sent, so another server can be given the same ones

All `*_ns` times are integers in nanoseconds on one monotonic clock (`time.perf_counter_ns`) of the
client, counted from the run's origin (`run.json: clock_origin_ns`). The client's clock is the
truth; the server's own timings are stored beside it, never mixed in.

Record fields (schema version 1):

| field | type | meaning |
|---|---|---|
| `schema` | int | record schema version (1) |
| `run_id` | str | the run this request belongs to |
| `request_id` | int | index of the request in the run (0, 1, …), unique per run |
| `scenario` | str | the phase it was measured in, e.g. `closed-c8/p256/o128` |
| `warmup` | bool | true for warm-up requests: excluded from every statistic |
| `load` | str | `closed`, `poisson`, `gamma` or `constant` |
| `concurrency` | int or null | clients (closed loop) or the cap (open loop), null when uncapped |
| `rate` | float or null | requested arrivals per second (open loop) |
| `api` | str | `completions` or `chat` |
| `prompt_bucket` | int or null | the prompt length asked for, in tokens (null for a prompt file without counts) |
| `prompt_tokens_target` | int or null | the prompt's length as counted by the target's tokenizer before sending |
| `max_tokens` | int | the output length asked for |
| `fixed_output` | bool | whether `ignore_eos` and `min_tokens` were sent |
| `t_scheduled_ns` | int | when the load generator wanted to send it (open loop arrival; closed loop = sent) |
| `t_sent_ns` | int | just before the HTTP request was written |
| `t_first_token_ns` | int or null | arrival of the first chunk that carried output text |
| `t_chunks_ns` | list[int] | arrival of every chunk that carried output text, in order (first one included) |
| `t_done_ns` | int | when the response ended (or failed) |
| `http_status` | int or null | the response status, null when none came |
| `status` | str | `ok` or `error` |
| `error_type` | str or null | `http_<status>` (e.g. `http_429`), `connect`, `disconnected`, `timeout`, `stream_dropped`, `stream_incomplete`, `stream_error`, `bad_response`, `http_error` (see `ERROR_TYPES`) |
| `error` | str or null | the error message (first 500 characters) |
| `prompt_tokens` | int or null | as the server reported in `usage` |
| `output_tokens` | int or null | from `usage` when given, else the number of text chunks |
| `output_tokens_source` | str or null | `usage` or `chunks` |
| `output_chars` | int | characters of output text received |
| `finish_reason` | str or null | as the server reported (`length`, `stop`, …) |
| `server_timings` | dict or null | the server's own timings, as returned (e.g. llama.cpp's `timings`) |
| `attempts` | int | 1, or more when the server had closed the reused connection without answering and the request was sent again (the times are the last attempt's) |
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
RECORDS_FILE = "records.jsonl"
RUN_FILE = "run.json"
PROMPTS_FILE = "prompts.jsonl"

ERROR_TYPES = (
    "http_<status>",      # the server answered with a non-200 status (http_429, http_500, …)
    "connect",            # no connection could be made
    "disconnected",       # the connection closed before any response header
    "timeout",            # no byte within the request timeout
    "stream_dropped",     # the connection closed in the middle of the stream
    "stream_incomplete",  # the stream ended cleanly but without a finish reason or [DONE]
    "stream_error",       # the server sent an error object inside the stream
    "bad_response",       # a chunk that is not JSON or not an OpenAI completion chunk
    "http_error",         # any other transport failure (named in `error`)
)


@dataclass
class RequestOrigin:
    """Where a request came from: the runner's side of a record."""
    run_id: str
    request_id: int
    scenario: str
    warmup: bool
    load: str
    concurrency: int | None
    rate: float | None
    api: str
    prompt_bucket: int | None
    prompt_tokens_target: int | None
    max_tokens: int
    fixed_output: bool
    t_scheduled_ns: int


@dataclass
class StreamResult:
    """What the client saw of one request's event stream (bench.client fills it in)."""
    t_sent_ns: int
    t_first_token_ns: int | None = None
    t_chunks_ns: list[int] = field(default_factory=list)
    t_done_ns: int = 0
    http_status: int | None = None
    status: str = "error"
    error_type: str | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    output_chars: int = 0
    finish_reason: str | None = None
    server_timings: dict[str, Any] | None = None
    attempts: int = 1


@dataclass
class RequestRecord(StreamResult, RequestOrigin):
    """One JSONL line: the origin's fields, then the stream result's, then the schema version."""
    schema: int = SCHEMA_VERSION

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    # Derived latencies, in seconds; None where the record cannot give them.
    @property
    def ttft_s(self) -> float | None:
        if self.t_first_token_ns is None:
            return None
        return (self.t_first_token_ns - self.t_sent_ns) / 1e9

    @property
    def e2e_s(self) -> float:
        return (self.t_done_ns - self.t_sent_ns) / 1e9

    @property
    def tpot_s(self) -> float | None:
        """(e2e − TTFT) / (output tokens − 1); defined for requests with at least two tokens."""
        ttft = self.ttft_s
        if ttft is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - ttft) / (self.output_tokens - 1)

    def itls_s(self) -> list[float]:
        """Gaps between consecutive text chunks, in seconds."""
        t = self.t_chunks_ns
        return [(b - a) / 1e9 for a, b in zip(t, t[1:])]

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        if data.get("schema", SCHEMA_VERSION) != SCHEMA_VERSION:
            raise ValueError(f"record schema {data.get('schema')} is not supported (expected {SCHEMA_VERSION})")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def read_records(path: Path) -> list[RequestRecord]:
    """Read a records file, or the records file of a run directory."""
    path = records_path(path)
    records = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append(RequestRecord.from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: not a request record: {exc}") from exc
    return records


def records_path(path: Path) -> Path:
    """Accept either a run directory or its records file."""
    path = Path(path)
    if path.is_dir():
        path = path / RECORDS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no benchmark records at {path} (give a run directory or its {RECORDS_FILE})")
    return path


def run_dir(path: Path) -> Path:
    path = Path(path)
    return path if path.is_dir() else path.parent


def read_run_info(path: Path) -> dict[str, Any]:
    """The run's `run.json`, or an empty dict when the records file stands alone."""
    info = run_dir(path) / RUN_FILE
    if not info.is_file():
        return {}
    return json.loads(info.read_text(encoding="utf-8"))
