"""The harness against a real HTTP server with scripted delays: the figures must match the script."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calculet.bench.config import BenchConfig, Limits, Load, Target, Workload, build_config
from calculet.bench.metrics import summarize
from calculet.bench.records import read_records
from calculet.bench.runner import run_benchmark
from calculet.errors import RequestError

from .conftest import GAP_S, OUTPUT_TOKENS, TTFT_S


def within(value: float, expected: float, tolerance: float = 0.05) -> bool:
    return abs(value - expected) <= tolerance * expected


def test_latencies_match_injected_delays(measured_run: Path):
    """Also guards against the client's own pauses counting as latency: a full garbage collection
    of the test session's heap once added ~30 ms to two TTFTs of a phase (fixed by gc.freeze)."""
    summaries = {s.scenario: s for s in summarize(read_records(measured_run))}
    assert set(summaries) == {"closed-c2/p16/o21", "closed-c4/p16/o21"}
    for s in summaries.values():
        assert s.ok == s.requests == 8 and not s.errors
        assert within(s.ttft.mean, TTFT_S), f"{s.scenario}: TTFT {s.ttft.mean:.4f}s vs {TTFT_S}s"
        assert within(s.ttft.p50, TTFT_S)
        assert within(s.tpot.mean, GAP_S), f"{s.scenario}: TPOT {s.tpot.mean:.5f}s vs {GAP_S}s"
        assert within(s.itl.mean, GAP_S), f"{s.scenario}: ITL {s.itl.mean:.5f}s vs {GAP_S}s"
        assert within(s.itl.p50, GAP_S)
        assert s.itl.count == 8 * (OUTPUT_TOKENS - 1)


def test_throughput_matches_arithmetic(measured_run: Path):
    """c clients each waiting TTFT + (n−1)·gap per request: c / E2E requests/s, n tokens each."""
    e2e = TTFT_S + (OUTPUT_TOKENS - 1) * GAP_S
    for s in summarize(read_records(measured_run)):
        expected = s.concurrency / e2e
        assert within(s.request_throughput, expected), f"{s.scenario}: {s.request_throughput:.3f} vs {expected:.3f}"
        assert within(s.output_token_throughput, expected * OUTPUT_TOKENS)


def test_records_hold_client_times_usage_and_server_timings(measured_run: Path):
    records = read_records(measured_run)
    assert [r.request_id for r in sorted(records, key=lambda r: r.request_id)] == list(range(18))
    assert sum(r.warmup for r in records) == 2
    for r in records:
        assert r.t_sent_ns < r.t_first_token_ns <= r.t_chunks_ns[-1] <= r.t_done_ns
        assert r.t_chunks_ns[0] == r.t_first_token_ns and len(r.t_chunks_ns) == OUTPUT_TOKENS
        assert r.output_tokens == OUTPUT_TOKENS and r.output_tokens_source == "usage"
        assert r.prompt_tokens == 17 and r.prompt_tokens_target == 16  # the server adds BOS
        assert r.finish_reason == "length" and r.fixed_output
        assert r.server_timings["timings"]["predicted_n"] == OUTPUT_TOKENS
    info = json.loads((measured_run.parent / "run.json").read_text())
    assert info["server"]["context"] == 4096 and info["tokenizer"].startswith("server ")
    assert [p["scenario"] for p in info["phases"]] == ["closed-c2/p16/o21", "closed-c4/p16/o21"]
    from calculet.cpu_features import detect
    assert info["client_cpu"] == detect().to_json()   # every run says which CPU it measured on (issue 14)


def _config(url: str, out: Path, **settings) -> BenchConfig:
    return build_config({"url": url, "model": "scripted", "out": str(out), "progress": False, **settings})


def test_chat_role_chunk_is_not_the_first_token(scripted_url: str, tmp_path: Path):
    """Guards against TTFT taken from the role-only first chunk that chat servers send at once."""
    config = _config(scripted_url, tmp_path / "chat", api="chat", concurrency=[2], prompt_tokens=[8],
                     output_tokens=3, requests=4, warmup=2)
    (s,) = summarize(read_records(run_benchmark(config)))
    assert s.ok == 4 and within(s.ttft.p50, TTFT_S), f"TTFT {s.ttft}"


def test_open_loop_sends_on_schedule(scripted_url: str, tmp_path: Path):
    config = _config(scripted_url, tmp_path / "open", load="constant", rate=[20], prompt_tokens=[4],
                     output_tokens=2, requests=10, warmup=0)
    records = sorted(read_records(run_benchmark(config)), key=lambda r: r.t_scheduled_ns)
    gaps = [(b.t_scheduled_ns - a.t_scheduled_ns) / 1e9 for a, b in zip(records, records[1:])]
    assert all(abs(g - 0.05) < 1e-6 for g in gaps)
    # Sent when scheduled: open-loop requests overlap (each takes 0.32 s, one arrives every 0.05 s).
    assert all(r.t_sent_ns - r.t_scheduled_ns < 20e6 for r in records)
    (s,) = summarize(records)
    assert s.scenario == "constant-r20/p4/o2" and s.ok == 10


def test_duration_bounds_a_phase(scripted_url: str, tmp_path: Path):
    """Each request takes 0.32 s; within 0.5 s one client sends two, then stops sending."""
    config = _config(scripted_url, tmp_path / "timed", concurrency=[1], prompt_tokens=[4], output_tokens=2,
                     requests=50, duration=0.5, warmup=0)
    records = read_records(run_benchmark(config))
    assert len(records) == 2 and all(r.ok for r in records)


def test_open_loop_cap_holds_requests_back(scripted_url: str, tmp_path: Path):
    config = _config(scripted_url, tmp_path / "capped", load="poisson", rate=[50], max_concurrency=1,
                     prompt_tokens=[4], output_tokens=1, requests=3, warmup=0)
    records = sorted(read_records(run_benchmark(config)), key=lambda r: r.t_sent_ns)
    assert records[0].scenario == "poisson-r50-cap1/p4/o1"
    for before, after in zip(records, records[1:]):
        assert after.t_sent_ns >= before.t_done_ns        # one in flight at a time
    assert records[-1].t_sent_ns - records[-1].t_scheduled_ns > 0.4e9  # it waited for the cap


def test_errors_are_counted_and_recorded(scripted_url: str, tmp_path: Path):
    prompts = tmp_path / "prompts.jsonl"
    lines = ["plain one", "please #429", "please #500", "please #drop", "please #eos3", "please #nousage",
             "please #disconnect"]
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in lines))
    config = _config(scripted_url, tmp_path / "errors", prompts=str(prompts), concurrency=[3],
                     output_tokens=6, warmup=0)
    records = {r.request_id: r for r in read_records(run_benchmark(config))}
    by_prompt = {lines[i]: records[i] for i in range(len(lines))}  # closed loop takes prompts in order
    assert by_prompt["please #429"].error_type == "http_429" and by_prompt["please #429"].http_status == 429
    assert by_prompt["please #500"].error_type == "http_500" and "scripted failure" in by_prompt["please #500"].error
    dropped = by_prompt["please #drop"]
    assert dropped.error_type == "stream_dropped" and dropped.status == "error" and len(dropped.t_chunks_ns) == 3
    assert by_prompt["please #nousage"].output_tokens_source == "chunks"
    assert by_prompt["please #nousage"].output_tokens == 6
    gone = by_prompt["please #disconnect"]
    assert gone.error_type == "disconnected" and gone.http_status is None and gone.attempts == 3
    (s,) = summarize(records.values())
    assert s.requests == 7 and s.ok == 3
    assert s.errors == {"disconnected": 1, "http_429": 1, "http_500": 1, "stream_dropped": 1}
    assert s.early_stops == 1  # #eos3: the server did not honour ignore_eos


def test_stale_keepalive_connection_is_retried(scripted_url: str, tmp_path: Path):
    """Guards against counting as server errors the requests sent on a connection the server had
    just closed (llama-server closes idle keep-alive connections after 5 s)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "fresh #stale"}\n')
    config = _config(scripted_url, tmp_path / "stale", prompts=str(prompts), output_tokens=2, warmup=0)
    (record,) = read_records(run_benchmark(config))
    assert record.ok and record.attempts == 2 and record.output_tokens == 2
    assert within(record.ttft_s, TTFT_S)  # timed from the attempt that was answered


def test_unreachable_server_is_a_request_error(tmp_path: Path):
    config = BenchConfig(Target("http://127.0.0.1:9", "m"), loads=(Load("closed", concurrency=1),),
                         workload=Workload(), limits=Limits(requests=1), out_dir=tmp_path / "x", progress=False)
    with pytest.raises(RequestError) as caught:
        run_benchmark(config)
    assert caught.value.code == "server_unreachable" and "127.0.0.1:9" in caught.value.message


def test_a_run_directory_is_never_overwritten(measured_run: Path):
    config = BenchConfig(Target("http://127.0.0.1:9", "m"), loads=(Load("closed", concurrency=1),),
                         out_dir=measured_run.parent, progress=False)
    with pytest.raises(RequestError, match="already exists"):
        run_benchmark(config)


def test_replaying_prompts_gives_same_phases_and_prompts(measured_run: Path, scripted_url: str, tmp_path: Path):
    """A second server must get the very prompts of the first run, in the same scenarios."""
    config = _config(scripted_url, tmp_path / "replay", prompts=str(measured_run.parent / "prompts.jsonl"),
                     concurrency=[2, 4], output_tokens=2, requests=8, warmup=0)
    from calculet.bench.workload import plan_phases, read_prompts_file

    _, phases, notes = plan_phases(config, None, None)
    first = [p.text for p in read_prompts_file(measured_run.parent / "prompts.jsonl", 2)]
    # max_tokens comes from the file (21), not from --output-tokens
    assert [p.scenario for p in phases] == ["closed-c2/p16/o21", "closed-c4/p16/o21"]
    assert [p.text for p in phases[0].prompts] == first[:8]
    assert [p.text for p in phases[1].prompts] == first[8:16]
    assert len(set(first)) == len(first) and not notes
