"""Two controllers with leader election against a real cluster: exactly one reconciles;
killed, the other takes the lease over and reconciles; a replica whose lease is taken
from it stops at once. Both run as the controller's ServiceAccount, so the RBAC `warren
apply` grants (the Lease in warren-system) is proven enough."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from http import HTTPStatus
from pathlib import Path

import pytest
from k8s_helpers import Controller, controller_kubeconfig, live, pods_of, sandbox_body
from warren_common.testing import wait_for
from warren_control.kube import ApiException, Kube, Obj
from warren_control.leader import EXIT_LOST

pytest_plugins = ["k8s_fixtures"]
pytestmark = pytest.mark.cluster

LEASE_NAMESPACE = "warren-system"
TAKEOVER_TIMEOUT = 120  # lease expiry (15 s) plus a cold gVisor start on a busy machine


def lease_path(name: str) -> str:
    return f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"


def holder(kube: Kube, name: str) -> str | None:
    try:
        lease = kube.request("GET", lease_path(name))
    except ApiException as exc:
        if exc.status == HTTPStatus.NOT_FOUND:
            return None
        raise
    return (lease.get("spec") or {}).get("holderIdentity")


@pytest.fixture
def pair(kube: Kube, kubeconfig: str, namespace: str, tmp_path: Path) -> Iterator[dict[str, Controller]]:
    lease = f"test-{namespace}"
    account = controller_kubeconfig(kube, kubeconfig, tmp_path)
    made = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        extra = ["--leader-election", "--lease-namespace", LEASE_NAMESPACE, "--lease-name", lease,
                 "--lease-identity", name]  # fmt: skip
        made[name] = Controller(namespace, account, tmp_path / name, extra)
    made["a"].start()
    wait_for(lambda: holder(kube, lease) == "a", 60, "controller a to take the lease")
    made["b"].start()
    yield made
    try:
        for sandbox in kube.list_sandboxes(namespace):
            kube.delete_sandbox(namespace, sandbox["metadata"]["name"])
        if any(c.running() for c in made.values()):
            wait_for(lambda: not kube.list_sandboxes(namespace), 120, "every Sandbox to be deleted")
    finally:
        for controller in made.values():
            controller.stop()
            print(controller.logs())
        with contextlib.suppress(ApiException):
            kube.request("DELETE", lease_path(lease))


def running_pod(kube: Kube, namespace: str, name: str, image: str) -> Obj:
    kube.create_sandbox(namespace, sandbox_body(name, image))

    def reached() -> Obj | None:
        sandbox = kube.read_sandbox(namespace, name)
        return sandbox if sandbox and (sandbox.get("status") or {}).get("phase") == "Running" else None

    sandbox = wait_for(reached, TAKEOVER_TIMEOUT, f"{name} to run")
    (pod,) = live(pods_of(kube, namespace, sandbox["metadata"]["uid"]))
    return pod


def test_one_leads_and_the_other_takes_over_when_it_dies(
    kube: Kube, namespace: str, image: str, pair: dict[str, Controller]
) -> None:
    lease = f"test-{namespace}"
    running_pod(kube, namespace, "first", image)
    assert holder(kube, lease) == "a"
    # The follower waits: it has reconciled nothing.
    assert "leading as b" not in pair["b"].logs()

    pair["a"].kill()
    running_pod(kube, namespace, "second", image)
    assert holder(kube, lease) == "b"
    assert "leading as b" in pair["b"].logs()
    # Still exactly one pod for the first sandbox: the new leader adopted it.
    (first,) = [s for s in kube.list_sandboxes(namespace) if s["metadata"]["name"] == "first"]
    assert len(live(pods_of(kube, namespace, first["metadata"]["uid"]))) == 1


def test_a_leader_whose_lease_is_taken_stops_at_once(
    kube: Kube, namespace: str, pair: dict[str, Controller]
) -> None:
    lease = f"test-{namespace}"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    # Someone else holds it now, freshly renewed: a can no longer renew within its deadline.
    kube.request(
        "PATCH",
        lease_path(lease),
        body={"spec": {"holderIdentity": "someone-else", "renewTime": now, "leaseDurationSeconds": 3600}},
        content_type="application/merge-patch+json",
    )
    wait_for(lambda: not pair["a"].running(), 60, "the old leader to stop")
    process = pair["a"].process
    assert process is not None
    assert process.returncode == EXIT_LOST, pair["a"].logs()
    assert "lost the lease" in pair["a"].logs()
    assert pair["b"].running()  # the follower keeps waiting for a lease it may take
