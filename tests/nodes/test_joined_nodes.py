"""Two joined nodes of one local cluster (tests/nodes/run.sh brings it up): each a real
kubelet, containerd and runsc in network and mount namespaces of its own on this machine.

Both nodes are Ready at their own addresses; a gVisor pod runs on each and answers exec
through the API server; pods on the two nodes reach each other and cluster DNS across the
host; on every node the egress floor keeps a sandbox pod from the node, the host's end of its
link and the API server while a pod outside the sandbox namespaces on the same node reaches
them. test_teardown.py, last, takes the cluster down.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from warren.config import WarrenConfig
from warren.conformance.kube import busybox_pod, exec_in, namespace, running_pod, unique
from warren.node.images import busybox_image
from warren.node.joined import Site

pytestmark = pytest.mark.nodes

PORT = 8080


@pytest.fixture(scope="module")
def image() -> str:
    return busybox_image()


@pytest.fixture(scope="module")
def plain_ns(core: client.CoreV1Api) -> Iterator[str]:
    with namespace(core, unique("nodes-plain"), {}) as name:
        yield name


@pytest.fixture(scope="module")
def sandbox_ns(core: client.CoreV1Api) -> Iterator[str]:
    labels = {"warren.dev/sandbox": "true", "pod-security.kubernetes.io/enforce": "baseline"}
    with namespace(core, unique("nodes-sandbox"), labels) as name:
        yield name


def _on(pod: dict[str, object], node: str, listen: bool = False) -> dict[str, object]:
    spec = pod["spec"]
    assert isinstance(spec, dict)
    spec["nodeName"] = node
    if listen:  # answers every TCP connection on PORT with the pod's own name
        container = spec["containers"][0]
        name = pod["metadata"]["name"]  # type: ignore[index]
        container["command"] = ["sh", "-c", f"while true; do echo {name} | nc -l -p {PORT}; done"]
    return pod


@dataclass(frozen=True)
class Pods:
    namespace: str
    on: dict[str, str]  # node -> pod


@pytest.fixture(scope="module")
def plain_pods(core: client.CoreV1Api, plain_ns: str, sites: list[Site], image: str) -> Pods:
    """A gVisor pod outside the sandbox namespaces on every node, listening on PORT."""
    pods = Pods(plain_ns, {})
    for site in sites:
        name = unique(f"plain-{site.name}")
        running_pod(core, plain_ns, _on(busybox_pod(name, image), site.name, listen=True))
        pods.on[site.name] = name
    return pods


@pytest.fixture(scope="module")
def sandbox_pods(core: client.CoreV1Api, sandbox_ns: str, sites: list[Site], image: str) -> Pods:
    """A gVisor pod in a sandbox namespace (under the egress floor) on every node."""
    pods = Pods(sandbox_ns, {})
    for site in sites:
        name = unique(f"sandbox-{site.name}")
        running_pod(core, sandbox_ns, _on(busybox_pod(name, image), site.name))
        pods.on[site.name] = name
    return pods


def _connects(core: client.CoreV1Api, pods: Pods, node: str, address: str, port: int) -> bool:
    command = ["sh", "-c", f"nc -w 3 {address} {port} </dev/null"]
    return exec_in(core, pods.namespace, pods.on[node], command, timeout=20).code == 0


def test_every_joined_node_is_ready_at_its_own_address(core: client.CoreV1Api, sites: list[Site]) -> None:
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert sorted(nodes) == sorted(s.name for s in sites)
    for site in sites:
        node = nodes[site.name]
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        assert ready.status == "True", f"{site.name}: {ready.reason} {ready.message}"
        addresses = {a.address for a in node.status.addresses if a.type == "InternalIP"}
        assert addresses == {site.address}


def test_a_gvisor_pod_runs_on_every_node(core: client.CoreV1Api, plain_pods: Pods, sites: list[Site]) -> None:
    for site in sites:
        pod = core.read_namespaced_pod(plain_pods.on[site.name], plain_pods.namespace)
        assert pod.spec.node_name == site.name
        assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(site.pod_subnet)
        # The kubelet answers the API server's exec on this node; the kernel is gVisor's.
        result = exec_in(core, plain_pods.namespace, pod.metadata.name, ["dmesg"])
        assert result.code == 0 and "gVisor" in result.output, result.output[:200]


def test_pods_reach_each_other_and_cluster_dns_across_nodes(
    core: client.CoreV1Api, plain_pods: Pods, sites: list[Site], config: WarrenConfig
) -> None:
    ns = plain_pods.namespace
    ips = {s.name: core.read_namespaced_pod(plain_pods.on[s.name], ns).status.pod_ip for s in sites}
    for site in sites:
        for other in (o for o in sites if o is not site):
            command = ["sh", "-c", f"nc -w 3 {ips[other.name]} {PORT} </dev/null"]
            result = exec_in(core, ns, plain_pods.on[site.name], command)
            assert plain_pods.on[other.name] in result.output, f"{site.name} -> {other.name}: {result.output}"
        name = f"kubernetes.default.svc.{config.cluster.cluster_domain}"
        lookup = exec_in(core, ns, plain_pods.on[site.name], ["nslookup", name])
        assert config.cluster.service_ip in lookup.output, f"{site.name}: {lookup.output}"


def test_the_egress_floor_holds_on_every_node(
    core: client.CoreV1Api, plain_pods: Pods, sandbox_pods: Pods, sites: list[Site], config: WarrenConfig
) -> None:
    seat = Path(os.environ["WARREN_HOME"]) / "cluster" / "nodes" / sites[0].name / "seat.json"
    api_address = json.loads(seat.read_text())["api_address"]
    for site in sites:
        targets = {
            "its kubelet": (site.address, 10250),
            "the host's end of its link": (site.host_address, config.cluster.api_port),
            "the API server": (api_address, config.cluster.api_port),
        }
        for what, (address, port) in targets.items():
            assert _connects(core, plain_pods, site.name, address, port), (
                f"control: a plain pod on {site.name} must reach {what} ({address}:{port})"
            )
            assert not _connects(core, sandbox_pods, site.name, address, port), (
                f"a sandbox pod on {site.name} reached {what} ({address}:{port})"
            )
