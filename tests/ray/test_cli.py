"""`calculet ray serve`: flags checked before any cluster starts."""

from __future__ import annotations

from calculet.cli import main


def test_detach_without_a_cluster_address_is_refused(capsys):
    assert main(["ray", "serve", "model.calbin", "--detach"]) == 2
    assert "--detach needs --address" in capsys.readouterr().err


def test_bad_replica_options_are_refused_before_ray_starts(capsys):
    assert main(["ray", "serve", "model.calbin", "--min-replicas", "2"]) == 2
    assert "needs both --min-replicas and --max-replicas" in capsys.readouterr().err
    assert main(["ray", "serve", "model.calbin", "--replicas", "0"]) == 2
    assert "--replicas must be in 1..1024, got 0" in capsys.readouterr().err


def test_a_config_naming_another_application_is_refused(tmp_path, capsys):
    config = tmp_path / "serve.yaml"
    config.write_text("applications:\n  - name: other\n    import_path: mypkg.app:app\n")
    assert main(["ray", "serve", str(config)]) == 2
    assert "deploys only calculet.ray.deployment:app_builder" in capsys.readouterr().err
