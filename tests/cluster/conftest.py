"""Fixtures of the cluster tier's tests: the environment tests/cluster/run.sh sets up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from warren.config import ClusterConfig, load_config

# The local cluster's own processes under Warren's supervisor: all that runs on the host
# (Warren's services are pods).
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "containerd",
    "kubelet",
    "kube-proxy",
)
# A joined node's own processes, supervised inside its namespaces.
JOINED_COMPONENTS = ("containerd", "kubelet", "kube-proxy")


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    missing = [k for k in ("WARREN_HOME", "WARREN_BIN_DIR", "WARREN_TEST_CONFIG") if k not in os.environ]
    if missing:
        pytest.fail(f"run the cluster tier through tests/cluster/run.sh (missing {', '.join(missing)})")
    # No URL or key from outside: `warren sandbox` must find the local deployment by itself.
    return {k: v for k, v in os.environ.items() if k not in {"WARREN_URL", "WARREN_API_KEY"}}


@pytest.fixture(scope="module")
def settings(env: dict[str, str]) -> ClusterConfig:
    return load_config(Path(env["WARREN_TEST_CONFIG"])).cluster


@pytest.fixture(scope="module")
def first_node(env: dict[str, str]) -> str:
    """The node in the host's own network, whose processes, floor and mounts the host sees;
    a joined node keeps its own in its namespaces."""
    from warren.node.workloads import first_node_name

    return first_node_name(load_config(Path(env["WARREN_TEST_CONFIG"])))


@pytest.fixture(scope="module")
def state(env: dict[str, str]) -> Path:
    return Path(env["WARREN_HOME"]) / "cluster"
