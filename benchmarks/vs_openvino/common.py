"""Shared by both sides (each runs in its own venv): the scenarios and the per-request timing record.

Standard library only, so the OpenVINO venv needs nothing of calculet's.

    single   1 prompt at a time: TTFT and TPOT (one stream's latency)
    batch8   8 prompts submitted at once: output tokens/s over the whole batch, and TTFT
"""

from __future__ import annotations

import statistics

SCENARIOS = {"single": 1, "batch8": 8}


def timing(t_submit: float, token_times: list[float]) -> dict:
    """One request: TTFT, TPOT and token count from the submit time and each token's arrival time."""
    n = len(token_times)
    return {"tokens": n, "ttft_s": token_times[0] - t_submit if n else None,
            "tpot_s": (token_times[-1] - token_times[0]) / (n - 1) if n > 1 else None,
            "done_s": (token_times[-1] if n else t_submit) - t_submit}


def summarize(requests: list[dict], wall_s: float) -> dict:
    ttft = [r["ttft_s"] for r in requests if r["ttft_s"] is not None]
    tpot = [r["tpot_s"] for r in requests if r["tpot_s"] is not None]
    return {"requests": len(requests), "output_tokens": sum(r["tokens"] for r in requests), "wall_s": wall_s,
            "output_tok_s": sum(r["tokens"] for r in requests) / wall_s if wall_s else None,
            "ttft_p50_s": statistics.median(ttft) if ttft else None,
            "tpot_p50_s": statistics.median(tpot) if tpot else None}
