"""EKS: secrets encrypted with KMS, private endpoint, audit logs, and nodes that run gVisor."""

from __future__ import annotations

import base64
import binascii
import email
import email.policy
from collections.abc import Mapping
from typing import Any

import yaml
from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    StackValidationArgs,
    StackValidationPolicy,
)

from warren_policy.props import PRODUCTION_CONFIG_SCHEMA, get, is_internet, is_production, is_true, items
from warren_policy.rules import resource_rule

CLUSTER = "aws:eks/cluster:Cluster"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
REQUIRED_LOGS = ("api", "audit", "authenticator")
GVISOR_RUNTIME = 'runtime_type = "io.containerd.runsc.v1"'


def _secrets_encrypted(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    config = props.get("encryptionConfig")
    if "secrets" in items(get(config, "resources")) and get(config, "provider", "keyArn"):
        return []
    return ["encryptionConfig must encrypt `secrets` with a KMS key (provider.keyArn)"]


def _endpoint(props: Mapping[str, Any], args: ResourceValidationArgs) -> list[str]:
    vpc = props.get("vpcConfig")
    messages = []
    if not is_true(get(vpc, "endpointPrivateAccess")):
        messages.append("vpcConfig.endpointPrivateAccess must be true")
    # EKS's default for the public endpoint is on, so an absent value counts as on.
    public = get(vpc, "endpointPublicAccess")
    public_on = public is None or is_true(public)
    if public_on and is_production(args):
        messages.append("vpcConfig.endpointPublicAccess must be false in a production stack")
    elif public_on:
        cidrs = items(get(vpc, "publicAccessCidrs"))
        if not cidrs or any(is_internet(c) for c in cidrs):
            messages.append(
                "a public endpoint must be limited to named ranges (publicAccessCidrs without 0.0.0.0/0)"
            )
    return messages


def _logs(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    enabled = set(items(props.get("enabledClusterLogTypes")))
    missing = [log for log in REQUIRED_LOGS if log not in enabled]
    return [f"enabledClusterLogTypes must include {', '.join(missing)}"] if missing else []


def gvisor_problems(user_data_b64: Any) -> list[str]:
    """What a node's user data lacks to make it a gVisor node: installing runsc and its shim
    against pinned checksums, and containerd's runtime entry for the runsc shim."""
    if not isinstance(user_data_b64, str) or not user_data_b64:
        return ["has no user data (nothing installs gVisor)"]
    try:
        text = base64.b64decode(user_data_b64, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return ["has user data that is not base64 text"]
    message = email.message_from_string(text, policy=email.policy.default)
    scripts, node_configs = [], []
    for part in message.walk() if message.is_multipart() else [message]:
        if part.is_multipart():
            continue
        payload = part.get_payload(decode=True)
        body = payload.decode(errors="replace") if isinstance(payload, bytes) else ""
        if part.get_content_type() == "text/x-shellscript":
            scripts.append(body)
        elif part.get_content_type() == "application/node.eks.aws":
            node_configs.append(body)
    problems = []
    script = "\n".join(scripts)
    for needed in ("runsc", "containerd-shim-runsc-v1", "sha256sum --check"):
        if needed not in script:
            problems.append(f"has no script installing gVisor (missing `{needed}`)")
    containerd = ""
    for body in node_configs:
        try:
            containerd += str(get(yaml.safe_load(body), "spec", "containerd", "config") or "")
        except yaml.YAMLError:
            problems.append("has a NodeConfig that is not YAML")
    if GVISOR_RUNTIME not in containerd:
        problems.append("has no containerd runtime entry for the runsc shim in its NodeConfig")
    return problems


def _nodes_run_gvisor(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    templates: dict[str, PolicyResource] = {
        r.urn: r for r in args.resources if r.resource_type == LAUNCH_TEMPLATE
    }
    for group in (r for r in args.resources if r.resource_type == NODE_GROUP):
        linked = [d for d in group.property_dependencies.get("launchTemplate", []) if d.urn in templates]
        if not linked:
            report_violation(
                f"node group {group.name} must launch from a launch template of this stack "
                "(the default one installs no gVisor and allows IMDS hop limit 2)",
                group.urn,
            )
            continue
        for template in linked:
            for problem in gvisor_problems(template.props.get("userData")):
                report_violation(
                    f"node group {group.name}: launch template {template.name} {problem}", group.urn
                )


POLICIES = [
    resource_rule(
        "eks-secrets-encrypted",
        "Kubernetes secrets are encrypted with a KMS key.",
        (CLUSTER,),
        _secrets_encrypted,
    ),
    resource_rule(
        "eks-private-endpoint",
        "The API server has a private endpoint; a public one only outside production, from named ranges.",
        (CLUSTER,),
        _endpoint,
        config_schema=PolicyConfigSchema(properties=PRODUCTION_CONFIG_SCHEMA),
    ),
    resource_rule("eks-control-plane-logs", "API, audit and authenticator logs are on.", (CLUSTER,), _logs),
    StackValidationPolicy(
        name="eks-nodes-run-gvisor",
        description="Every node group launches from a template whose user data installs gVisor.",
        validate=_nodes_run_gvisor,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
]
