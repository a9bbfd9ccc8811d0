"""Sandbox pods really run under gVisor, carry no token and get /workspace nosuid,nodev.

These start real pods, so they run only with --runtime-tests (the cluster's nodes must
have gVisor and be able to start --image).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from warren.config import WarrenConfig
from warren.conformance.kube import busybox_pod, exec_in, running_pod, unique


@pytest.fixture(scope="module", autouse=True)
def _wanted(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("--runtime-tests"):
        pytest.skip("starts real pods: pass --runtime-tests on a cluster whose nodes run gVisor")


@pytest.fixture(scope="module")
def sandbox_home(warren_config: WarrenConfig) -> str:
    """The installation's own default sandbox namespace: where users' sandboxes run."""
    return warren_config.isolation.default_namespace


@pytest.fixture(scope="module")
def sandbox(core: client.CoreV1Api, sandbox_home: str, image: str) -> Iterator[str]:
    name = unique("gvisor")
    running_pod(core, sandbox_home, busybox_pod(name, image))
    yield name
    core.delete_namespaced_pod(name, sandbox_home, grace_period_seconds=0)


@pytest.fixture(scope="module")
def plain(core: client.CoreV1Api, plain_ns: str, image: str) -> Iterator[str]:
    """The same pod outside a sandbox namespace, with the node's default runtime."""
    name = unique("runc")
    running_pod(core, plain_ns, busybox_pod(name, image, runtime_class=None))
    yield name
    core.delete_namespaced_pod(name, plain_ns, grace_period_seconds=0)


def _node_kernel(core: client.CoreV1Api, namespace: str, pod: str) -> str:
    node = core.read_namespaced_pod(pod, namespace).spec.node_name
    return str(core.read_node(node).status.node_info.kernel_version)


def test_sandbox_pod_kernel_is_gvisor(core: client.CoreV1Api, sandbox_home: str, sandbox: str) -> None:
    dmesg = exec_in(core, sandbox_home, sandbox, ["dmesg"])
    assert dmesg.code == 0, dmesg.output
    assert "gVisor" in dmesg.output, dmesg.output[:500]
    uname = exec_in(core, sandbox_home, sandbox, ["uname", "-r"])
    assert uname.output.strip() != _node_kernel(core, sandbox_home, sandbox)


def test_plain_pod_kernel_is_the_hosts(core: client.CoreV1Api, plain_ns: str, plain: str) -> None:
    """The control case: without gVisor a pod sees the node's own kernel."""
    uname = exec_in(core, plain_ns, plain, ["uname", "-r"])
    assert uname.output.strip() == _node_kernel(core, plain_ns, plain)
    assert "gVisor" not in exec_in(core, plain_ns, plain, ["dmesg"]).output


def test_sandbox_pod_has_no_service_account_token(
    core: client.CoreV1Api, sandbox_home: str, sandbox: str
) -> None:
    token = exec_in(core, sandbox_home, sandbox, ["ls", "/var/run/secrets/kubernetes.io/serviceaccount"])
    assert token.code != 0, token.output
    mounts = exec_in(core, sandbox_home, sandbox, ["cat", "/proc/mounts"]).output
    assert "serviceaccount" not in mounts


def test_workspace_is_nosuid_nodev(core: client.CoreV1Api, sandbox_home: str, sandbox: str) -> None:
    mounts = exec_in(core, sandbox_home, sandbox, ["cat", "/proc/mounts"]).output
    lines = [line.split() for line in mounts.splitlines() if len(line.split()) > 3]
    workspace = [fields for fields in lines if fields[1] == "/workspace"]
    assert workspace, mounts
    options = workspace[-1][3].split(",")
    assert "nosuid" in options and "nodev" in options, workspace[-1]
    assert "noexec" not in options  # building and running code there is the point
