"""The admin endpoints are off without a key (403), and take --admin-key or else the API key. In
process, on an app whose models have not loaded (the key check comes first)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from calculet.server.app import create_app
from calculet.server.config import ServerConfig
from calculet.server.host import ModelHost
from calculet.server.metrics import ServerMetrics


def client(**kw) -> TestClient:
    config, metrics = ServerConfig(**kw), ServerMetrics()
    return TestClient(create_app(config, ModelHost(config, metrics), metrics))


def test_without_any_key_admin_is_off():
    r = client().get("/admin/models")
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_disabled"
    assert "--admin-key" in r.json()["error"]["message"]
    assert client().delete("/admin/models/x").status_code == 403


def test_admin_key_or_else_the_api_key():
    c = client(api_key="api", admin_key="adm")
    assert c.get("/admin/models", headers={"Authorization": "Bearer api"}).status_code == 401
    assert c.get("/admin/models", headers={"Authorization": "Bearer adm"}).status_code == 200
    c = client(api_key="api")
    assert c.get("/admin/models", headers={"Authorization": "Bearer api"}).json()["data"] == []


def test_load_body_is_checked_before_anything_loads():
    c = client(admin_key="k")
    h = {"Authorization": "Bearer k"}
    r = c.post("/admin/models", json={"name": "x"}, headers=h)
    assert r.status_code == 400 and "source" in r.json()["error"]["message"]
    r = c.post("/admin/models", json={"source": "/x", "chipz": [0]}, headers=h)
    assert r.status_code == 400 and "unknown key 'chipz'" in r.json()["error"]["message"]
    r = c.post("/admin/models/x/reload", json={"source": "/x"}, headers=h)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
