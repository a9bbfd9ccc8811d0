"""The local workspace layer's processes as `warren workspaces up` would start them."""

from __future__ import annotations

from pathlib import Path

import pytest

from warren.cluster.local import ClusterError
from warren.config import ConfigError, parse_config
from warren.workspaces.local import BLOCKD, CSI, OBJECTS, LocalWorkspaces


@pytest.fixture
def env(tmp_path: Path) -> Path:
    """A stand-in for warren-blockd's environment: the three programs `up` runs."""
    bin_dir = tmp_path / "blockd-env" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("weed", "warren-blockd", "python"):
        (bin_dir / name).write_text("#!/bin/sh\n")
    return bin_dir.parent


def test_processes_listen_on_loopback_and_find_the_kubelet(tmp_path: Path, env: Path) -> None:
    config = parse_config({"cluster": {"workspaces": {"base_port": 20000, "bucket": "ws-test"}}})
    local = LocalWorkspaces(config, tmp_path / "cluster", blockd_env=env)
    objects, blockd, csi = local.components("node-a")
    assert [c.spec.name for c in (objects, blockd, csi)] == [OBJECTS, BLOCKD, CSI]
    assert "-ip=127.0.0.1" in objects.spec.argv
    # Every SeaweedFS port is set: its defaults (8080 among them) would meet the edge's.
    assert {"-master.port=20000", "-volume.port=20001", "-s3.port=20003"} <= set(objects.spec.argv)
    assert "--store=s3://ws-test" in blockd.spec.argv
    assert "--s3-endpoint=http://127.0.0.1:20003" in blockd.spec.argv
    kubelet = tmp_path / "cluster" / "node" / "kubelet"
    assert f"--registration-dir={kubelet / 'plugins_registry'}" in csi.spec.argv
    assert f"--endpoint=unix://{kubelet / 'plugins' / 'blockd.warren.dev' / 'csi.sock'}" in csi.spec.argv
    assert "--node-id=node-a" in csi.spec.argv


def test_a_missing_environment_is_named_with_the_fix(tmp_path: Path) -> None:
    local = LocalWorkspaces(parse_config({}), tmp_path, blockd_env=tmp_path / "nowhere")
    with pytest.raises(ClusterError, match=r"make packages/warren-blockd/\.venv/\.installed"):
        local.objects()


def test_bad_settings_are_refused_before_anything_starts() -> None:
    with pytest.raises(ConfigError, match="bucket"):
        parse_config({"cluster": {"workspaces": {"bucket": "No_Such"}}})
    with pytest.raises(ConfigError, match="base_port"):
        parse_config({"cluster": {"workspaces": {"base_port": 80}}})
