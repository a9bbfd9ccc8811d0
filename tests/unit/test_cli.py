from pathlib import Path

import pytest
from click.testing import CliRunner

from warren.cli import main


def test_render_writes_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["render", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "admission-sandbox-pods.yaml").exists()


def test_bad_config_is_refused_before_anything_happens(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("isolation:\n  pod_security_level: lax\n")
    kubeconfig = tmp_path / "never-read.kubeconfig"
    result = CliRunner().invoke(main, ["apply", "--config", str(config), "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 1
    assert "isolation.pod_security_level" in result.output
    assert "'baseline' or 'restricted'" in result.output


def test_apply_without_cluster_says_what_to_do(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["apply", "--kubeconfig", str(tmp_path / "missing")])
    assert result.exit_code == 1
    assert "warren cluster up" in result.output


def test_kubeconfig_path_follows_warren_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARREN_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["cluster", "kubeconfig"])
    assert result.output.strip() == str(tmp_path / "cluster" / "admin.kubeconfig")


def test_cluster_up_without_binaries_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARREN_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("WARREN_BIN_DIR", raising=False)
    result = CliRunner().invoke(main, ["cluster", "up"])
    assert result.exit_code == 1
    assert "build-cluster-binaries.sh" in result.output


def test_status_of_a_cluster_that_is_not_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARREN_HOME", str(tmp_path))
    result = CliRunner().invoke(main, ["cluster", "status"])
    assert result.exit_code == 1
    assert "not running" in result.output
