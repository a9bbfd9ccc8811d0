"""Fixtures of the nodes tier: the cluster tests/nodes/run.sh brought up."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kubernetes import client

from warren import kube
from warren.config import WarrenConfig, load_config
from warren.node.joined import Site


@pytest.fixture(scope="module")
def config() -> WarrenConfig:
    if "WARREN_TEST_CONFIG" not in os.environ:
        pytest.fail("run the nodes tier through tests/nodes/run.sh (WARREN_TEST_CONFIG is not set)")
    return load_config(Path(os.environ["WARREN_TEST_CONFIG"]))


@pytest.fixture(scope="module")
def sites(config: WarrenConfig) -> list[Site]:
    state = Path(os.environ["WARREN_HOME"]) / "cluster"
    return [Site.of(config, state, i) for i in range(len(config.cluster.joined_nodes))]


@pytest.fixture(scope="module")
def core() -> client.CoreV1Api:
    kubeconfig = Path(os.environ["WARREN_HOME"]) / "cluster" / "admin.kubeconfig"
    return client.CoreV1Api(kube.api_client(kubeconfig))
