"""`calculet serve --ort-spinning run|off`: the flag reaches every chip's DeviceConfig, and so every
ONNX Runtime session the served model opens (runtime.program.SPINNING); `run` is the default."""

from __future__ import annotations

from calculet.server.host import ModelHost
from calculet.server.metrics import ServerMetrics
from serving import server_config_from_flags


def test_default_is_run_and_the_flag_reaches_the_chips():
    assert server_config_from_flags().spinning == "run"
    config = server_config_from_flags("--ort-spinning", "off", "--chips", "2")
    assert {c.device_config().spinning for c in config.chip_configs()} == {"off"}
    assert config.device_config().spinning == "off"


def test_served_sessions_spin_within_a_job(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CALCULET_CACHE", str(tmp_path / "cache"))
    host = ModelHost(server_config_from_flags(str(tiny_model_dir("llama")), "--ort-spinning", "run"), ServerMetrics())
    host.load()
    try:
        (model,) = host.models()
        sessions = model.device.program.sessions.values()
        assert {s.get_session_options().get_session_config_entry("session.force_spinning_stop") for s in sessions} == {"1"}
        assert {s.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")
                for s in sessions} == {"1"}
    finally:
        host.close()


def test_hugepages_flag_reaches_the_chips():
    """`--hugepages collapse|off` (runtime/hugepages.py): collapse by default, off reaches every chip."""
    assert server_config_from_flags().hugepages == "collapse"
    config = server_config_from_flags("--hugepages", "off", "--chips", "2")
    assert {c.device_config().hugepages for c in config.chip_configs()} == {"off"}
    assert config.device_config().hugepages == "off"
