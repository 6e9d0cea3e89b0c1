"""benchmarks/device_ab.py: a side's settings are DeviceConfig fields written FIELD=VALUE,... and a
malformed one stops the run before any process starts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import device_ab  # noqa: E402

from calculet.runtime.program import DeviceConfig  # noqa: E402


def test_settings_are_deviceconfig_fields():
    setting = device_ab.parse_setting("hugepages=off, spinning=run")
    assert setting == {"hugepages": "off", "spinning": "run"}
    assert DeviceConfig(**setting).hugepages == "off"
    assert device_ab.parse_setting("") == {}


def test_a_setting_without_a_value_is_refused():
    with pytest.raises(SystemExit, match="FIELD=VALUE"):
        device_ab.parse_setting("hugepages")
