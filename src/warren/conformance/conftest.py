"""Fixtures: the cluster under test, the configuration it was installed with, and
throw-away sandbox namespaces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from warren.config import WarrenConfig, load_config
from warren.conformance.kube import namespace, unique
from warren.kube import api_client

SANDBOX_LABEL = {"warren.dev/sandbox": "true"}


@pytest.fixture(scope="session")
def kubeconfig(request: pytest.FixtureRequest) -> Path:
    path = request.config.getoption("--kubeconfig")
    if path is None:
        raise pytest.UsageError("the conformance suite needs --kubeconfig PATH")
    return Path(path)


@pytest.fixture(scope="session")
def warren_config(request: pytest.FixtureRequest) -> WarrenConfig:
    return load_config(request.config.getoption("--warren-config"))


@pytest.fixture(scope="session")
def api(kubeconfig: Path) -> client.ApiClient:
    return api_client(kubeconfig)


@pytest.fixture(scope="session")
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture(scope="session")
def sandbox_ns(core: client.CoreV1Api) -> Iterator[str]:
    """A sandbox namespace with only the sandbox label: the admission policy alone guards it
    (no Pod Security labels), so every refusal here is the policy's own."""
    with namespace(core, unique("warren-conf-sbx"), SANDBOX_LABEL) as name:
        yield name


@pytest.fixture(scope="session")
def plain_ns(core: client.CoreV1Api) -> Iterator[str]:
    """A namespace that is not a sandbox namespace: the floor must leave it alone."""
    with namespace(core, unique("warren-conf-plain"), {}) as name:
        yield name


@pytest.fixture(scope="session")
def runc_class(api: client.ApiClient) -> Iterator[str]:
    """A RuntimeClass other than gvisor, so a pod naming it meets the policy and not the
    RuntimeClass admission plugin's 'not found'."""
    node = client.NodeV1Api(api)
    name = unique("warren-conf-runc")
    node.create_runtime_class(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name},
            "handler": "runc",
        }
    )
    yield name
    node.delete_runtime_class(name)
