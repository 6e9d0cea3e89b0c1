"""A real `python -m calculet serve CALBIN --port P` process on 127.0.0.1, for tests that need one
(the server tests, and the bench harness measured against our own server)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, calbin, log_path: Path, *args: str, env: dict | None = None, api_key: str | None = None):
        """calbin: what `serve` is given: one path, or a list of them (NAME=PATH or PATH each)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        given = [str(c) for c in calbin] if isinstance(calbin, (list, tuple)) else [str(calbin)]
        cmd = [sys.executable, "-m", "calculet", "serve", *given, "--port", str(self.port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not healthy after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=self.api_key or "none", max_retries=0, timeout=120, **kw)

    def async_client(self, **kw):
        import openai

        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=self.api_key or "none", max_retries=0, timeout=120, **kw)

    def get(self, path: str, **kw) -> httpx.Response:
        return httpx.get(self.url + path, headers=self.headers(), timeout=30, **kw)

    def post(self, path: str, body, **kw) -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers=self.headers(), timeout=120, **kw)

    def metrics(self, model: str | None = None) -> dict[str, float]:
        """Samples of /metrics as {'name{labels}': value}, labels sorted by name (Prometheus gives
        label order no meaning), parsed with prometheus-client's own text parser. One model's view:
        its samples with the `model` label left out of the key, plus the server-wide ones;
        `model=None` means the only model served (an error when there are several)."""
        return metric_samples(self.get("/metrics").text, model=model or "")

    def all_metrics(self) -> dict[str, float]:
        """Every sample, `model` label included."""
        return metric_samples(self.get("/metrics").text)

    def wait_idle(self, timeout: float = 5.0, model: str | None = None) -> dict[str, float]:
        """Metrics once no request runs or waits and no lane is in use (or the last ones seen)."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics(model)
            idle = m["calculet_lanes_in_use"] == 0 and m["calculet_requests_running"] == 0 and m["calculet_requests_waiting"] == 0
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def metric_samples(text: str, model: str | None = None) -> dict[str, float]:
    """{'name{label="value",...}': value} of every sample in a Prometheus text exposition, labels sorted.
    model: None keeps every sample; a name keeps that model's samples (and those without a model
    label) and leaves the `model` label out of the keys; "" does so for the only model there is."""
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    if model == "":
        names = {s.labels["model"] for s in samples if "model" in s.labels}
        assert len(names) <= 1, f"/metrics has several models {sorted(names)}; say which one"
        model = names.pop() if names else None
        if model is None:
            return {_key(s.name, s.labels): s.value for s in samples}
    out = {}
    for s in samples:
        labels = dict(s.labels)
        if model is not None and labels.pop("model", model) != model:
            continue
        out[_key(s.name, labels)] = s.value
    return out


def _key(name: str, labels: dict) -> str:
    text = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return name + (f"{{{text}}}" if text else "")


def server_config_from_flags(*argv: str):
    """The ServerConfig `calculet serve ARGV...` would build, without starting anything."""
    import argparse

    from calculet.server.cli import add_server_arguments, server_config

    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return server_config(parser.parse_args(list(argv)))
