"""`calculet eval perplexity`: window plan, calbin logprobs equal the reference's, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calculet.errors import RequestError
from calculet.numerics import perplexity as P


@pytest.mark.parametrize("n,window,stride", [(2, 2, 1), (10, 4, 2), (100, 64, 32), (100, 64, 63), (65, 64, 1), (50, 64, 32)])
def test_windows_score_every_token_once_with_enough_context(n, window, stride):
    windows = P.plan_windows(n, window, stride)
    scored = [p for w in windows for p in range(w.score_from, w.end)]
    assert scored == list(range(1, n))
    for w in windows:
        assert w.begin < w.score_from < w.end <= w.begin + window
        if w.begin > 0:
            assert w.score_from - w.begin >= window - stride  # every scored token sees the overlap


def test_window_options_are_checked():
    with pytest.raises(RequestError, match="at least 2 tokens"):
        P.plan_windows(1, 8, 4)
    with pytest.raises(RequestError, match="--stride must be in 1..window - 1"):
        P.plan_windows(10, 8, 8)
    with pytest.raises(RequestError, match="--window must be >= 2"):
        P.plan_windows(10, 1, 1)


@pytest.mark.parametrize("n,window,stride,chunks", [(4096, 1024, 512, 6), (4000, 1024, 512, 6), (2048, 1024, 512, 2),
                                                    (100, 16, 4, 21)])
def test_last_stride_windows_are_llama_cpps_protocol(n, window, stride, chunks):
    """The windows llama-perplexity --ppl-stride scores (tools/perplexity: n_chunk = (N - n_ctx + stride - 1) /
    stride, positions n_ctx - stride .. n_ctx - 1 of each window): 6 windows on the 4,096-token text."""
    windows = P.plan_windows_last_stride(n, window, stride)
    assert len(windows) == chunks
    scored = [p for w in windows for p in range(w.score_from, w.end)]
    assert scored == list(range(window - stride, window - stride + chunks * stride))   # contiguous, each once
    assert all(w.end - w.begin == window and w.end <= n for w in windows)


def test_last_stride_needs_two_windows_of_text():
    with pytest.raises(RequestError, match="at least 2 x window = 2048"):
        P.plan_windows_last_stride(2000, 1024, 512)


torch = pytest.importorskip("torch")

TEXT = ("The lighthouse keeper counted the steps every evening. " * 3 + "def f(x):\n    return x * 2\n"
        + "Le chat dort sur le canapé. 東京は日本の首都です。") * 3


def _ids(calbin) -> list[int]:
    from calculet.calbin.manifest import read_manifest

    tok = read_manifest(calbin).tokenizer
    return P.text_ids((calbin / tok.file).read_text(), TEXT, tok.bos_token_id, 0)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # gemma3: sliding window of 8 inside a 64-token window
def test_calbin_logprobs_equal_the_reference(arch, tiny_model_dir, tiny_calbin):
    from calculet.reference.hf import build_reference_model
    from calculet.runtime.device import Device
    from calculet.sources.hf import load_hf_folder

    calbin = tiny_calbin(arch)
    ids = _ids(calbin)
    assert len(ids) > 100
    windows = P.plan_windows(len(ids), 64, 24)
    device = Device()
    try:
        device.configure(device.load(calbin))
        ours = P.calbin_logprobs(device, ids, windows)
    finally:
        device.close()
    model = build_reference_model(load_hf_folder(tiny_model_dir(arch)))
    ref = P.reference_logprobs(model, ids, windows)
    assert ours.shape == ref.shape == (len(ids) - 1,)
    assert float(np.abs(ours - ref).max()) < 1e-4
    # the reference's own scores against a plain forward over the first window
    with torch.inference_mode():
        logits = model(torch.tensor([ids[:64]])).logits[0].double()
    plain = torch.log_softmax(logits, -1)[torch.arange(63), torch.tensor(ids[1:64])].numpy()
    assert float(np.abs(ref[:63] - plain).max()) < 1e-6


def test_window_longer_than_the_context_is_refused(tiny_calbin):
    from calculet.runtime.device import Device

    device = Device()
    try:
        device.configure(device.load(tiny_calbin("llama")))
        with pytest.raises(RequestError, match="use --window <= 65"):
            P.calbin_logprobs(device, list(range(3, 200)), P.plan_windows(197, 80, 40))
    finally:
        device.close()


def test_cli_scores_the_calbin_and_the_reference_alike(tiny_model_dir, tiny_calbin, tmp_path, capsys):
    from calculet.cli import main

    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    assert main(["eval", "perplexity", str(tiny_calbin("qwen2")), "--reference", str(tiny_model_dir("qwen2")),
                 "--text", str(text), "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["window"] == 64 and doc["stride"] == 32  # the calbin's context by default
    ours, ref = doc["results"]
    assert ours["tokens_scored"] == ref["tokens_scored"] == doc["tokens"] - 1
    assert ours["perplexity"] == pytest.approx(ref["perplexity"], rel=1e-4)
    assert 1.0 < ref["perplexity"] < 320 * 4  # a random tiny model is near-uniform over 320 ids
    assert main(["eval", "perplexity"]) == 2
    assert "give a CALBIN, --reference SOURCE, or both" in capsys.readouterr().err
