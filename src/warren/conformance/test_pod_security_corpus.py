"""Kubernetes' own Pod Security baseline corpus against the floor, in both kinds of sandbox
namespace.

Every failing fixture of k8s.io/pod-security-admission (at the cluster's version) is refused:
in a namespace with only the sandbox label by Warren's own policy, with the rule that
matches the fixture's check; in the platform's namespace by Pod Security or by Warren.
Every passing fixture is admitted, except those that add capabilities: Warren refuses every
added capability, baseline allows some. Each fixture is first made to meet Warren's own
rules (gVisor, no token, no privilege escalation), so that its one violation is the only
reason it can be refused. Pods are submitted as server-side dry runs.
"""

from __future__ import annotations

from kubernetes import client

from warren.config import WarrenConfig
from warren.conformance.conftest import FloorNamespace
from warren.conformance.kube import refusal, unique
from warren.conformance.podsecurity import CHECK_RULES, Fixture, floor_compliant

PSA_REFUSAL = "violates PodSecurity"


def test_fixture(
    core: client.CoreV1Api, floor_ns: FloorNamespace, psa_fixture: Fixture, warren_config: WarrenConfig
) -> None:
    fixture = psa_fixture
    name = unique(fixture.name.replace("_", "-"))
    pod = floor_compliant(fixture, name, warren_config.isolation.runtime_class)
    outcome = refusal(lambda: core.create_namespaced_pod(floor_ns.name, pod, dry_run="All"))
    if fixture.expect == "pass" and not fixture.adds_capabilities:
        assert outcome is None, f"baseline admits {fixture.name}, the floor refused it: {outcome}"
        return
    if fixture.expect == "pass":
        rules: tuple[str, ...] = ("capabilities",)
    else:
        known = CHECK_RULES.get(fixture.check)
        assert known is not None, (
            f"Pod Security check {fixture.check!r} (fixture {fixture.name}) has no Warren rule: "
            "the sandbox-pod policy must learn it"
        )
        rules = known
    assert outcome is not None, f"{fixture.expect} fixture {fixture.name} was admitted in {floor_ns.name}"
    assert outcome.status == 403, outcome
    named = [rule for rule in rules if f"[warren:{rule}]" in outcome.message]
    by_pod_security = floor_ns.pod_security is not None and PSA_REFUSAL in outcome.message
    # Only baseline's own violations may be Pod Security's to refuse; added capabilities
    # that baseline allows are Warren's alone.
    if fixture.expect == "fail" and by_pod_security:
        return
    assert named, f"{fixture.name} refused, but not by [warren:{'|'.join(rules)}]: {outcome.message}"
