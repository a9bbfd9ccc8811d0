"""The floor's own objects exist as rendered: RuntimeClass, policies, bindings."""

from __future__ import annotations

from kubernetes import client

from warren.config import WarrenConfig


def test_runtime_class_gvisor(api: client.ApiClient, warren_config: WarrenConfig) -> None:
    rc = client.NodeV1Api(api).read_runtime_class(warren_config.isolation.runtime_class)
    assert rc.handler == warren_config.isolation.runtime_handler == "runsc"


def test_policies_fail_closed_and_bound(api: client.ApiClient) -> None:
    adm = client.AdmissionregistrationV1Api(api)
    for name in ("warren-sandbox-pods", "warren-floor-guard"):
        policy = adm.read_validating_admission_policy(name)
        assert policy.spec.failure_policy == "Fail", name
        binding = adm.read_validating_admission_policy_binding(name)
        assert binding.spec.policy_name == name
        assert binding.spec.validation_actions == ["Deny"]
        # A policy the server cannot compile would be reported here and enforce nothing useful.
        checks = (policy.status and policy.status.type_checking) or None
        warnings = (checks.expression_warnings if checks else None) or []
        assert not warnings, warnings


def test_sandbox_binding_selects_sandbox_label(api: client.ApiClient) -> None:
    binding = client.AdmissionregistrationV1Api(api).read_validating_admission_policy_binding(
        "warren-sandbox-pods"
    )
    selector = binding.spec.match_resources.namespace_selector
    assert selector.match_labels == {"warren.dev/sandbox": "true"}


def test_egress_network_policy_in_sandbox_namespaces(
    api: client.ApiClient, warren_config: WarrenConfig
) -> None:
    net = client.NetworkingV1Api(api)
    for ns in warren_config.isolation.sandbox_namespaces:
        policy = net.read_namespaced_network_policy("warren-egress-floor", ns)
        assert policy.spec.policy_types == ["Egress"]
        excepted = {
            e
            for rule in policy.spec.egress
            for peer in rule.to or []
            if peer.ip_block
            for e in peer.ip_block._except or []
        }
        for cidr in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"):
            assert cidr in excepted, cidr
