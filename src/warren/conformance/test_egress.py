"""The egress floor, tried from inside a sandbox pod.

Test hosts at private, shared, link-local and metadata addresses, and one at a public
documentation address, are made on this machine in network namespaces (--egress-test-hosts
local; every node of the cluster must run on this machine, as the local cluster's joined
nodes do). The floor is each node's own, so every probe is made from a pod on each Ready
node. From a sandbox pod none of the forbidden ones, nor its node, nor the `kubernetes`
Service, answers; the public one and cluster DNS do. The same probes from a pod outside any
sandbox namespace on the same node reach the private hosts: the floor singles out sandbox
pods, and the hosts were really there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from warren.config import WarrenConfig
from warren.conformance.kube import busybox_pod, exec_in, ready_nodes, running_pod, unique
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
        pytest.skip(
            "needs test hosts: pass --egress-test-hosts local on the machine the nodes run on (as root)"
        )


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
def nodes(core: client.CoreV1Api) -> list[str]:
    """Every Ready, schedulable node."""
    ready = ready_nodes(core)
    assert ready, "no node is Ready"
    return ready


def _on_each(
    core: client.CoreV1Api, ns: str, nodes: list[str], image: str, runtime_class: str | None
) -> Iterator[dict[str, str]]:
    """A busybox pod on each node: node -> pod name; removed afterwards."""
    pods: dict[str, str] = {}
    try:
        for node in nodes:
            pod = busybox_pod(unique("egress" if runtime_class else "egress-plain"), image, runtime_class)
            pod["spec"]["nodeName"] = node
            pods[node] = pod["metadata"]["name"]
            running_pod(core, ns, pod)
        yield pods
    finally:
        for name in pods.values():
            core.delete_namespaced_pod(name, ns, grace_period_seconds=0)


@pytest.fixture(scope="module")
def sandbox(
    core: client.CoreV1Api, sandbox_ns: str, image: str, nodes: list[str], hosts: dict[str, ProbeHost]
) -> Iterator[dict[str, str]]:
    yield from _on_each(core, sandbox_ns, nodes, image, "gvisor")


@pytest.fixture(scope="module")
def plain(
    core: client.CoreV1Api, plain_ns: str, image: str, nodes: list[str], hosts: dict[str, ProbeHost]
) -> Iterator[dict[str, str]]:
    yield from _on_each(core, plain_ns, nodes, image, None)


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
    core: client.CoreV1Api, sandbox_ns: str, sandbox: dict[str, str], hosts: dict[str, ProbeHost], label: str
) -> None:
    host = hosts[label]
    reached = [node for node, pod in sandbox.items() if fetch(core, sandbox_ns, pod, host)]
    assert not reached, f"a sandbox reached {host.address} ({label}) from node(s) {reached}"


@pytest.mark.parametrize("label", sorted(FORBIDDEN))
def test_non_sandbox_pod_reaches_the_same_host(
    core: client.CoreV1Api, plain_ns: str, plain: dict[str, str], hosts: dict[str, ProbeHost], label: str
) -> None:
    host = hosts[label]
    for node, pod in plain.items():
        assert f"warren-test-host {host.address}" in fetch(core, plain_ns, pod, host), node


def test_sandbox_reaches_public_address(
    core: client.CoreV1Api, sandbox_ns: str, sandbox: dict[str, str], hosts: dict[str, ProbeHost]
) -> None:
    host = hosts["public"]
    for node, pod in sandbox.items():
        assert f"warren-test-host {host.address}" in fetch(core, sandbox_ns, pod, host), node


def _node_address(core: client.CoreV1Api, node: str) -> str:
    return next(a.address for a in core.read_node(node).status.addresses if a.type == "InternalIP")


def test_sandbox_cannot_reach_kubelet(
    core: client.CoreV1Api, sandbox_ns: str, sandbox: dict[str, str], plain_ns: str, plain: dict[str, str]
) -> None:
    """Its own node's kubelet, and every other node's."""
    for node, pod in sandbox.items():
        for other in sandbox:
            node_ip = _node_address(core, other)
            assert connects(core, plain_ns, plain[node], node_ip, 10250), (
                f"control: the kubelet port of {other} must be open from {node}"
            )
            assert not connects(core, sandbox_ns, pod, node_ip, 10250), f"from {node} to {other}'s kubelet"


def test_sandbox_cannot_reach_kubernetes_service(
    core: client.CoreV1Api,
    sandbox_ns: str,
    sandbox: dict[str, str],
    plain_ns: str,
    plain: dict[str, str],
    warren_config: WarrenConfig,
) -> None:
    service_ip = warren_config.cluster.service_ip
    for node, pod in sandbox.items():
        assert connects(core, plain_ns, plain[node], service_ip, 443), (
            f"control: the API must answer {node}'s pods"
        )
        assert not connects(core, sandbox_ns, pod, service_ip, 443), node


def test_sandbox_resolves_cluster_dns(
    core: client.CoreV1Api, sandbox_ns: str, sandbox: dict[str, str], warren_config: WarrenConfig
) -> None:
    domain = warren_config.cluster.cluster_domain
    for node, pod in sandbox.items():
        result = exec_in(core, sandbox_ns, pod, ["nslookup", f"kubernetes.default.svc.{domain}"], timeout=20)
        assert result.code == 0, (node, result.output)
        assert warren_config.cluster.service_ip in result.output, node
