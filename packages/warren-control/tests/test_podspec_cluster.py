"""The pods pod_for builds are admitted by the real API server with the floor applied
(server-side dry run: every admission stage runs, nothing is stored), and the same pods
with one rule broken are refused, so the admission is the floor's and not an accident."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from k8s_helpers import controller_kubeconfig
from warren_control.kube import ApiException, Kube, Obj
from warren_control.podspec import PodOptions, pod_for, pool_pod_for

pytest_plugins = ["k8s_fixtures"]
pytestmark = pytest.mark.cluster

BLOCKD = {"csi": {"driver": "blockd.warren.dev", "volumeAttributes": {"workspace": "ws-test"}}}

SPECS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "command-and-integer-resources": {
        "command": ["sleep", "60"],
        "resources": {"cpu": 1, "memory": 268435456},
    },
    "quantity-strings": {"resources": {"cpu": "250m", "memory": "256Mi"}},
    "only-memory": {"resources": {"memory": "512Mi"}, "persistent": True, "idleTimeoutSeconds": 600},
    "stopped-flag-ignored-by-pod": {"stopped": False, "maxLifetimeSeconds": 3600},
}


def stored_sandbox(kube: Kube, namespace: str, name: str, image: str, spec: dict[str, Any]) -> Obj:
    """A real Sandbox object, read back as the API returns it (uid, defaults applied)."""
    body = {"apiVersion": "warren.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": name}}
    body["spec"] = {"image": image, **spec}
    kube.create_sandbox(namespace, body)
    found = kube.read_sandbox(namespace, name)
    assert found is not None
    return found


def dry_run(kube: Kube, namespace: str, pod: Obj) -> ApiException | None:
    try:
        kube.create_pod(namespace, pod, dry_run=True)
    except ApiException as exc:
        return exc
    return None


def refusal(exc: ApiException | None) -> str:
    assert exc is not None, "the pod was admitted"
    return str(json.loads(exc.body or "{}").get("message"))


@pytest.mark.parametrize("case", list(SPECS))
def test_pod_for_sandbox_is_admitted(kube: Kube, namespace: str, image: str, case: str) -> None:
    sandbox = stored_sandbox(kube, namespace, f"dry-{case}", image, SPECS[case])
    pod = pod_for(sandbox, options=PodOptions(image_pull_policy="Never"))
    exc = dry_run(kube, namespace, pod)
    assert exc is None, f"{case}: {exc.status} {refusal(exc)}" if exc else ""
    assert kube.read_pod(namespace, pod["metadata"]["name"]) is None  # a dry run stores nothing


def test_pod_with_a_long_sandbox_name_is_admitted(kube: Kube, namespace: str, image: str) -> None:
    sandbox = stored_sandbox(kube, namespace, "s" * 200, image, {})
    assert dry_run(kube, namespace, pod_for(sandbox)) is None


def test_a_pools_pod_is_admitted(kube: Kube, namespace: str, image: str) -> None:
    body = {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": "dry-pool"},
        "spec": {"image": image, "size": 0, "resources": {"cpu": "250m", "memory": "256Mi"}},
    }
    pool = kube.request("POST", kube.pools_path(namespace), body=body)
    # With the agent, started unclaimed: the pod the controller makes for a deployed pool.
    options = PodOptions(image_pull_policy="Never", agent_image=image)
    pod = pool_pod_for(pool, name="pool-dry-pool-0123456789", claim_sha256="0" * 64, options=options)
    exc = dry_run(kube, namespace, pod)
    assert exc is None, refusal(exc) if exc else ""


def test_only_the_controller_may_mount_a_workspace(
    kube: Kube, kubeconfig: str, namespace: str, image: str, tmp_path: Path
) -> None:
    sandbox = stored_sandbox(kube, namespace, "dry-workspace", image, {})
    pod = pod_for(sandbox, workspace_volume=BLOCKD)
    as_controller = Kube.connect(str(controller_kubeconfig(kube, kubeconfig, tmp_path)))
    exc = dry_run(as_controller, namespace, pod)
    assert exc is None, refusal(exc)
    # Anyone else naming a workspace (here the cluster's admin) is refused by the floor.
    assert "[warren:workspace-owner]" in refusal(dry_run(kube, namespace, pod))


def _no_runtime_class(pod: Obj) -> None:
    del pod["spec"]["runtimeClassName"]


def _escalation_unset(pod: Obj) -> None:
    del pod["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"]


def _token(pod: Obj) -> None:
    pod["spec"]["automountServiceAccountToken"] = True


def _other_csi_driver(pod: Obj) -> None:
    pod["spec"]["volumes"] = [{"name": "workspace", "csi": {"driver": "other.example.com"}}]


@pytest.mark.parametrize(
    ("breaks", "rule"),
    [
        (_no_runtime_class, "warren:runtime-class"),
        (_escalation_unset, "warren:privilege-escalation"),
        (_token, "warren:service-account-token"),
        (_other_csi_driver, "warren:csi-driver"),
    ],
    ids=["runtime-class", "privilege-escalation", "service-account-token", "csi-driver"],
)
def test_the_same_pod_with_one_rule_broken_is_refused(
    kube: Kube, namespace: str, image: str, breaks: Callable[[Obj], None], rule: str
) -> None:
    sandbox = stored_sandbox(kube, namespace, f"dry-broken-{rule.split(':')[1]}", image, {})
    pod = copy.deepcopy(pod_for(sandbox))
    breaks(pod)
    exc = dry_run(kube, namespace, pod)
    assert exc is not None and exc.status == 403
    assert f"[{rule}]" in refusal(exc)
