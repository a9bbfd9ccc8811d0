"""The egress floor, tried from inside a sandbox pod.

Test hosts at private, shared, link-local and metadata addresses, and one at a public
documentation address, are made on this machine in network namespaces (--egress-test-hosts
local; the machine must be the cluster's only node). From a sandbox pod none of the
forbidden ones, nor the node itself, nor the `kubernetes` Service, answers; the public one
and cluster DNS do. The same probes from a pod outside any sandbox namespace reach the
private hosts: the floor singles out sandbox pods, and the hosts were really there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from warren.config import WarrenConfig
from warren.conformance.kube import busybox_pod, exec_in, running_pod, unique
from warren.conformance.testhosts import PORT, ProbeHost

FORBIDDEN = {
    "10/8": "10.199.0.10",
    "172.16/12": "172.31.199.10",
    "192.168/16": "192.168.199.10",
    "100.64/10": "100.100.199.10",
    "metadata": "169.254.169.254",
}
PUBLIC = "203.0.113.10"  # TEST-NET-3, a documentation range: stands for "the internet"


@pytest.fixture(scope="module", autouse=True)
def _wanted(request: pytest.FixtureRequest) -> None:
    if request.config.getoption("--egress-test-hosts") != "local":
        pytest.skip("needs test hosts: pass --egress-test-hosts local on the cluster's only node (as root)")


@pytest.fixture(scope="module")
def hosts() -> Iterator[dict[str, ProbeHost]]:
    made: dict[str, ProbeHost] = {}
    try:
        for label, address in {**FORBIDDEN, "public": PUBLIC}.items():
            made[label] = ProbeHost.create(address)
        yield made
    finally:
        for host in made.values():
            host.remove()


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> str:
    return str(request.config.getoption("--image"))


@pytest.fixture(scope="module")
def sandbox(
    core: client.CoreV1Api, sandbox_ns: str, image: str, hosts: dict[str, ProbeHost]
) -> Iterator[str]:
    name = unique("egress")
    running_pod(core, sandbox_ns, busybox_pod(name, image))
    yield name
    core.delete_namespaced_pod(name, sandbox_ns, grace_period_seconds=0)


@pytest.fixture(scope="module")
def plain(core: client.CoreV1Api, plain_ns: str, image: str, hosts: dict[str, ProbeHost]) -> Iterator[str]:
    name = unique("egress-plain")
    running_pod(core, plain_ns, busybox_pod(name, image, runtime_class=None))
    yield name
    core.delete_namespaced_pod(name, plain_ns, grace_period_seconds=0)


def connects(core: client.CoreV1Api, ns: str, pod: str, address: str, port: int) -> bool:
    """Whether a TCP connection from the pod to address:port is accepted within 3 s."""
    result = exec_in(core, ns, pod, ["nc", "-w", "3", address, str(port)], timeout=20)
    return result.code == 0


def fetch(core: client.CoreV1Api, ns: str, pod: str, host: ProbeHost) -> str:
    """The test host's answer to an HTTP GET from the pod ("" if it could not connect).
    nc with a hand-written request: busybox-static's wget crashes in some images."""
    request = f'printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 3 {host.address} {PORT}'
    result = exec_in(core, ns, pod, ["sh", "-c", request], timeout=20)
    return result.output if result.code == 0 else ""


@pytest.mark.parametrize("label", sorted(FORBIDDEN))
def test_sandbox_cannot_reach(
    core: client.CoreV1Api, sandbox_ns: str, sandbox: str, hosts: dict[str, ProbeHost], label: str
) -> None:
    host = hosts[label]
    assert fetch(core, sandbox_ns, sandbox, host) == "", f"sandbox reached {host.address} ({label})"


@pytest.mark.parametrize("label", sorted(FORBIDDEN))
def test_non_sandbox_pod_reaches_the_same_host(
    core: client.CoreV1Api, plain_ns: str, plain: str, hosts: dict[str, ProbeHost], label: str
) -> None:
    host = hosts[label]
    assert f"warren-test-host {host.address}" in fetch(core, plain_ns, plain, host)


def test_sandbox_reaches_public_address(
    core: client.CoreV1Api, sandbox_ns: str, sandbox: str, hosts: dict[str, ProbeHost]
) -> None:
    host = hosts["public"]
    assert f"warren-test-host {host.address}" in fetch(core, sandbox_ns, sandbox, host)


def _node_address(core: client.CoreV1Api, ns: str, pod: str) -> str:
    node = core.read_node(core.read_namespaced_pod(pod, ns).spec.node_name)
    return next(a.address for a in node.status.addresses if a.type == "InternalIP")


def test_sandbox_cannot_reach_kubelet(
    core: client.CoreV1Api, sandbox_ns: str, sandbox: str, plain_ns: str, plain: str
) -> None:
    node_ip = _node_address(core, sandbox_ns, sandbox)
    assert connects(core, plain_ns, plain, node_ip, 10250), "control: the kubelet port must be open"
    assert not connects(core, sandbox_ns, sandbox, node_ip, 10250)


def test_sandbox_cannot_reach_kubernetes_service(
    core: client.CoreV1Api,
    sandbox_ns: str,
    sandbox: str,
    plain_ns: str,
    plain: str,
    warren_config: WarrenConfig,
) -> None:
    service_ip = warren_config.cluster.service_ip
    assert connects(core, plain_ns, plain, service_ip, 443), "control: the API must answer other pods"
    assert not connects(core, sandbox_ns, sandbox, service_ip, 443)


def test_sandbox_resolves_cluster_dns(
    core: client.CoreV1Api, sandbox_ns: str, sandbox: str, warren_config: WarrenConfig
) -> None:
    domain = warren_config.cluster.cluster_domain
    result = exec_in(core, sandbox_ns, sandbox, ["nslookup", f"kubernetes.default.svc.{domain}"], timeout=20)
    assert result.code == 0, result.output
    assert warren_config.cluster.service_ip in result.output
