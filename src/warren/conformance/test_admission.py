"""Every rule of the sandbox-pod admission policy: one Success and Violation cases for
containers, init containers and ephemeral containers, against the real API server, in both
kinds of sandbox namespace: one with only the sandbox label (Warren's policy alone) and the
platform's own (Pod Security too).

Pods are submitted with a server-side dry run: it passes through every admission stage
exactly like a real create, and a wrongly admitted pod leaves nothing behind.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client

from warren.config import WarrenConfig
from warren.conformance.conftest import FloorNamespace
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


def _probe(kind: str, field: str, handler: Obj) -> Callable[[Obj], None]:
    """A probe (livenessProbe, ...) or lifecycle hook (lifecycle.preStop) on the first
    container of `kind`."""

    def mutate(pod: Obj) -> None:
        container = pod["spec"][kind][0]
        if field.startswith("lifecycle."):
            container.setdefault("lifecycle", {})[field.split(".", 1)[1]] = handler
        else:
            container[field] = handler
        if kind == "initContainers" and field != "lifecycle.preStop":
            container["restartPolicy"] = "Always"  # only sidecar init containers take probes

    return mutate


def _pod_security(**fields: object) -> Callable[[Obj], None]:
    def mutate(pod: Obj) -> None:
        pod["spec"].setdefault("securityContext", {}).update(fields)

    return mutate


def _annotation(key: str, value: str) -> Callable[[Obj], None]:
    def mutate(pod: Obj) -> None:
        pod["metadata"].setdefault("annotations", {})[key] = value

    return mutate


def _both(*mutations: Callable[[Obj], None]) -> Callable[[Obj], None]:
    def mutate(pod: Obj) -> None:
        for mutation in mutations:
            mutation(pod)

    return mutate


HOST_HTTP = {"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}}
HOST_TCP = {"tcpSocket": {"host": "10.0.0.1", "port": 22}}


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
    # Anyone but the controller asking runsc to restore the sandbox from a host path.
    Case(
        "restore-not-from-the-controller",
        "runtime-annotations",
        _annotation("dev.gvisor.internal.restore.image-path", "/etc"),
    ),
    # The rest of the Pod Security baseline, which the policy enforces by itself.
    # The API itself wants hostNetwork with a host process; the policy names the host
    # process first.
    Case(
        "windows-host-process-pod",
        "windows-host-process",
        _both(_spec(hostNetwork=True), _pod_security(windowsOptions={"hostProcess": True})),
    ),
    Case(
        "windows-host-process-container",
        "windows-host-process",
        _both(
            _spec(hostNetwork=True),
            _security("containers", windowsOptions={"hostProcess": True}),
            _security("initContainers", windowsOptions={"hostProcess": True}),
        ),
    ),
    Case("probe-host-liveness-http", "probe-host", _probe("containers", "livenessProbe", HOST_HTTP)),
    Case("probe-host-readiness-tcp", "probe-host", _probe("containers", "readinessProbe", HOST_TCP)),
    Case("probe-host-startup-http", "probe-host", _probe("containers", "startupProbe", HOST_HTTP)),
    Case("probe-host-post-start", "probe-host", _probe("containers", "lifecycle.postStart", HOST_HTTP)),
    Case("probe-host-pre-stop-tcp", "probe-host", _probe("containers", "lifecycle.preStop", HOST_TCP)),
    Case("probe-host-sidecar-init", "probe-host", _probe("initContainers", "livenessProbe", HOST_HTTP)),
    # The API takes Unmasked only in a user namespace (hostUsers: false).
    Case(
        "proc-mount-unmasked",
        "proc-mount",
        _both(_spec(hostUsers=False), _security("containers", procMount="Unmasked")),
    ),
    Case(
        "proc-mount-unmasked-init",
        "proc-mount",
        _both(_spec(hostUsers=False), _security("initContainers", procMount="Unmasked")),
    ),
    Case("seccomp-pod-unconfined", "seccomp", _pod_security(seccompProfile={"type": "Unconfined"})),
    Case(
        "seccomp-container-unconfined",
        "seccomp",
        _security("containers", seccompProfile={"type": "Unconfined"}),
    ),
    Case(
        "seccomp-annotation-unconfined",
        "seccomp",
        _annotation("seccomp.security.alpha.kubernetes.io/pod", "unconfined"),
    ),
    Case("apparmor-pod-unconfined", "apparmor", _pod_security(appArmorProfile={"type": "Unconfined"})),
    Case(
        "apparmor-init-unconfined",
        "apparmor",
        _security("initContainers", appArmorProfile={"type": "Unconfined"}),
    ),
    Case(
        "apparmor-annotation-unconfined",
        "apparmor",
        _annotation("container.apparmor.security.beta.kubernetes.io/main", "unconfined"),
    ),
    Case("selinux-pod-type", "selinux", _pod_security(seLinuxOptions={"type": "spc_t"})),
    Case("selinux-container-user", "selinux", _security("containers", seLinuxOptions={"user": "root"})),
    Case("selinux-init-role", "selinux", _security("initContainers", seLinuxOptions={"role": "sysadm_r"})),
    Case("sysctls-unsafe", "sysctls", _pod_security(sysctls=[{"name": "kernel.msgmax", "value": "65536"}])),
    Case(
        "sysctls-one-unsafe-among-safe",
        "sysctls",
        _pod_security(
            sysctls=[
                {"name": "net.ipv4.tcp_syncookies", "value": "1"},
                {"name": "net.core.somaxconn", "value": "1024"},
            ]
        ),
    ),
]

# Rules that Pod Security's baseline also enforces: in a namespace that enforces it, Pod
# Security may answer first (it runs before admission policies).
BASELINE_RULES = {
    "windows-host-process",
    "host-network",
    "host-pid",
    "host-ipc",
    "host-port",
    "host-path",
    "privileged",
    "capabilities",
    "probe-host",
    "proc-mount",
    "seccomp",
    "apparmor",
    "selinux",
    "sysctls",
}

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
    Case("proc-mount-ephemeral", "proc-mount", lambda c: c["securityContext"].update(procMount="Unmasked")),
    Case(
        "seccomp-ephemeral",
        "seccomp",
        lambda c: c["securityContext"].update(seccompProfile={"type": "Unconfined"}),
    ),
    Case(
        "apparmor-ephemeral",
        "apparmor",
        lambda c: c["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
    ),
    Case(
        "selinux-ephemeral",
        "selinux",
        lambda c: c["securityContext"].update(seLinuxOptions={"type": "unconfined_t"}),
    ),
]


def assert_refused(outcome: object, rule: str, ns: FloorNamespace | None = None) -> None:
    assert outcome is not None, f"a pod breaking [warren:{rule}] was admitted"
    assert getattr(outcome, "status", None) in (403, 422), outcome
    message = getattr(outcome, "message", "")
    if ns is not None and ns.pod_security is not None and "violates PodSecurity" in message:
        # Baseline covers the rule, or the namespace enforces restricted, which covers more.
        assert rule in BASELINE_RULES or ns.pod_security == "restricted", (
            f"Pod Security refused a pod that only [warren:{rule}] should: {outcome}"
        )
        return
    assert f"[warren:{rule}]" in message, f"refused, but not by rule {rule}: {outcome}"


# -- Success ------------------------------------------------------------------------------


def test_success_minimal_pod(core: client.CoreV1Api, floor_ns: FloorNamespace) -> None:
    pod = sandbox_pod(unique("ok"))
    assert refusal(lambda: core.create_namespaced_pod(floor_ns.name, pod, dry_run=DRY)) is None


def test_success_pod_with_init_container(core: client.CoreV1Api, floor_ns: FloorNamespace) -> None:
    pod = with_init(sandbox_pod(unique("ok-init")))
    assert refusal(lambda: core.create_namespaced_pod(floor_ns.name, pod, dry_run=DRY)) is None


def test_success_workspace_csi_volume_from_the_controller(kubeconfig: Path, floor_ns: FloorNamespace) -> None:
    as_controller = client.CoreV1Api(api_client(kubeconfig, as_user=CONTROLLER))
    pod = sandbox_pod(unique("ok-csi"))
    _volume(WORKSPACE_VOLUME)(pod)
    assert refusal(lambda: as_controller.create_namespaced_pod(floor_ns.name, pod, dry_run=DRY)) is None


def test_success_drop_all_capabilities(core: client.CoreV1Api, floor_ns: FloorNamespace) -> None:
    pod = sandbox_pod(unique("ok-drop"))
    _security("containers", capabilities={"drop": ["ALL"]}, runAsNonRoot=True, runAsUser=1000)(pod)
    assert refusal(lambda: core.create_namespaced_pod(floor_ns.name, pod, dry_run=DRY)) is None


def test_success_what_baseline_allows(core: client.CoreV1Api, floor_ns: FloorNamespace) -> None:
    """The new rules are precise: probes without a host, default profiles, allowed SELinux
    types and safe sysctls pass."""
    pod = with_init(sandbox_pod(unique("ok-baseline")))
    _probe("containers", "livenessProbe", {"httpGet": {"path": "/", "port": 8080}})(pod)
    _probe("containers", "readinessProbe", {"tcpSocket": {"port": 8080}})(pod)
    _security("containers", procMount="Default", seLinuxOptions={"type": "container_t", "level": "s0:c1"})(
        pod
    )
    _pod_security(
        seccompProfile={"type": "RuntimeDefault"},
        appArmorProfile={"type": "RuntimeDefault"},
        sysctls=[{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
    )(pod)
    _annotation("container.apparmor.security.beta.kubernetes.io/init", "localhost/warren")(pod)
    assert refusal(lambda: core.create_namespaced_pod(floor_ns.name, pod, dry_run=DRY)) is None


# -- Violation: pod spec, containers and init containers -----------------------------------


@pytest.mark.parametrize("case", POD_CASES, ids=lambda c: c.id)
def test_violation(core: client.CoreV1Api, floor_ns: FloorNamespace, case: Case) -> None:
    pod = with_init(sandbox_pod(unique("bad")))
    case.mutate(pod)
    outcome = refusal(lambda: core.create_namespaced_pod(floor_ns.name, pod, dry_run=DRY))
    assert_refused(outcome, case.rule, floor_ns)


def test_violation_other_runtime_class(
    core: client.CoreV1Api, floor_ns: FloorNamespace, runc_class: str
) -> None:
    pod = sandbox_pod(unique("bad-runc"), runtime_class=runc_class)
    outcome = refusal(lambda: core.create_namespaced_pod(floor_ns.name, pod, dry_run=DRY))
    assert_refused(outcome, "runtime-class", floor_ns)


def test_violation_probe_host_as_the_controller(kubeconfig: Path, floor_ns: FloorNamespace) -> None:
    """A stolen control-plane credential meets the whole floor too, in every sandbox namespace."""
    as_controller = client.CoreV1Api(api_client(kubeconfig, as_user=CONTROLLER))
    pod = sandbox_pod(unique("bad-ctl"))
    _probe("containers", "livenessProbe", HOST_HTTP)(pod)
    outcome = refusal(lambda: as_controller.create_namespaced_pod(floor_ns.name, pod, dry_run=DRY))
    assert_refused(outcome, "probe-host", floor_ns)


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
def running_pod(core: client.CoreV1Api, floor_ns: FloorNamespace) -> Iterator[str]:
    """A real, admitted sandbox pod to attach ephemeral containers to. No node may take it
    (its node selector matches none): nothing is pulled or run. It is in a user namespace
    (hostUsers: false), where the API lets a container ask for an unmasked /proc."""
    name = unique("target")
    pod = sandbox_pod(name)
    pod["spec"]["nodeSelector"] = {"warren.dev/conformance": "no-such-node"}
    pod["spec"]["hostUsers"] = False
    core.create_namespaced_pod(floor_ns.name, pod)
    yield name
    core.delete_namespaced_pod(name, floor_ns.name, grace_period_seconds=0)


def _add_ephemeral(core: client.CoreV1Api, ns: str, pod: str, container: Obj, dry: bool = True) -> object:
    body = {"spec": {"ephemeralContainers": [container]}}
    return core.patch_namespaced_pod_ephemeralcontainers(pod, ns, body, dry_run=DRY if dry else None)


def test_success_ephemeral_container(
    core: client.CoreV1Api, floor_ns: FloorNamespace, running_pod: str
) -> None:
    container = ephemeral_container(unique("dbg"))
    assert refusal(lambda: _add_ephemeral(core, floor_ns.name, running_pod, container, dry=False)) is None
    pod = core.read_namespaced_pod(running_pod, floor_ns.name)
    assert container["name"] in [c.name for c in pod.spec.ephemeral_containers or []]


@pytest.mark.parametrize("case", EPHEMERAL_CASES, ids=lambda c: c.id)
def test_violation_ephemeral(
    core: client.CoreV1Api, floor_ns: FloorNamespace, running_pod: str, case: Case
) -> None:
    container = ephemeral_container(unique("dbg"))
    case.mutate(container)
    outcome = refusal(lambda: _add_ephemeral(core, floor_ns.name, running_pod, copy.deepcopy(container)))
    assert_refused(outcome, case.rule, floor_ns)
    pod = core.read_namespaced_pod(running_pod, floor_ns.name)
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
