"""`calculet serve SOURCE --kv-dtype fp16` compiles the source with fp16 KV (issue 13 part 2): the flag
reaches the compile, and the served model's lanes hold float16 buffers; a dtype no target here runs
is refused when the model loads, with compile's reason."""

from __future__ import annotations

import numpy as np

from calculet.server.host import ModelHost
from calculet.server.metrics import ServerMetrics
from serving import server_config_from_flags


def test_serve_passes_kv_dtype_to_the_compile_of_a_source(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CALCULET_CACHE", str(tmp_path / "cache"))
    config = server_config_from_flags(str(tiny_model_dir("llama")), "--kv-dtype", "fp16")
    assert config.kv_dtype == "fp16"
    host = ModelHost(config, ServerMetrics())
    host.load()
    try:
        (model,) = host.models()
        assert model.device.program.manifest.kv.dtype == "float16"
        assert {a.dtype for a in model.device.lanes.buffers} == {np.dtype(np.float16)}
    finally:
        host.close()


def test_serve_refuses_a_kv_dtype_the_target_cannot_run(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CALCULET_CACHE", str(tmp_path / "cache"))
    host = ModelHost(server_config_from_flags(str(tiny_model_dir("llama")), "--kv-dtype", "bf16"), ServerMetrics())
    host.load()
    try:
        assert host.state == "failed"
        assert host.error.code == "bad_option" and "GroupQueryAttention takes float/float16 only" in host.error.message
    finally:
        host.close()
