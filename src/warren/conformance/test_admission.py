"""Every rule of the sandbox-pod admission policy: one Success and Violation cases for
containers, init containers and ephemeral containers, against the real API server.

Pods are submitted with a server-side dry run: it passes through every admission stage
exactly like a real create, and a wrongly admitted pod leaves nothing behind.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from warren.config import WarrenConfig
from warren.conformance.kube import (
    Obj,
    ephemeral_container,
    refusal,
    sandbox_pod,
    unique,
    with_init,
)
from warren.kube import api_client

DRY = "All"


@dataclass(frozen=True)
class Case:
    id: str
    rule: str  # the rule id the refusal message must name
    mutate: Callable[[Obj], None]


def _security(kind: str, **fields: object) -> Callable[[Obj], None]:
    def mutate(pod: Obj) -> None:
        for container in pod["spec"][kind]:
            container.setdefault("securityContext", {}).update(fields)

    return mutate


def _privileged(kind: str) -> Callable[[Obj], None]:
    # The API itself rejects privileged together with allowPrivilegeEscalation: false,
    # so a privileged container leaves that field out (and breaks that rule too).
    def mutate(pod: Obj) -> None:
        for container in pod["spec"][kind]:
            container["securityContext"] = {"privileged": True}

    return mutate


def _spec(**fields: object) -> Callable[[Obj], None]:
    def mutate(pod: Obj) -> None:
        pod["spec"].update(fields)

    return mutate


def _no_runtime_class(pod: Obj) -> None:
    del pod["spec"]["runtimeClassName"]


def _host_port(kind: str) -> Callable[[Obj], None]:
    def mutate(pod: Obj) -> None:
        pod["spec"][kind][0]["ports"] = [{"containerPort": 8080, "hostPort": 8080}]

    return mutate


def _volume(volume: Obj) -> Callable[[Obj], None]:
    def mutate(pod: Obj) -> None:
        pod["spec"].setdefault("volumes", []).append(volume)
        pod["spec"]["containers"][0]["volumeMounts"] = [{"name": volume["name"], "mountPath": "/mnt/v"}]

    return mutate


def _no_escalation_field(kind: str) -> Callable[[Obj], None]:
    def mutate(pod: Obj) -> None:
        for container in pod["spec"][kind]:
            container["securityContext"].pop("allowPrivilegeEscalation", None)

    return mutate


def _no_automount(pod: Obj) -> None:
    del pod["spec"]["automountServiceAccountToken"]


TOKEN_VOLUME = {
    "name": "token",
    "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}}]},
}

# Violations on the pod itself; each kind of container gets its own case.
# The workspace volume the controller gives a sandbox pod, and the identity it acts as.
WORKSPACE_VOLUME = {
    "name": "workspace",
    "csi": {"driver": "blockd.warren.dev", "volumeAttributes": {"workspace": "w1", "size": "1Gi"}},
}
CONTROLLER = "system:serviceaccount:warren-system:warren-controller"

POD_CASES = [
    Case("runtime-class-missing", "runtime-class", _no_runtime_class),
    Case("host-network", "host-network", _spec(hostNetwork=True)),
    Case("host-pid", "host-pid", _spec(hostPID=True)),
    Case("host-ipc", "host-ipc", _spec(hostIPC=True)),
    Case("host-port-container", "host-port", _host_port("containers")),
    Case("host-port-init", "host-port", _host_port("initContainers")),
    Case("host-path", "host-path", _volume({"name": "host", "hostPath": {"path": "/"}})),
    Case(
        "host-path-socket",
        "host-path",
        _volume({"name": "sock", "hostPath": {"path": "/run/containerd/containerd.sock"}}),
    ),
    Case(
        "inline-csi-other-driver",
        "csi-driver",
        _volume({"name": "w", "csi": {"driver": "hostpath.csi.k8s.io"}}),
    ),
    Case("privileged-container", "privileged", _privileged("containers")),
    Case("privileged-init", "privileged", _privileged("initContainers")),
    Case(
        "escalation-container", "privilege-escalation", _security("containers", allowPrivilegeEscalation=True)
    ),
    Case(
        "escalation-init", "privilege-escalation", _security("initContainers", allowPrivilegeEscalation=True)
    ),
    Case("escalation-unset-container", "privilege-escalation", _no_escalation_field("containers")),
    Case("escalation-unset-init", "privilege-escalation", _no_escalation_field("initContainers")),
    Case(
        "capabilities-container", "capabilities", _security("containers", capabilities={"add": ["SYS_ADMIN"]})
    ),
    Case(
        "capabilities-init", "capabilities", _security("initContainers", capabilities={"add": ["NET_ADMIN"]})
    ),
    Case("capabilities-net-raw", "capabilities", _security("containers", capabilities={"add": ["NET_RAW"]})),
    Case("token-automount-unset", "service-account-token", _no_automount),
    Case("token-automount-true", "service-account-token", _spec(automountServiceAccountToken=True)),
    Case("token-projected-volume", "service-account-token", _volume(TOKEN_VOLUME)),
    # Anyone but the controller naming a workspace (here: the suite's own admin identity).
    Case("workspace-not-from-the-controller", "workspace-owner", _volume(WORKSPACE_VOLUME)),
]

EPHEMERAL_CASES = [
    Case("privileged-ephemeral", "privileged", lambda c: c.update(securityContext={"privileged": True})),
    Case(
        "escalation-ephemeral",
        "privilege-escalation",
        lambda c: c["securityContext"].update(allowPrivilegeEscalation=True),
    ),
    Case(
        "escalation-unset-ephemeral",
        "privilege-escalation",
        lambda c: c["securityContext"].pop("allowPrivilegeEscalation"),
    ),
    Case(
        "capabilities-ephemeral",
        "capabilities",
        lambda c: c["securityContext"].update(capabilities={"add": ["SYS_PTRACE"]}),
    ),
]


def assert_refused(outcome: object, rule: str) -> None:
    assert outcome is not None, f"a pod breaking [warren:{rule}] was admitted"
    assert getattr(outcome, "status", None) in (403, 422), outcome
    assert f"[warren:{rule}]" in getattr(outcome, "message", ""), (
        f"refused, but not by rule {rule}: {outcome}"
    )


# -- Success ------------------------------------------------------------------------------


def test_success_minimal_pod(core: client.CoreV1Api, sandbox_ns: str) -> None:
    pod = sandbox_pod(unique("ok"))
    assert refusal(lambda: core.create_namespaced_pod(sandbox_ns, pod, dry_run=DRY)) is None


def test_success_pod_with_init_container(core: client.CoreV1Api, sandbox_ns: str) -> None:
    pod = with_init(sandbox_pod(unique("ok-init")))
    assert refusal(lambda: core.create_namespaced_pod(sandbox_ns, pod, dry_run=DRY)) is None


def test_success_workspace_csi_volume_from_the_controller(kubeconfig: Path, sandbox_ns: str) -> None:
    as_controller = client.CoreV1Api(api_client(kubeconfig, as_user=CONTROLLER))
    pod = sandbox_pod(unique("ok-csi"))
    _volume(WORKSPACE_VOLUME)(pod)
    assert refusal(lambda: as_controller.create_namespaced_pod(sandbox_ns, pod, dry_run=DRY)) is None


def test_success_drop_all_capabilities(core: client.CoreV1Api, sandbox_ns: str) -> None:
    pod = sandbox_pod(unique("ok-drop"))
    _security("containers", capabilities={"drop": ["ALL"]}, runAsNonRoot=True, runAsUser=1000)(pod)
    assert refusal(lambda: core.create_namespaced_pod(sandbox_ns, pod, dry_run=DRY)) is None


# -- Violation: pod spec, containers and init containers -----------------------------------


@pytest.mark.parametrize("case", POD_CASES, ids=lambda c: c.id)
def test_violation(core: client.CoreV1Api, sandbox_ns: str, case: Case) -> None:
    pod = with_init(sandbox_pod(unique("bad")))
    case.mutate(pod)
    assert_refused(refusal(lambda: core.create_namespaced_pod(sandbox_ns, pod, dry_run=DRY)), case.rule)


def test_violation_other_runtime_class(core: client.CoreV1Api, sandbox_ns: str, runc_class: str) -> None:
    pod = sandbox_pod(unique("bad-runc"), runtime_class=runc_class)
    assert_refused(refusal(lambda: core.create_namespaced_pod(sandbox_ns, pod, dry_run=DRY)), "runtime-class")


def test_violation_fixing_one_rule_reveals_the_next(core: client.CoreV1Api, sandbox_ns: str) -> None:
    """The API server reports the first broken rule; fixing it must not admit the pod
    while another rule is still broken."""
    pod = sandbox_pod(unique("bad-many"))
    _no_runtime_class(pod)
    _spec(hostNetwork=True)(pod)
    assert_refused(refusal(lambda: core.create_namespaced_pod(sandbox_ns, pod, dry_run=DRY)), "runtime-class")
    pod["spec"]["runtimeClassName"] = "gvisor"
    assert_refused(refusal(lambda: core.create_namespaced_pod(sandbox_ns, pod, dry_run=DRY)), "host-network")


# -- Ephemeral containers, through the pods/ephemeralcontainers subresource ------------------


@pytest.fixture(scope="module")
def running_pod(core: client.CoreV1Api, sandbox_ns: str) -> str:
    """A real, admitted sandbox pod to attach ephemeral containers to (no node needed)."""
    name = unique("target")
    core.create_namespaced_pod(sandbox_ns, sandbox_pod(name))
    return name


def _add_ephemeral(core: client.CoreV1Api, ns: str, pod: str, container: Obj, dry: bool = True) -> object:
    body = {"spec": {"ephemeralContainers": [container]}}
    return core.patch_namespaced_pod_ephemeralcontainers(pod, ns, body, dry_run=DRY if dry else None)


def test_success_ephemeral_container(core: client.CoreV1Api, sandbox_ns: str, running_pod: str) -> None:
    container = ephemeral_container(unique("dbg"))
    assert refusal(lambda: _add_ephemeral(core, sandbox_ns, running_pod, container, dry=False)) is None
    pod = core.read_namespaced_pod(running_pod, sandbox_ns)
    assert container["name"] in [c.name for c in pod.spec.ephemeral_containers or []]


@pytest.mark.parametrize("case", EPHEMERAL_CASES, ids=lambda c: c.id)
def test_violation_ephemeral(core: client.CoreV1Api, sandbox_ns: str, running_pod: str, case: Case) -> None:
    container = ephemeral_container(unique("dbg"))
    case.mutate(container)
    outcome = refusal(lambda: _add_ephemeral(core, sandbox_ns, running_pod, copy.deepcopy(container)))
    assert_refused(outcome, case.rule)
    pod = core.read_namespaced_pod(running_pod, sandbox_ns)
    assert container["name"] not in [c.name for c in pod.spec.ephemeral_containers or []]


# -- Scope: the floor binds sandbox namespaces only ----------------------------------------


def test_non_sandbox_namespace_not_bound(core: client.CoreV1Api, plain_ns: str) -> None:
    pod = sandbox_pod(unique("plain"))
    _no_runtime_class(pod)
    _no_automount(pod)
    assert refusal(lambda: core.create_namespaced_pod(plain_ns, pod, dry_run=DRY)) is None


def test_default_sandbox_namespace_refuses(core: client.CoreV1Api, warren_config: WarrenConfig) -> None:
    ns = warren_config.isolation.default_namespace
    pod = sandbox_pod(unique("bad-default"))
    _no_runtime_class(pod)
    assert_refused(refusal(lambda: core.create_namespaced_pod(ns, pod, dry_run=DRY)), "runtime-class")


def test_default_sandbox_namespace_pod_security_second_layer(
    core: client.CoreV1Api, warren_config: WarrenConfig
) -> None:
    """The default namespace carries Pod Security labels too (defence in depth), and
    Pod Security really refuses there a pod the policy alone would also refuse."""
    ns_name = warren_config.isolation.default_namespace
    ns = core.read_namespace(warren_config.isolation.default_namespace)
    labels = ns.metadata.labels or {}
    assert labels.get("warren.dev/sandbox") == "true"
    assert labels.get("pod-security.kubernetes.io/enforce") == warren_config.isolation.pod_security_level
    pod = sandbox_pod(unique("bad-psa"))
    _volume({"name": "host", "hostPath": {"path": "/"}})(pod)
    outcome = refusal(lambda: core.create_namespaced_pod(ns_name, pod, dry_run=DRY))
    assert outcome is not None and outcome.status == 403
    # Whichever layer answers first, the refusal names the problem.
    assert "hostPath" in outcome.message or "[warren:host-path]" in outcome.message, outcome


def test_no_bad_pod_was_admitted(core: client.CoreV1Api, sandbox_ns: str) -> None:
    """After every case above, the namespace holds only pods that keep the floor."""
    for pod in core.list_namespaced_pod(sandbox_ns).items:
        assert pod.spec.runtime_class_name == "gvisor", pod.metadata.name
        assert pod.spec.automount_service_account_token is False, pod.metadata.name
        assert not pod.spec.host_network and not pod.spec.host_pid and not pod.spec.host_ipc
