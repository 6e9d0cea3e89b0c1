"""Reference runs (calculet.reference.hf) and golden outputs (prompts, golden, metrics) on tiny models."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tiny_models  # tests/ is on sys.path (tests/conftest.py)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from calculet.errors import ModelError, RequestError  # noqa: E402
from calculet.reference.golden import (  # noqa: E402
    Golden, GoldenEntry, GoldenSource, Thresholds, check_against_golden, make_golden, read_golden, write_golden,
)
from calculet.reference.hf import (  # noqa: E402
    build_reference_model, reference_greedy, reference_last_logits, reference_module_outputs, reference_topk,
)
from calculet.reference.prompts import (  # noqa: E402
    bos_id_for, golden_prompt_ids, prompts_for_source, sliding_window_of,
)
from calculet.sources.base import LazyTensors  # noqa: E402
from calculet.sources.hf import load_hf_folder  # noqa: E402

WINDOW = 8  # the tiny Gemma 3 sliding window; every parity prompt below is longer
LONG_PROMPT = [2] + [(7 * i + 3) % tiny_models.VOCAB for i in range(23)]  # 24 ids > WINDOW


@pytest.fixture(scope="module")
def folders(tiny_model_dir) -> dict[str, Path]:
    return {arch: tiny_model_dir(arch) for arch in tiny_models.ARCHS}


@pytest.fixture(scope="module")
def models(folders):
    return {arch: build_reference_model(load_hf_folder(folder)) for arch, folder in folders.items()}


def _with_tensors(source, tensors: dict):
    """The same source with a different tensor mapping (real arrays, no mocks)."""
    loaders = {n: (lambda a=a: a) for n, a in tensors.items()}
    return dataclasses.replace(source, tensors=LazyTensors(loaders, {n: a.shape for n, a in tensors.items()}))


# ------------------------------------------------------------------------------------ hf reference


@pytest.mark.parametrize("arch", tiny_models.ARCHS)
def test_reference_matches_from_pretrained(arch, folders, models):
    ours = models[arch]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        folders[arch], dtype=torch.float32, attn_implementation="eager"
    ).eval()
    ids = torch.tensor([LONG_PROMPT])
    with torch.inference_mode():
        want = theirs(ids).logits[0]
        got = ours(ids).logits[0]
    assert float((want - got).abs().max()) < 1e-5
    last = reference_last_logits(ours, LONG_PROMPT)
    assert last.dtype == np.float32 and last.shape == (tiny_models.VOCAB,)
    assert float(np.abs(last - want[-1].numpy()).max()) < 1e-5


def test_module_inputs_are_hooked_by_name(models):
    """`<module>:input` is the module's forward input (o_proj's: the attention's context), so its
    product with the weight is the module's own output; any other suffix is refused by name."""
    model = models["llama"]
    o_proj = "model.layers.1.self_attn.o_proj"
    out = reference_module_outputs(model, LONG_PROMPT, [o_proj + ":input", o_proj])
    weight = model.get_submodule(o_proj).weight.detach().numpy()
    assert out[o_proj + ":input"].shape == (len(LONG_PROMPT), weight.shape[1])
    assert np.abs(out[o_proj + ":input"] @ weight.T - out[o_proj]).max() < 1e-5
    with pytest.raises(ModelError, match="only `<module>:input`"):
        reference_module_outputs(model, LONG_PROMPT, [o_proj + ":output"])


@pytest.mark.parametrize("arch", tiny_models.ARCHS)
def test_reference_greedy_equals_generate(arch, models):
    model, steps = models[arch], 12
    config = transformers.GenerationConfig(
        do_sample=False, max_new_tokens=steps, min_new_tokens=steps, eos_token_id=None, pad_token_id=0
    )
    with torch.inference_mode():
        out = model.generate(torch.tensor([LONG_PROMPT]), generation_config=config)
    want = out[0, len(LONG_PROMPT):].tolist()
    assert reference_greedy(model, LONG_PROMPT, steps) == want
    ids, values = reference_topk(model, LONG_PROMPT, 5)
    assert ids[0] == want[0] and len(ids) == 5 and values.dtype == np.float32
    assert list(values) == sorted(values, reverse=True)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("chunk", [5, 8])
def test_chunked_prefill_gives_the_same_tokens(arch, chunk, models):
    """A prompt fed `chunk` tokens per forward (gemma3: across its 8-token sliding window) decodes
    exactly like the same prompt in one forward; long-context parity relies on this."""
    model = models[arch]
    assert reference_greedy(model, LONG_PROMPT, 8, prefill_chunk=chunk) == reference_greedy(model, LONG_PROMPT, 8)
    with pytest.raises(RequestError, match="prefill_chunk must be >= 1"):
        reference_greedy(model, LONG_PROMPT, 1, prefill_chunk=0)


def test_reference_greedy_does_not_stop_at_eos(models):
    """Guards against a greedy loop that stops when the model emits its EOS id."""
    model = models["llama"]
    first = reference_greedy(model, LONG_PROMPT, 6)
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = first[0]
    try:
        assert reference_greedy(model, LONG_PROMPT, 6) == first
    finally:
        model.generation_config.eos_token_id = saved


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_legacy_rope_keys_build_the_same_model(arch, folders, models):
    source = load_hf_folder(folders[arch])
    config = {k: v for k, v in source.config.items() if k != "rope_parameters"}
    if arch == "llama":
        config["rope_theta"] = source.config["rope_parameters"]["rope_theta"]
    else:  # Gemma 3 before transformers 5: global theta plus a local base for sliding layers
        config["rope_theta"] = source.config["rope_parameters"]["full_attention"]["rope_theta"]
        config["rope_local_base_freq"] = source.config["rope_parameters"]["sliding_attention"]["rope_theta"]
        config["rope_scaling"] = None
    legacy = build_reference_model(dataclasses.replace(source, config=config))
    assert legacy.config.rope_parameters == models[arch].config.rope_parameters
    assert np.array_equal(reference_last_logits(legacy, LONG_PROMPT), reference_last_logits(models[arch], LONG_PROMPT))


def test_weights_are_loaded_strictly(folders):
    source = load_hf_folder(folders["llama"])
    tensors = {n: source.tensors[n] for n in source.tensors}
    missing = {n: a for n, a in tensors.items() if n != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(ModelError, match=r"missing tensors: 1 \(model.layers.1.mlp.up_proj.weight\)") as err:
        build_reference_model(_with_tensors(source, missing))
    assert err.value.code == "reference_weights_mismatch"
    extra = {**tensors, "model.layers.9.extra.weight": np.zeros((2, 2), np.float32)}
    with pytest.raises(ModelError, match=r"unexpected tensors: 1 \(model.layers.9.extra.weight\)"):
        build_reference_model(_with_tensors(source, extra))
    bad = {**tensors, "model.norm.weight": np.ones((63,), np.float32)}
    with pytest.raises(ModelError, match=r"model.norm.weight has \[63\], model wants \[64\]") as err:
        build_reference_model(_with_tensors(source, bad))
    assert err.value.code == "reference_weights_shape"


def test_tied_lm_head_may_be_given_only_if_equal(folders, models):
    source = load_hf_folder(folders["gemma3"])  # tie_word_embeddings: no lm_head.weight in the file
    tensors = {n: source.tensors[n] for n in source.tensors}
    embed = tensors["model.embed_tokens.weight"]
    same = build_reference_model(_with_tensors(source, {**tensors, "lm_head.weight": embed.copy()}))
    assert np.array_equal(reference_last_logits(same, LONG_PROMPT), reference_last_logits(models["gemma3"], LONG_PROMPT))
    with pytest.raises(ModelError, match="are tied in the model but differ") as err:
        build_reference_model(_with_tensors(source, {**tensors, "lm_head.weight": embed + 1.0}))
    assert err.value.code == "reference_weights_tied"


def test_config_errors_say_what_is_wrong(folders, monkeypatch):
    source = load_hf_folder(folders["llama"])
    with pytest.raises(ModelError, match="model_type 'gpt2' has no reference builder.*supported: llama") as err:
        build_reference_model(dataclasses.replace(source, config={**source.config, "model_type": "gpt2"}))
    assert err.value.code == "reference_unsupported"
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if the extra were not installed
    with pytest.raises(ModelError, match=r"pip install -e '\.\[reference\]'") as err:
        build_reference_model(source)
    assert err.value.code == "reference_not_installed"


# ----------------------------------------------------------------------------------------- prompts


def test_golden_prompts_have_exact_lengths(folders):
    source = load_hf_folder(folders["gemma3"])
    assert bos_id_for(source) == 2 and sliding_window_of(source.config) == WINDOW
    prompts = prompts_for_source(source, context=256)
    assert [(p.name, len(p.input_ids)) for p in prompts] == [
        ("len1", 1), ("len2", 2), ("len15", 15), ("len16", 16), ("len17", 17), ("beyond_window", WINDOW + 5)]
    assert all(p.input_ids[0] == 2 and not p.skipped for p in prompts)
    assert all(0 <= t < tiny_models.VOCAB for p in prompts for t in p.input_ids)
    assert prompts[4].input_ids[:16] != prompts[3].input_ids  # different text, not prefixes of each other
    assert prompts == prompts_for_source(source, context=256)  # deterministic


def test_golden_prompts_without_window_or_bos_and_too_long(folders):
    text = load_hf_folder(folders["llama"]).tokenizer_json
    prompts = golden_prompt_ids(text, None, tiny_models.VOCAB, None, context=64)
    by_name = {p.name: p for p in prompts}
    assert len(by_name["len17"].input_ids) == 17 and by_name["len1"].input_ids[0] != 2
    # 40 > 64 - 32 - 1 = 31: kept in the list, with the reason instead of ids
    assert by_name["beyond_window"].input_ids == []
    assert by_name["beyond_window"].skipped == "length 40 > context 64 - 32 generated - 1 = 31"
    assert len(golden_prompt_ids(text, None, tiny_models.VOCAB, None, context=512)[-1].input_ids) == 40
    assert sliding_window_of({"sliding_window": 4096, "use_sliding_window": False}) is None


# ------------------------------------------------------------------------------------------ golden


@pytest.fixture(scope="module")
def gemma_golden(folders):
    source = load_hf_folder(folders["gemma3"])
    prompts = prompts_for_source(source, context=48)  # beyond_window (13) fits, 16 and 17 do not: 48 - 33 = 15
    ticks = []
    progress = type("Bar", (), {"update": lambda self, n: ticks.append(n)})()  # the tqdm method the compiler passes
    golden = make_golden(source, prompts, n_tokens=32, topk=10, progress=progress)
    assert ticks == [1] * len(prompts)
    return source, golden


def test_make_golden_records_prompts_and_skips(gemma_golden):
    _, golden = gemma_golden
    assert [p.name for p in golden.prompts] == ["len1", "len2", "len15", "beyond_window"]
    assert [(s.name, s.reason) for s in golden.skipped] == [
        ("len16", "length 16 > context 48 - 32 generated - 1 = 15"),
        ("len17", "length 17 > context 48 - 32 generated - 1 = 15")]
    entry = golden.prompts[-1]
    assert len(entry.topk_ids) == 10 and len(entry.greedy_tokens) == 32
    assert entry.next_logit <= entry.topk_logits[-1] and entry.greedy_tokens[0] == entry.topk_ids[0]
    assert golden.source.model_type == "gemma3_text" and golden.source.vocab_size == tiny_models.VOCAB
    assert golden.thresholds == Thresholds(greedy_agreement=1.0, topk_overlap=1.0, logits_cosine=0.9999, max_abs_logit_error=1e-3)


def test_golden_round_trips_through_json(gemma_golden, tmp_path):
    _, golden = gemma_golden
    path = write_golden(golden, tmp_path / "golden")
    assert path == tmp_path / "golden" / "golden.json"
    assert read_golden(tmp_path) == golden  # from the calbin folder
    assert read_golden(tmp_path / "golden") == golden  # or from its golden/ folder
    text = path.read_text()
    assert json.loads(text)["schema"] == "calculet.golden/1" and len(text) < 20_000
    assert '"greedy_tokens": [' + ", ".join(map(str, golden.prompts[0].greedy_tokens)) + "]" in text  # one line


def test_read_golden_errors_name_the_problem(gemma_golden, tmp_path):
    with pytest.raises(ModelError, match="no golden file") as err:
        read_golden(tmp_path)
    assert err.value.code == "golden_missing"
    path = write_golden(gemma_golden[1], tmp_path / "golden")
    doc = json.loads(path.read_text())
    del doc["prompts"][1]["greedy_tokens"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ModelError, match=r"prompts\[1\].*greedy_tokens") as err:
        read_golden(tmp_path)
    assert err.value.code == "golden_schema"
    path.write_text(json.dumps({**doc, "schema": "calculet.golden/0"}))
    with pytest.raises(ModelError, match="understands 'calculet.golden/1'"):
        read_golden(tmp_path)


def _reference_run_fn(model):
    return lambda ids, n: (reference_last_logits(model, ids), reference_greedy(model, ids, n))


@pytest.fixture(scope="module")
def reference_outputs(gemma_golden, models):
    """The reference's own (logits, tokens) per golden prompt, computed once for the perturbed runtimes."""
    run = _reference_run_fn(models["gemma3"])
    golden = gemma_golden[1]
    return {tuple(p.input_ids): run(p.input_ids, golden.n_tokens) for p in golden.prompts}


def test_check_passes_for_the_reference_itself(gemma_golden, models):
    report = check_against_golden(gemma_golden[1], _reference_run_fn(models["gemma3"]))
    assert report.passed, report.summary()
    assert all(p.greedy_agreement == 1.0 and p.greedy_matches == 32 and p.topk_overlap == 1.0 for p in report.prompts)
    assert all(p.logits_cosine > 0.999999 and p.max_abs_logit_error < 1e-6 for p in report.prompts)
    assert json.dumps(report.to_dict())


def test_check_reports_perturbed_runtime_with_numbers(gemma_golden, reference_outputs):
    golden = gemma_golden[1]
    rng = np.random.default_rng(0)

    def run(ids, n, logits=lambda x: x, tokens=lambda t: t):
        ref_logits, ref_tokens = reference_outputs[tuple(ids)]
        return logits(ref_logits.copy()), tokens(list(ref_tokens))

    noisy = check_against_golden(golden, lambda ids, n: run(ids, n, logits=lambda x: x + rng.normal(0, 0.05, x.shape)))
    assert not noisy.passed
    assert all(any(f.startswith("max abs logit error") and "> 0.001" in f for f in p.failures) for p in noisy.prompts)
    assert all(0.05 < p.max_abs_logit_error < 0.5 for p in noisy.prompts)

    shifted = lambda t: t[:5] + [(x + 1) % tiny_models.VOCAB for x in t[5:]]  # noqa: E731
    wrong = check_against_golden(golden, lambda ids, n: run(ids, n, tokens=shifted))
    first = wrong.prompts[0]
    assert first.greedy_agreement == 5 / 32 and first.first_divergence == 5 and first.greedy_matches == 5
    assert first.failures[0].startswith("greedy agreement 0.156 < 1.0 (first divergence at token 5")
    assert "FAIL greedy agreement" in wrong.summary()

    nan = check_against_golden(golden, lambda ids, n: run(ids, n, logits=lambda x: x * np.nan))
    assert not nan.passed and nan.to_dict()["prompts"][0]["logits_cosine"] is None
    short = check_against_golden(golden, lambda ids, n: run(ids, n, logits=lambda x: x[:-1], tokens=lambda t: t[:-1]))
    assert short.prompts[0].failures == [
        f"logits have shape [{tiny_models.VOCAB - 1}], expected [{tiny_models.VOCAB}]",
        "runtime returned 31 greedy tokens, expected 32",
        "greedy agreement 0.969 < 1.0 (first divergence at token 31: ours (missing), reference "
        f"{golden.prompts[0].greedy_tokens[31]}; 31/32 tokens match)",
    ]


def test_topk_overlap_excuses_only_reference_near_ties():
    """Guards against failing a runtime because the reference's own k-th and (k+1)-th logits tie."""
    def golden(next_logit: float) -> Golden:
        entry = GoldenEntry("p", [1], topk_ids=[3, 1], topk_logits=[5.0, 4.0], next_logit=next_logit, greedy_tokens=[3])
        return Golden(GoldenSource("hf", "llama", 4, ""), n_tokens=1, topk=2, thresholds=Thresholds(), prompts=[entry])

    swapped = np.array([0.0, 4.0, 4.0002, 5.0], np.float32)  # id 2 edges out id 1 by 2e-4
    tie = check_against_golden(golden(3.9995), lambda ids, n: (swapped, [3]))
    assert tie.passed, tie.summary()
    clear = check_against_golden(golden(3.0), lambda ids, n: (swapped, [3]))
    assert clear.prompts[0].topk_overlap == 0.5
    assert clear.prompts[0].failures == ["top-k overlap 0.500 < 1.0 (reference ids missing from ours: [1])"]


def test_checking_a_golden_does_not_import_torch():
    code = (
        "import sys, calculet.reference.golden, calculet.reference.prompts; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
