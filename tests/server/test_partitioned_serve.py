"""Partitioned calbins served over HTTP (server/model.py places them on their chips, runtime/partitioned.py
runs them): a tiny Llama compiled for 2 chips, tp and pp, gives its 1-chip calbin's greedy tokens alone
and under concurrency, /metrics counts each model's collectives, a reload from tp to pp under load fails
no request, and `serve --chips 2 --partition tp SOURCE` compiles the source for 2 chips.

Solo answers come from `calculet.LLM` on the 1-chip calbin (fp32), one prompt at a time."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from calculet import LLM, SamplingParams
from calculet.calbin.manifest import read_manifest

KEY = "admin-secret"
PROMPTS = ["The quick brown fox", "hello world", "a b c d e f g h i j k l m n o p q r", "Paris is", "def main():"]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def calbins(tiny_calbin):
    return {"one": tiny_calbin("llama"), "tp": tiny_calbin("llama", chips=2, partition="tp"),
            "pp": tiny_calbin("llama", chips=2, partition="pp")}


@pytest.fixture(scope="module")
def solo(calbins):
    """[greedy token ids per prompt] of the 1-chip calbin, each prompt alone."""
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    with LLM(str(calbins["one"])) as llm:
        answers = [list(llm.generate([p], params)[0].outputs[0].token_ids) for p in PROMPTS]
    assert len({t for ids in answers for t in ids}) > 3, "degenerate reference: the test would be weak"
    return answers


@pytest.fixture(scope="module")
def server(calbins, start_server):
    """one on chip 0; tp and pp each on chips 0 and 1 (as many as they were compiled for)."""
    return start_server([f"one={calbins['one']}", f"tp={calbins['tp']}", f"pp={calbins['pp']}"], "--chips", "2",
                        "--admin-key", KEY, "--drain-timeout", "60")


def complete(server, model: str, prompt: str) -> httpx.Response:
    return server.post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                           "ignore_eos": True, "return_token_ids": True})


def token_ids(r: httpx.Response) -> list[int]:
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def admin_list(server) -> dict:
    return httpx.get(server.url + "/admin/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()


def collectives(metrics: dict, model: str) -> dict[str, float]:
    """{'bytes/<kind>' | 'calls/<kind>' | 'seconds': value} of one model's collective counters."""
    out = {}
    for key, value in metrics.items():
        for what in ("bytes", "calls"):
            prefix = f"calculet_collective_{what}_total{{"
            if key.startswith(prefix) and f'model="{model}"' in key:
                out[f"{what}/{key.split('kind=')[1].split(chr(34))[1]}"] = value
        if key == f'calculet_collective_seconds_total{{model="{model}"}}':
            out["seconds"] = value
    return out


def test_partitioned_models_run_on_two_chips_and_give_the_one_chip_tokens_alone(server, solo):
    listed = admin_list(server)
    assert {m["id"]: m["chips"] for m in listed["data"]} == {"one": [0], "tp": [0, 1], "pp": [0, 1]}
    assert [c["threads"] for c in listed["chips"]] == [c["threads"] for c in listed["chips"][:1]] * 2
    for model in ("tp", "pp"):
        for i, prompt in enumerate(PROMPTS):
            assert token_ids(complete(server, model, prompt)) == solo[i], (model, prompt)


def test_under_concurrent_load_batched_equals_alone(server, solo):
    jobs = [(model, i) for _ in range(2) for i in range(len(PROMPTS)) for model in ("tp", "pp", "one")]
    with ThreadPoolExecutor(12) as pool:
        got = list(pool.map(lambda job: token_ids(complete(server, job[0], PROMPTS[job[1]])), jobs))
    for (model, i), ids in zip(jobs, got):
        assert ids == solo[i], (model, PROMPTS[i])


def test_metrics_count_each_models_collectives_with_its_label(server):
    before = server.all_metrics()
    token_ids(complete(server, "tp", PROMPTS[0]))
    token_ids(complete(server, "pp", PROMPTS[0]))
    server.wait_idle(model="pp")
    after = server.all_metrics()
    tp0, tp1 = collectives(before, "tp"), collectives(after, "tp")
    pp0, pp1 = collectives(before, "pp"), collectives(after, "pp")
    assert collectives(after, "one") == {}                       # one chip: nothing crosses chips
    assert {k for k in pp1 if k != "seconds"} == {"bytes/send", "calls/send"}   # pp hands the hidden state on
    assert "bytes/all_reduce" in tp1 and "bytes/send" not in tp1  # tp reduces partial outputs
    hidden = read_manifest(server_calbin(server, "pp")).spec.hidden_size
    for old, new in ((tp0, tp1), (pp0, pp1)):
        assert new["seconds"] > old.get("seconds", 0)
        for key in (k for k in new if k.startswith("calls/")):
            assert new[key] > old.get(key, 0), key
    sent = pp1["bytes/send"] - pp0.get("bytes/send", 0)
    assert sent > 0 and sent % (hidden * 4) == 0                 # whole fp32 hidden rows


def server_calbin(server, model: str) -> str:
    return server.get(f"/v1/models/{model}").json()["root"]


def test_reload_from_tp_to_pp_under_load_fails_no_request(server, calbins, solo):
    stop = threading.Event()
    results: list = []

    def hammer(i: int):
        while not stop.is_set():
            r = complete(server, "tp", PROMPTS[i])
            results.append((i, r.json()["choices"][0]["token_ids"] if r.status_code == 200 else r.text))

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    try:
        while len(results) < 4:
            threading.Event().wait(0.01)
        r = httpx.post(server.url + "/admin/models/tp/reload", json={"source": str(calbins["pp"])},
                       headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
        seen = len(results)
        while len(results) < seen + 4:
            threading.Event().wait(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert r.status_code == 200, r.text
    assert r.json()["root"] == str(calbins["pp"]) and r.json()["chips"] == [0, 1]
    assert all(ids == solo[i] for i, ids in results), [res for res in results if isinstance(res[1], str)][:3]
    m = server.all_metrics()
    assert 'calculet_collective_bytes_total{kind="send",model="tp"}' in m   # the new version's counters
    assert 'calculet_collective_bytes_total{kind="all_reduce",model="tp"}' not in m


def test_unloading_a_partitioned_model_frees_both_chips(server):
    listed = admin_list(server)
    share = {c["index"]: c["memory_used"] for c in listed["chips"]}
    r = httpx.delete(server.url + "/admin/models/pp", headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    assert r.status_code == 200 and r.json()["deleted"] is True
    after = admin_list(server)
    freed = {c["index"]: share[c["index"]] - c["memory_used"] for c in after["chips"]}
    pp_bytes = next(m["memory_bytes"] for m in listed["data"] if m["id"] == "pp")
    assert freed[0] > 0 and freed[1] > 0 and freed[0] + freed[1] == pp_bytes
    assert all('model="pp"' not in k or "collective" not in k for k in server.all_metrics())


def test_a_partitioned_model_over_a_chips_budget_is_refused_with_that_chips_share_and_the_other_serves(
        calbins, solo, start_server):
    """Each chip's budget holds that chip's share of a split model. On tiny models a chip's share is larger
    than the whole 1-chip calbin (2-chip calbins keep a full-context KV buffer per layer: no KV rings), so
    the 1-chip one fits a budget tp does not; tp is refused naming the chip and its share's numbers."""
    from calculet.server.placement import plan_bytes

    whole = plan_bytes(read_manifest(calbins["one"]).memory_plan)["total"]
    shares = [plan_bytes(read_manifest(calbins["tp"] / c.folder).memory_plan)
              for c in read_manifest(calbins["tp"]).partition.chips]
    assert max(s["total"] for s in shares) > whole
    budget = (max(s["total"] for s in shares) + whole) // 2
    chip = next(i for i, s in enumerate(shares) if s["total"] > budget)
    server = start_server([f"tp={calbins['tp']}", f"one={calbins['one']}"], "--chips", "2", "--chip-memory", str(budget))
    assert [m["id"] for m in server.get("/v1/models").json()["data"]] == ["one"]
    refused = httpx.get(server.url + "/health", timeout=5).json()["not_loaded"]["tp"]
    assert "model_does_not_fit" in refused and f"does not fit chip {chip}: its share on chip {chip} of 2 chips" in refused
    for number in (shares[chip]["weights"], shares[chip]["kv"], shares[chip]["total"], budget):
        assert f"({number} bytes)" in refused, refused
    assert token_ids(complete(server, "one", PROMPTS[1])) == solo[1]


def test_serve_partition_compiles_a_source_for_two_chips(tiny_model_dir, start_server, tmp_path_factory):
    """`calculet serve SOURCE --chips 2 --partition tp`: the source is compiled (into the cache) for 2
    chips and served on them; its answers are those of the calbin it compiled, run alone."""
    cache = tmp_path_factory.mktemp("cache")
    server = start_server(str(tiny_model_dir("llama")), "--chips", "2", "--partition", "tp", "--admin-key", KEY,
                          env={"CALCULET_CACHE": str(cache)}, timeout=300)
    listed = admin_list(server)
    assert [m["chips"] for m in listed["data"]] == [[0, 1]]
    root = listed["data"][0]["root"]
    assert root.startswith(str(cache))
    part = read_manifest(root).partition
    assert part.scheme == "tp" and len(part.chips) == 2
    model = listed["data"][0]["id"]
    with LLM(root) as llm:
        alone = list(llm.generate([PROMPTS[0]], SamplingParams(max_tokens=MAX_TOKENS, temperature=0,
                                                               ignore_eos=True))[0].outputs[0].token_ids)
    assert token_ids(complete(server, model, PROMPTS[0])) == alone
    assert collectives(server.all_metrics(), model)["bytes/all_reduce"] > 0


def test_a_moe_model_served_expert_parallel_gives_its_one_chip_tokens(tiny_calbin, start_server):
    """A tiny Mixtral compiled for 2 chips with --partition ep, served beside its 1-chip calbin: each
    prompt alone and all of them at once give the 1-chip answers; the ep model's all-reduces are counted."""
    one, ep = tiny_calbin("mixtral"), tiny_calbin("mixtral", chips=2, partition="ep")
    server = start_server([f"one={one}", f"ep={ep}"], "--chips", "2")
    alone = [token_ids(complete(server, "one", p)) for p in PROMPTS]
    assert len({t for ids in alone for t in ids}) > 3, "degenerate reference: the test would be weak"
    assert [token_ids(complete(server, "ep", p)) for p in PROMPTS] == alone
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        assert list(pool.map(lambda p: token_ids(complete(server, "ep", p)), PROMPTS)) == alone
    assert collectives(server.all_metrics(), "ep")["bytes/all_reduce"] > 0


@pytest.mark.slow
def test_default_model_served_on_two_chips_tp_and_pp_gives_the_one_chip_answers(default_calbin_fp32, default_calbin_two_chips,
                                                                                start_server):
    """The default model (fp32) compiled for 2 chips, tp and pp, served beside its 1-chip calbin under
    concurrent load: every answer is the 1-chip one's, alone, and each split moved its activations
    between the chips (the suite's one run of the default model on two chips: tiny models cover the
    in-process paths)."""
    split = {partition: default_calbin_two_chips(partition) for partition in ("tp", "pp")}
    server = start_server([f"one={default_calbin_fp32}", f"tp={split['tp']}", f"pp={split['pp']}"], "--chips", "2",
                          timeout=600)
    prompts = PROMPTS[:3]
    alone = [token_ids(complete(server, "one", p)) for p in prompts]
    jobs = [(model, i) for i in range(len(prompts)) for model in ("tp", "pp", "one")]
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda job: token_ids(complete(server, job[0], prompts[job[1]])), jobs))
    for (model, i), ids in zip(jobs, got):
        assert ids == alone[i], (model, prompts[i])
    m = server.all_metrics()
    assert m['calculet_collective_bytes_total{kind="all_reduce",model="tp"}'] > 0
    assert m['calculet_collective_bytes_total{kind="send",model="pp"}'] > 0
