"""Fixtures: the cluster under test, the configuration it was installed with, throw-away
sandbox namespaces, and Kubernetes' own Pod Security corpus for the cluster's version."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from warren.config import WarrenConfig, load_config
from warren.conformance import podsecurity
from warren.conformance.kube import namespace, unique
from warren.kube import api_client

SANDBOX_LABEL = {"warren.dev/sandbox": "true"}


@dataclass(frozen=True)
class FloorNamespace:
    """A sandbox namespace under test, and the Pod Security level it enforces (None: only
    Warren's policy guards it)."""

    name: str
    pod_security: str | None


# The two kinds of sandbox namespace every floor rule is tried in.
NAMESPACE_KINDS = ("sandbox-label-only", "pod-security")


def _corpus(config: pytest.Config) -> list[podsecurity.Fixture]:
    """The baseline fixtures for the cluster's version; raises CorpusUnavailableError."""
    explicit = config.getoption("--pod-security-fixtures")
    kubeconfig = config.getoption("--kubeconfig")
    if kubeconfig is None:
        raise podsecurity.CorpusUnavailableError("no --kubeconfig")
    version = client.VersionApi(api_client(Path(kubeconfig))).get_code().git_version
    testdata = Path(explicit) if explicit else podsecurity.download(podsecurity.module_version(version))
    if not testdata.is_dir():
        raise pytest.UsageError(f"--pod-security-fixtures {testdata} is not a directory")
    return podsecurity.load(podsecurity.level_dir(testdata, podsecurity.minor_version(version)))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One case per fixture of the corpus; if it cannot be found, one case that skips
    saying what is missing (an explicit --pod-security-fixtures never skips)."""
    if "psa_fixture" not in metafunc.fixturenames:
        return
    try:
        fixtures = _corpus(metafunc.config)
    except podsecurity.CorpusUnavailableError as exc:
        if metafunc.config.getoption("--pod-security-fixtures"):
            raise pytest.UsageError(str(exc)) from None
        reason = str(exc)
        metafunc.parametrize(
            "psa_fixture", [pytest.param(None, marks=pytest.mark.skip(reason=reason))], ids=["corpus"]
        )
        return
    metafunc.parametrize("psa_fixture", fixtures, ids=[f"{f.expect}-{f.name}" for f in fixtures])


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


@pytest.fixture(scope="session", params=NAMESPACE_KINDS)
def floor_ns(
    request: pytest.FixtureRequest, core: client.CoreV1Api, warren_config: WarrenConfig
) -> FloorNamespace:
    """Each kind of sandbox namespace in turn: one with only the sandbox label (Warren's
    policy alone), and the platform's own, which Pod Security guards too."""
    if request.param == "sandbox-label-only":
        return FloorNamespace(request.getfixturevalue("sandbox_ns"), None)
    name = warren_config.isolation.default_namespace
    labels = core.read_namespace(name).metadata.labels or {}
    return FloorNamespace(name, labels.get("pod-security.kubernetes.io/enforce"))


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


@pytest.fixture(scope="session")
def image(request: pytest.FixtureRequest) -> str:
    """The busybox image the tiers that start pods run."""
    return str(request.config.getoption("--image"))


@pytest.fixture(scope="session")
def platform(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The installed platform through its API (--api-url, --api-key-file): the SDK's client."""
    url = request.config.getoption("--api-url")
    key_file: Path | None = request.config.getoption("--api-key-file")
    if not url or key_file is None:
        pytest.skip("the platform tier needs --api-url and --api-key-file (an installed platform and a key)")
    try:
        from warren_control.sdk import Client
    except ImportError:
        pytest.skip(
            "the platform tier needs warren-control's SDK in this environment (pip install warren-control)"
        )
    if not key_file.is_file():
        raise pytest.UsageError(f"--api-key-file {key_file} does not exist")
    with Client(url, key_file.read_text().strip(), timeout=60.0) as client:
        yield client
