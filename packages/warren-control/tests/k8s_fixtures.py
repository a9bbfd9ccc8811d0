"""Fixtures for the cluster tests (load with `pytest_plugins = ["k8s_fixtures"]`): a real
cluster with the Warren floor applied, which tests/run-cluster.sh brings up and exports.

Environment:
  WARREN_KUBECONFIG   admin kubeconfig of the cluster (the tests skip without it)
  WARREN_TEST_IMAGE   an image the node already has (run-cluster.sh: the node's busybox)
  WARREN_AGENT_IMAGE  the agent image the node has (tests/cluster/run.sh: the deployed one's)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from k8s_helpers import (
    Controller,
    delete_namespace,
    make_namespace,
    serving_controller,
)
from warren_control.kube import Kube


@pytest.fixture(scope="session")
def kubeconfig() -> str:
    path = os.environ.get("WARREN_KUBECONFIG")
    if not path:
        pytest.skip(
            "no cluster: set WARREN_KUBECONFIG to the admin kubeconfig of a cluster with the Warren "
            "floor applied (tests/run-cluster.sh brings one up)"
        )
    if not Path(path).is_file():
        pytest.fail(f"WARREN_KUBECONFIG names {path}, which does not exist")
    return path


@pytest.fixture(scope="session")
def image() -> str:
    name = os.environ.get("WARREN_TEST_IMAGE")
    if not name:
        pytest.skip("no image: set WARREN_TEST_IMAGE to an image the node has (run-cluster.sh does)")
    return name


@pytest.fixture(scope="session")
def agent_image() -> str:
    name = os.environ.get("WARREN_AGENT_IMAGE")
    if not name:
        # CI runs this on purpose: there a missing image fails instead of skipping.
        reason = (
            "no agent image: set WARREN_AGENT_IMAGE to the agent image the node has "
            "(tests/cluster/run.sh does)"
        )
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    return str(name)


@pytest.fixture(scope="session")
def kube(kubeconfig: str) -> Kube:
    return Kube.connect(kubeconfig)


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    name = make_namespace(kube)
    yield name
    delete_namespace(kube, name)


@pytest.fixture
def controller(kube: Kube, kubeconfig: str, namespace: str, tmp_path: Path) -> Iterator[Controller]:
    """A controller for the test's namespace (serving_controller)."""
    with serving_controller(kube, kubeconfig, namespace, tmp_path) as process:
        yield process
