"""Warren's services as workloads on the local cluster (tests/cluster/run.sh deployed them):
every workload becomes ready, one control-plane replica holds the Lease, warren-blockd's
DaemonSet registers the CSI driver with the kubelet, the Secrets exist on the cluster and in
no rendered output, and no Warren service runs on the host outside a pod."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import wait_for
from kubernetes import client

from warren.config import load_config
from warren.render import render_text

pytestmark = pytest.mark.workloads

SYSTEM = "warren-system"


@pytest.fixture(scope="module")
def ready(api: client.ApiClient) -> None:
    """Every workload of warren-system ready (the install Job complete)."""
    apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
    wait_for(
        "the install Job to complete",
        lambda: any((j.status.succeeded or 0) >= 1 for j in batch.list_namespaced_job(SYSTEM).items),
    )
    for name in ("warren-objects", "warren-postgres"):
        wait_for(
            f"StatefulSet {name}",
            lambda n=name: (apps.read_namespaced_stateful_set(n, SYSTEM).status.ready_replicas or 0) == 1,
        )
    control = apps.read_namespaced_deployment("warren-control", SYSTEM)
    wait_for(
        "Deployment warren-control",
        lambda: (
            (apps.read_namespaced_deployment("warren-control", SYSTEM).status.available_replicas or 0)
            == control.spec.replicas
        ),
    )

    def blockd_ready() -> bool:
        status = apps.read_namespaced_daemon_set("warren-blockd", SYSTEM).status
        return (
            bool(status.desired_number_scheduled) and status.number_ready == status.desired_number_scheduled
        )

    wait_for("DaemonSet warren-blockd", blockd_ready)


def test_one_replica_holds_the_lease(api: client.ApiClient, ready: None) -> None:
    lease = client.CoordinationV1Api(api).read_namespaced_lease("warren-control", SYSTEM)
    pods = client.CoreV1Api(api).list_namespaced_pod(
        SYSTEM, label_selector="app.kubernetes.io/name=warren-control"
    )
    names = {p.metadata.name for p in pods.items if p.status.phase == "Running"}
    assert len(names) == 2, names  # control_replicas in warren-workloads.yaml
    assert lease.spec.holder_identity in names


def test_the_daemonset_registers_the_workspace_driver(api: client.ApiClient, ready: None) -> None:
    for node in client.StorageV1Api(api).list_csi_node().items:
        drivers = {d.name for d in node.spec.drivers or []}
        assert "blockd.warren.dev" in drivers, node.metadata.name


def _secret(api: client.ApiClient, name: str) -> dict[str, str]:
    found = client.CoreV1Api(api).read_namespaced_secret(name, SYSTEM)
    return {key: base64.b64decode(value).decode() for key, value in (found.data or {}).items()}


def test_the_secrets_are_made_on_the_cluster_and_rendered_nowhere(api: client.ApiClient, ready: None) -> None:
    values = [
        _secret(api, "warren-stamp-key")["key"],
        _secret(api, "warren-secrets-key")["key"],
        _secret(api, "warren-postgres")["password"],
        _secret(api, "warren-object-store")["AWS_SECRET_ACCESS_KEY"],
        _secret(api, "warren-first-key")["key"],
    ]
    assert all(len(v) >= 32 for v in values)
    rendered = "\n".join(render_text(load_config(Path(os.environ["WARREN_CONFIG"]))).values())
    for value in values:
        assert value not in rendered


class _Process(NamedTuple):
    parent: int
    cmdline: str
    cgroup: str
    net: str  # the network namespace
    from_a_test: bool  # pytest's PYTEST_CURRENT_TEST in its environment


def _commands() -> dict[int, _Process]:
    """Every process, by pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cgroup = (entry / "cgroup").read_text()
            status = (entry / "status").read_text()
            net = str((entry / "ns" / "net").readlink())
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone meanwhile
        parent = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("PPid:"))
        found[int(entry.name)] = _Process(parent, cmdline, cgroup, net, b"PYTEST_CURRENT_TEST=" in environ)
    return found


def _under_a_test(pid: int, processes: dict[int, _Process]) -> bool:
    """Started by another tier's tests, not by an install: a pytest process above it, or,
    for a service a supervisor detached from its test, pytest's variable in its environment."""
    seen = set()
    while pid in processes and pid not in seen:
        seen.add(pid)
        if "pytest" in processes[pid].cmdline or processes[pid].from_a_test:
            return True
        pid = processes[pid].parent
    return False


def test_no_warren_service_runs_on_the_host(ready: None) -> None:
    services = ("warren-control serve", "warren-blockd", "weed mini", "postgres -D")
    processes = _commands()
    ours = {pid: p for pid, p in processes.items() if any(s in p.cmdline for s in services)}
    in_pods = {pid for pid, p in ours.items() if "kubepods" in p.cgroup}
    # The hosts tier, run beside this one, installs Warren onto hosts that are network
    # namespaces of their own, with services that outlive the test that started them: those
    # are other hosts, not this one.
    host_net = str(Path("/proc/self/ns/net").readlink())
    outside = [
        p.cmdline
        for pid, p in ours.items()
        if pid not in in_pods and p.net == host_net and not _under_a_test(pid, processes)
    ]
    assert outside == []
    # They do run, in pods: the check can see them (the edge, the daemon and its plugin, the stores).
    commands = [ours[pid].cmdline for pid in in_pods]
    for service in services:
        assert any(service in c for c in commands), service
