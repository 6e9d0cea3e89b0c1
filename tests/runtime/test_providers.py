"""Choosing an execution provider: target compatibility, availability, options, silent fallback."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from calculet.cli import main
from calculet.errors import DeviceError, ModelError
from calculet.runtime.device import Device
from calculet.runtime.program import DeviceConfig
from calculet.runtime.providers import ProviderChoice, check_active, choose_provider, parse_provider_options

HAS_OPENVINO = "OpenVINOExecutionProvider" in ort.get_available_providers()


def test_parse_provider_options():
    assert parse_provider_options(["device_type=NPU", "cache_dir=/tmp/x=y", "device_type=CPU"]) == (
        ("device_type", "CPU"), ("cache_dir", "/tmp/x=y"))
    for bad in ("device_type", "=CPU"):
        with pytest.raises(ModelError, match="KEY=VALUE"):
            parse_provider_options([bad])


def test_cpu_target_refuses_openvino_before_looking_for_it():
    with pytest.raises(ModelError) as e:
        choose_provider("openvino", (), "cpu", set())
    assert e.value.code == "provider_target_mismatch"
    assert "contrib ops" in str(e.value) and "--provider cpu" in str(e.value) and "--target portable" in str(e.value)


def test_unknown_provider_and_cpu_options_are_refused():
    with pytest.raises(ModelError, match="supported: cpu, cuda, openvino"):
        DeviceConfig("tpu")
    with pytest.raises(ModelError, match="takes no --provider-option"):
        choose_provider("cpu", (("device_type", "CPU"),), "portable", set())
    assert choose_provider("cpu", (), "portable", set()).providers == ("CPUExecutionProvider",)


@pytest.mark.skipif(HAS_OPENVINO, reason="this ONNX Runtime build has the OpenVINO provider")
def test_missing_openvino_says_how_to_install_it():
    with pytest.raises(ModelError) as e:
        choose_provider("openvino", (), "portable", set())
    assert e.value.code == "provider_unavailable" and "onnxruntime-openvino" in str(e.value)


def test_silent_cpu_fallback_is_an_error():
    """ONNX Runtime runs on the CPU provider, with only a warning, when it cannot create the one asked
    for (an unknown OpenVINO option does that): the session must be refused."""
    class FellBack:
        def get_providers(self):
            return ["CPUExecutionProvider"]

    choice = ProviderChoice("openvino", ("OpenVINOExecutionProvider",), ({"device_type": "CPU"},))
    with pytest.raises(DeviceError) as e:
        check_active(FellBack(), choice, "decode_1")
    assert e.value.code == "provider_not_active" and "decode_1" in str(e.value)


def test_device_refuses_cpu_calbin_on_openvino(tiny_calbin):
    d = Device(DeviceConfig("openvino"))
    with pytest.raises(ModelError, match="target 'cpu'"):
        d.configure(d.load(tiny_calbin("llama")))
    d.close()


def test_serve_config_checks_the_provider():
    from calculet.server.config import ServerConfig

    cfg = ServerConfig(provider="openvino", provider_options=(("device_type", "NPU"),))
    assert cfg.device_config() == DeviceConfig("openvino", provider_options=(("device_type", "NPU"),))
    with pytest.raises(ModelError, match="not supported"):
        ServerConfig(provider="tpu")


def test_run_cli_reports_the_mismatch(tiny_calbin, capsys):
    assert main(["run", str(tiny_calbin("llama")), "hi", "--provider", "openvino", "--max-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "provider_target_mismatch" in err and "--target portable" in err, err


def test_provider_options_must_be_string_pairs():
    with pytest.raises(ModelError, match="string pairs"):
        DeviceConfig("openvino", provider_options=(("num_of_threads", 4),))
