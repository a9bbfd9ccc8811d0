"""The floor cannot be dodged by the people it constrains.

An ordinary user of a sandbox namespace (the warren:sandbox-user role, or even the
built-in namespace admin role) cannot relabel the namespace or touch RuntimeClasses:
RBAC refuses. A user whom an operator granted too much (namespace and RuntimeClass
write access cluster-wide) is still refused by the guard policy, and cannot make a
sandbox namespace that lacks Pod Security, the floor's second layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from warren.config import WarrenConfig
from warren.conformance.kube import refusal, sandbox_pod, unique
from warren.kube import api_client

RBAC = "rbac.authorization.k8s.io"


@pytest.fixture(scope="module")
def users(api: client.ApiClient, sandbox_ns: str) -> Iterator[dict[str, str]]:
    """Three impersonated users and the bindings that make them who they are."""
    rbac = client.RbacAuthorizationV1Api(api)
    names = {
        "user": unique("conf-user"),
        "ns-admin": unique("conf-nsadmin"),
        "over": unique("conf-overgranted"),
    }
    bind = unique("warren-conf")
    rbac.create_namespaced_role_binding(
        sandbox_ns,
        {
            "metadata": {"name": f"{bind}-user"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "warren:sandbox-user"},
            "subjects": [{"apiGroup": RBAC, "kind": "User", "name": names["user"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        sandbox_ns,
        {
            "metadata": {"name": f"{bind}-admin"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "admin"},
            "subjects": [{"apiGroup": RBAC, "kind": "User", "name": names["ns-admin"]}],
        },
    )
    rbac.create_cluster_role(
        {
            "metadata": {"name": f"{bind}-over"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["namespaces"],
                    "verbs": ["get", "create", "update", "patch"],
                },
                {
                    "apiGroups": ["node.k8s.io"],
                    "resources": ["runtimeclasses"],
                    "verbs": ["get", "create", "update", "patch", "delete"],
                },
            ],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"{bind}-over"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": f"{bind}-over"},
            "subjects": [{"apiGroup": RBAC, "kind": "User", "name": names["over"]}],
        }
    )
    yield names
    rbac.delete_cluster_role_binding(f"{bind}-over")
    rbac.delete_cluster_role(f"{bind}-over")


def _as(kubeconfig: Path, user: str) -> tuple[client.CoreV1Api, client.NodeV1Api]:
    api = api_client(kubeconfig, as_user=user)
    return client.CoreV1Api(api), client.NodeV1Api(api)


UNLABEL = {"metadata": {"labels": {"warren.dev/sandbox": None}}}
SANDBOX = {"warren.dev/sandbox": "true"}
ENFORCE = "pod-security.kubernetes.io/enforce"
ENFORCE_VERSION = "pod-security.kubernetes.io/enforce-version"
CONTROLLER = "system:serviceaccount:warren-system:warren-controller"


def _new_namespace(labels: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": unique("conf-new"), "labels": labels}}


RELABEL_FALSE = {"metadata": {"labels": {"warren.dev/sandbox": "false"}}}


@pytest.mark.parametrize("who", ["user", "ns-admin"])
def test_ordinary_user_cannot_unlabel_namespace(
    kubeconfig: Path, users: dict[str, str], sandbox_ns: str, who: str
) -> None:
    core, _ = _as(kubeconfig, users[who])
    outcome = refusal(lambda: core.patch_namespace(sandbox_ns, UNLABEL))
    assert outcome is not None and outcome.status == 403, outcome


@pytest.mark.parametrize("who", ["user", "ns-admin"])
def test_ordinary_user_cannot_touch_runtime_classes(
    kubeconfig: Path, users: dict[str, str], warren_config: WarrenConfig, who: str
) -> None:
    _, node = _as(kubeconfig, users[who])
    rc = warren_config.isolation.runtime_class
    body = {"metadata": {"name": unique("conf-rc")}, "handler": "runc"}
    assert (refusal(lambda: node.create_runtime_class(body)) or None) is not None
    assert refusal(lambda: node.patch_runtime_class(rc, {"metadata": {"labels": {"x": "y"}}})) is not None
    assert refusal(lambda: node.delete_runtime_class(rc)) is not None


def test_ordinary_user_pods_still_refused(kubeconfig: Path, users: dict[str, str], sandbox_ns: str) -> None:
    core, _ = _as(kubeconfig, users["user"])
    pod = sandbox_pod(unique("user-bad"))
    pod["spec"]["hostPID"] = True
    outcome = refusal(lambda: core.create_namespaced_pod(sandbox_ns, pod, dry_run="All"))
    assert outcome is not None and "[warren:host-pid]" in outcome.message, outcome
    good = sandbox_pod(unique("user-ok"))
    assert refusal(lambda: core.create_namespaced_pod(sandbox_ns, good, dry_run="All")) is None


@pytest.mark.parametrize("patch", [UNLABEL, RELABEL_FALSE], ids=["unlabel", "relabel-false"])
def test_overgranted_user_cannot_unlabel_namespace(
    kubeconfig: Path, users: dict[str, str], sandbox_ns: str, patch: dict[str, object]
) -> None:
    core, _ = _as(kubeconfig, users["over"])
    outcome = refusal(lambda: core.patch_namespace(sandbox_ns, patch))
    assert outcome is not None and "[warren:namespace-label]" in outcome.message, outcome


def test_overgranted_user_cannot_weaken_pod_security(
    kubeconfig: Path, users: dict[str, str], api: client.ApiClient, sandbox_ns: str
) -> None:
    # The platform (the suite's own admin identity) sets a Pod Security label first.
    client.CoreV1Api(api).patch_namespace(
        sandbox_ns, {"metadata": {"labels": {"pod-security.kubernetes.io/audit": "restricted"}}}
    )
    core, _ = _as(kubeconfig, users["over"])
    for value in (None, "privileged"):
        patch = {"metadata": {"labels": {"pod-security.kubernetes.io/audit": value}}}
        outcome = refusal(lambda p=patch: core.patch_namespace(sandbox_ns, p))  # type: ignore[misc]
        assert outcome is not None and "[warren:namespace-label]" in outcome.message, outcome


def test_overgranted_user_may_edit_unrelated_labels(
    kubeconfig: Path, users: dict[str, str], sandbox_ns: str
) -> None:
    """The guard is precise: it refuses weakening the floor, not every namespace edit."""
    core, _ = _as(kubeconfig, users["over"])
    assert refusal(lambda: core.patch_namespace(sandbox_ns, {"metadata": {"labels": {"team": "a"}}})) is None


def test_overgranted_user_cannot_replace_gvisor_runtime_class(
    kubeconfig: Path, users: dict[str, str], warren_config: WarrenConfig
) -> None:
    _, node = _as(kubeconfig, users["over"])
    rc = warren_config.isolation.runtime_class
    for call in (
        lambda: node.delete_runtime_class(rc),
        lambda: node.patch_runtime_class(rc, {"scheduling": {"nodeSelector": {"x": "y"}}}),
    ):
        outcome = refusal(call)
        assert outcome is not None and "[warren:runtime-class-guard]" in outcome.message, outcome


def test_namespace_and_runtime_class_intact(
    core: client.CoreV1Api, api: client.ApiClient, sandbox_ns: str, warren_config: WarrenConfig
) -> None:
    labels = core.read_namespace(sandbox_ns).metadata.labels
    assert labels["warren.dev/sandbox"] == "true"
    rc = client.NodeV1Api(api).read_runtime_class(warren_config.isolation.runtime_class)
    assert rc.handler == warren_config.isolation.runtime_handler
    assert not rc.scheduling


# -- A sandbox namespace always has its second layer -----------------------------------------

WEAK_SANDBOX_LABELS = {
    "sandbox-label-only": SANDBOX,
    "enforce-privileged": {**SANDBOX, ENFORCE: "privileged"},
    "enforce-old-version": {**SANDBOX, ENFORCE: "baseline", ENFORCE_VERSION: "v1.0"},
    "warn-only": {**SANDBOX, "pod-security.kubernetes.io/warn": "baseline"},
}


@pytest.mark.parametrize("labels", WEAK_SANDBOX_LABELS.values(), ids=WEAK_SANDBOX_LABELS.keys())
def test_overgranted_user_cannot_create_sandbox_namespace_without_pod_security(
    kubeconfig: Path, users: dict[str, str], labels: dict[str, str]
) -> None:
    core, _ = _as(kubeconfig, users["over"])
    outcome = refusal(lambda: core.create_namespace(_new_namespace(labels), dry_run="All"))
    assert outcome is not None and "[warren:namespace-pod-security]" in outcome.message, outcome


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_overgranted_user_may_create_sandbox_namespace_with_pod_security(
    kubeconfig: Path, users: dict[str, str], level: str
) -> None:
    core, _ = _as(kubeconfig, users["over"])
    labels = {**SANDBOX, ENFORCE: level, ENFORCE_VERSION: "latest"}
    assert refusal(lambda: core.create_namespace(_new_namespace(labels), dry_run="All")) is None


def test_overgranted_user_cannot_label_a_plain_namespace_sandbox_without_pod_security(
    kubeconfig: Path, users: dict[str, str], plain_ns: str
) -> None:
    core, _ = _as(kubeconfig, users["over"])
    outcome = refusal(
        lambda: core.patch_namespace(plain_ns, {"metadata": {"labels": SANDBOX}}, dry_run="All")
    )
    assert outcome is not None and "[warren:namespace-pod-security]" in outcome.message, outcome
    both = {"metadata": {"labels": {**SANDBOX, ENFORCE: "baseline"}}}
    assert refusal(lambda: core.patch_namespace(plain_ns, both, dry_run="All")) is None


def test_labelled_first_may_be_given_pod_security_later_never_weaker(
    kubeconfig: Path, users: dict[str, str], sandbox_ns: str
) -> None:
    """The platform made `sandbox_ns` with the sandbox label alone (Warren's policy guards it
    meanwhile: test_pod_security_corpus); Pod Security may be added later, at baseline or
    stricter, but not at a weaker level or an old version."""
    core, _ = _as(kubeconfig, users["over"])
    for labels in ({ENFORCE: "privileged"}, {ENFORCE: "baseline", ENFORCE_VERSION: "v1.0"}):
        outcome = refusal(
            lambda p={"metadata": {"labels": labels}}: core.patch_namespace(sandbox_ns, p, dry_run="All")  # type: ignore[misc]
        )
        assert outcome is not None and "[warren:namespace-pod-security]" in outcome.message, outcome
    strong = {"metadata": {"labels": {ENFORCE: "baseline", ENFORCE_VERSION: "latest"}}}
    assert refusal(lambda: core.patch_namespace(sandbox_ns, strong, dry_run="All")) is None


@pytest.mark.parametrize("who", ["user", "ns-admin", "controller"])
def test_others_cannot_make_namespaces_at_all(kubeconfig: Path, users: dict[str, str], who: str) -> None:
    """Ordinary users and the control plane's own identity (a stolen credential) have no
    right to create or relabel namespaces: RBAC refuses before any policy."""
    core, _ = _as(kubeconfig, CONTROLLER if who == "controller" else users[who])
    outcome = refusal(lambda: core.create_namespace(_new_namespace(SANDBOX), dry_run="All"))
    assert outcome is not None and outcome.status == 403, outcome
    assert "[warren:" not in outcome.message, f"RBAC should refuse before admission: {outcome}"


def test_the_platform_may_make_a_label_only_sandbox_namespace(core: client.CoreV1Api) -> None:
    """The platform's groups are exempt (the suite itself makes such a namespace to prove
    the policy on its own)."""
    assert refusal(lambda: core.create_namespace(_new_namespace(SANDBOX), dry_run="All")) is None
