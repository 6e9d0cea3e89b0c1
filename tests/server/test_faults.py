"""Recovery from a real device failure: the server runs with CALCULET_FAULT=decode:1 (its first
decode job fails inside the device worker, as an execution-provider error would)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest


@pytest.fixture(scope="module")
def server(tiny_calbin, start_server):
    # one prefill chunk per step (the first chunk always runs), so the two requests reach the decode batch at different steps;
    # the reset (the 2nd session creation) takes 0.5 s longer, so /health's "recovering" lasts long enough to be polled
    # on a busy 2-core machine (a tiny model's reset otherwise takes a few ms)
    return start_server(tiny_calbin("llama", lanes=8, context=128, chunks=(4, 16)), "--max-prefill-tokens", "1", "--burst-prefill-tokens", "0",
                        env={"CALCULET_FAULT": "decode:1,delay=0.5@load:2"})


class HealthWatch:
    """Polls /health in the background and records the status codes it saw, in order."""

    def __init__(self, url: str):
        self.url, self.seen, self._stop = url, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        with httpx.Client(timeout=5) as http:
            while not self._stop.is_set():
                code = http.get(self.url + "/health").status_code
                if not self.seen or self.seen[-1] != code:
                    self.seen.append(code)
                time.sleep(0.002)

    def stop(self) -> list[int]:
        time.sleep(0.2)
        self._stop.set()
        self._thread.join()
        return self.seen


def test_decode_failure_fails_only_its_batch_then_recovers(server):
    """Prefill is one chunk per step here (--max-prefill-tokens 1), first come first served, and a stream
    decodes as soon as it is prefilled (--burst-prefill-tokens 0), so when
    the first decode step runs exactly one request is decoding and the other is still waiting or
    prefilling: only the decoding one may fail; the other is requeued (its lane was reset) and must
    complete normally."""
    client = server.client()
    ids = server.post("/tokenize", {"prompt": "The quick brown fox jumps over the lazy dog. " * 12}).json()["tokens"]
    prompts = {"short": "Paris is", "long": ids[:90]}
    watch = HealthWatch(server.url)

    def run(name):
        try:
            r = client.completions.create(model="model", prompt=prompts[name], max_tokens=12, temperature=0,
                                          extra_body={"ignore_eos": True, "return_token_ids": True})
            return name, r.choices[0].model_extra["token_ids"]
        except openai.APIStatusError as exc:
            return name, exc

    with ThreadPoolExecutor(2) as pool:
        outcomes = dict(pool.map(run, ["short", "long"]))
    failed = [name for name, out in outcomes.items() if isinstance(out, Exception)]
    assert len(failed) == 1, outcomes
    error = outcomes[failed[0]]
    assert error.status_code == 503 and error.body["code"] == "injected_fault"

    seen = watch.stop()
    assert 503 in seen and seen[-1] == 200, seen
    assert seen.index(503) < len(seen) - 1

    m = server.wait_idle()
    assert m['calculet_device_errors_total{code="injected_fault"}'] == 1
    assert m['calculet_device_resets_total{result="ok"}'] == 1
    assert m["calculet_lanes_in_use"] == 0 and m["calculet_healthy"] == 1

    # after the reset: the failed request now succeeds, the survivor gives the same tokens again
    for name in prompts:
        again = run(name)[1]
        assert not isinstance(again, Exception), again
        if name not in failed:
            assert again == outcomes[name]
