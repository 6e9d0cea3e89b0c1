"""benchmarks/providers.py: `openvino@PRECISION` adds OpenVINO's inference precision to calculet's own
load_config, other specs are refused before anything loads, and --chunks plans the prefill calls."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import providers  # noqa: E402

from calculet.runtime.providers import OPENVINO_CPU_LOAD_CONFIG  # noqa: E402


def test_openvino_precision_joins_the_default_load_config():
    options = dict(providers._options("openvino@bf16", "/tmp/cache"))
    assert options["cache_dir"] == "/tmp/cache"
    cpu = json.loads(options["load_config"])["CPU"]
    assert cpu["INFERENCE_PRECISION_HINT"] == "bf16"
    for key, value in OPENVINO_CPU_LOAD_CONFIG["CPU"].items():
        assert cpu[key] == value
    assert providers._options("openvino", None) == ()
    assert providers._options("cpu", "/tmp/cache") == ()
    assert providers._options("openvino@", None) == ()   # an empty precision is none


@pytest.mark.parametrize("spec", ["cpu@bf16", "openvino@fp8"])
def test_bad_precision_is_refused(spec):
    with pytest.raises(SystemExit, match="only openvino takes @PRECISION"):
        providers._options(spec, None)


@pytest.mark.parametrize("tokens, chunks, largest, calls", [
    (200, (128, 64, 8), 128, [128, 64, 8]),
    (200, (), 256, [200]),
    (200, (), 128, [128, 72]),
    (300, (128, 64), 128, [128, 64, 64, 44]),
    (10, (128, 64, 8), 128, [10]),
])
def test_prefill_calls(tokens, chunks, largest, calls):
    assert providers.prefill_calls(tokens, chunks, largest) == calls
    assert sum(calls) == tokens
