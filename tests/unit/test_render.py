from pathlib import Path
from typing import Any

import pytest

from warren.config import WarrenConfig, parse_config
from warren.render import BASELINE, render, write

Obj = dict[str, Any]


def by_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[Obj], kind: str, name: str) -> Obj:
    matches = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name)
    return matches[0]


@pytest.fixture
def objects() -> list[Obj]:
    return render(WarrenConfig())


def test_every_object_is_labelled_and_named(objects: list[Obj]) -> None:
    for obj in objects:
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "warren", obj["metadata"]["name"]


def test_apply_order_namespaces_and_crd_first_policy_before_binding(objects: list[Obj]) -> None:
    kinds = [o["kind"] for o in objects]
    assert kinds.index("Namespace") < kinds.index("ServiceAccount")
    assert kinds.index("CustomResourceDefinition") < kinds.index("ValidatingAdmissionPolicy")
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    for policy in ("warren-sandbox-pods", "warren-floor-guard"):
        assert names.index(("ValidatingAdmissionPolicy", policy)) < names.index(
            ("ValidatingAdmissionPolicyBinding", policy)
        )


def test_sandbox_namespace_labels(objects: list[Obj]) -> None:
    labels = one(objects, "Namespace", "warren-sandboxes")["metadata"]["labels"]
    assert labels["warren.dev/sandbox"] == "true"
    assert labels["pod-security.kubernetes.io/enforce"] == "baseline"


def test_extra_namespaces_get_labels_and_egress_floor() -> None:
    objects = render(
        parse_config({"isolation": {"extra_namespaces": ["team-a"], "pod_security_level": "restricted"}})
    )
    labels = one(objects, "Namespace", "team-a")["metadata"]["labels"]
    assert labels["warren.dev/sandbox"] == "true"
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    policies = by_kind(objects, "NetworkPolicy")
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "warren-sandboxes"]


def test_runtime_class(objects: list[Obj]) -> None:
    assert one(objects, "RuntimeClass", "gvisor")["handler"] == "runsc"


def test_sandbox_policy_fails_closed_and_covers_every_rule(objects: list[Obj]) -> None:
    policy = one(objects, "ValidatingAdmissionPolicy", "warren-sandbox-pods")["spec"]
    assert policy["failurePolicy"] == "Fail"
    resources = policy["matchConstraints"]["resourceRules"][0]["resources"]
    assert set(resources) == {"pods", "pods/ephemeralcontainers"}
    rules = {v["message"].split("]")[0].lstrip("[") for v in policy["validations"]}
    assert rules == {
        f"warren:{r}"
        for r in (
            "runtime-class",
            "host-network",
            "host-pid",
            "host-ipc",
            "host-port",
            "host-path",
            "csi-driver",
            "workspace-owner",
            "runtime-annotations",
            "privileged",
            "privilege-escalation",
            "capabilities",
            "service-account-token",
            # The rest of the Pod Security baseline, enforced by the policy itself.
            "windows-host-process",
            "probe-host",
            "proc-mount",
            "seccomp",
            "apparmor",
            "selinux",
            "sysctls",
        )
    }
    containers = next(v for v in policy["variables"] if v["name"] == "containers")["expression"]
    assert "initContainers" in containers and "ephemeralContainers" in containers


def test_sandbox_binding_selects_label_and_denies(objects: list[Obj]) -> None:
    spec = one(objects, "ValidatingAdmissionPolicyBinding", "warren-sandbox-pods")["spec"]
    assert spec["validationActions"] == ["Deny"]
    assert spec["matchResources"]["namespaceSelector"]["matchLabels"] == {"warren.dev/sandbox": "true"}


def test_guard_exempts_only_platform_groups() -> None:
    objects = render(parse_config({"isolation": {"platform_groups": ["ops:platform"]}}))
    guard = one(objects, "ValidatingAdmissionPolicy", "warren-floor-guard")["spec"]
    assert guard["failurePolicy"] == "Fail"
    condition = guard["matchConditions"][0]["expression"]
    assert "['ops:platform']" in condition
    assert "system:masters" not in condition


def test_safe_sysctls_are_baselines_own(objects: list[Obj]) -> None:
    policy = one(objects, "ValidatingAdmissionPolicy", "warren-sandbox-pods")["spec"]
    sysctls = next(v for v in policy["validations"] if "warren:sysctls" in v["message"])
    for name in BASELINE.safe_sysctls:
        assert f"'{name}'" in sysctls["expression"]
    assert "kernel.msgmax" not in sysctls["expression"]


def test_guard_checks_namespace_creates_for_pod_security(objects: list[Obj]) -> None:
    guard = one(objects, "ValidatingAdmissionPolicy", "warren-floor-guard")["spec"]
    rules = guard["matchConstraints"]["resourceRules"]
    namespaces = next(r for r in rules if r["resources"] == ["namespaces"])
    assert set(namespaces["operations"]) == {"CREATE", "UPDATE"}
    messages = [v["message"] for v in guard["validations"]]
    assert sum("[warren:namespace-pod-security]" in m for m in messages) == 2


def test_csi_allow_list_rendered_as_cel_list() -> None:
    objects = render(parse_config({"isolation": {"allowed_csi_drivers": ["a.example", "b.example"]}}))
    policy = one(objects, "ValidatingAdmissionPolicy", "warren-sandbox-pods")["spec"]
    csi = next(v for v in policy["validations"] if "warren:csi-driver" in v["message"])
    assert "['a.example', 'b.example']" in csi["expression"]


def test_quotes_cannot_reach_cel() -> None:
    with pytest.raises(ValueError, match="quotes"):
        render(parse_config({"isolation": {"platform_groups": ["x' || true || '"]}}))


def test_egress_floor_blocks_every_private_range(objects: list[Obj]) -> None:
    spec = one(objects, "NetworkPolicy", "warren-egress-floor")["spec"]
    assert spec["podSelector"] == {} and spec["policyTypes"] == ["Egress"]
    dns, gateway, public = spec["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    # Warren's egress gateway: its pods, on its port only.
    assert gateway["ports"] == [{"protocol": "TCP", "port": 8090}]
    (peer,) = gateway["to"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "warren-system"}
    assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "warren-gateway"}
    v4, v6 = (peer["ipBlock"] for peer in public["to"])
    assert v4["cidr"] == "0.0.0.0/0" and v6["cidr"] == "::/0"
    for cidr in (
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "100.64.0.0/10",
        "169.254.0.0/16",
        "127.0.0.0/8",
    ):
        assert cidr in v4["except"]
    for cidr in ("fc00::/7", "fe80::/10", "fd00:ec2::254/128"):
        assert cidr in v6["except"]


def test_crd_group_columns_and_conditions(objects: list[Obj]) -> None:
    crd = one(objects, "CustomResourceDefinition", "sandboxes.warren.dev")["spec"]
    assert crd["group"] == "warren.dev"
    version = crd["versions"][0]
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Phase", "Ready", "Age"}
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert "status" in version["subresources"]


def test_pool_crd_columns_and_status(objects: list[Obj]) -> None:
    crd = one(objects, "CustomResourceDefinition", "sandboxpools.warren.dev")["spec"]
    assert crd["names"]["kind"] == "SandboxPool"
    version = crd["versions"][0]
    assert {c["name"] for c in version["additionalPrinterColumns"]} >= {"Size", "Ready", "Starting"}
    assert "status" in version["subresources"]
    sandbox = one(objects, "CustomResourceDefinition", "sandboxes.warren.dev")["spec"]["versions"][0]
    schema = sandbox["schema"]["openAPIV3Schema"]["properties"]
    assert "pool" in schema["spec"]["properties"]
    assert "podName" in schema["status"]["properties"]


def test_write_creates_one_file_per_template(tmp_path: Path) -> None:
    written = write(WarrenConfig(), tmp_path / "out")
    names = {p.name for p in written}
    assert "warren.dev_sandboxes.yaml" in names
    assert "admission-sandbox-pods.yaml" in names
    assert all(p.read_text().strip() for p in written)
