"""The policy pack's rules, called directly (no CLI): what the components create passes every rule,
and each rule has a passing case and cases it refuses."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import pytest
from conftest import SHA_RUNSC, SHA_SHIM, Recorder, Registered, run_program
from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from warren_components import (
    AwsSandboxCluster,
    AwsSandboxClusterArgs,
    Database,
    DatabaseArgs,
    GvisorBinaries,
    IngressFrom,
    KvmHostPool,
    KvmHostPoolArgs,
    ObjectStore,
    ObjectStoreArgs,
    WarrenPlatform,
    WarrenPlatformArgs,
)
from warren_components.node_user_data import encode, node_user_data
from warren_policy import POLICIES
from warren_policy.k8s import WORKLOADS

from warren.config import parse_config
from warren.render import render

GVISOR = GvisorBinaries("https://mirror.example/gvisor/x86_64", SHA_RUNSC, SHA_SHIM)
BY_NAME = {p.name: p for p in POLICIES}


def _options() -> PolicyResourceOptions:
    return PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def urn(stack: str, typ: str, name: str) -> str:
    return f"urn:pulumi:{stack}::warren::{typ}::{name}"


def violations(
    policy: str,
    typ: str,
    props: Mapping[str, Any],
    stack: str = "aws-dev",
    config: Mapping[str, Any] | None = None,
) -> list[str]:
    rule = BY_NAME[policy]
    assert isinstance(rule, ResourceValidationPolicy)
    found: list[str] = []

    def report(message: str, _urn: str | None = None) -> None:
        found.append(message)

    args = ResourceValidationArgs(typ, props, urn(stack, typ, "r"), "r", _options(), None, config)
    rule.validate(args, report)
    return found


def stack_violations(policy: str, resources: list[PolicyResource]) -> list[str]:
    rule = BY_NAME[policy]
    assert isinstance(rule, StackValidationPolicy)
    found: list[str] = []

    def report(message: str, _urn: str | None = None) -> None:
        found.append(message)

    rule.validate(StackValidationArgs(resources), report)
    return found


def _ids_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [i for v in value.values() for i in _ids_in(v)]
    if isinstance(value, list):
        return [i for v in value for i in _ids_in(v)]
    return []


def as_policy_resources(recorder: Recorder, stack: str) -> list[PolicyResource]:
    """The recorded resources as the engine hands them to stack policies: property dependencies
    are the resources whose ids a property holds."""
    resources = {
        r.resource_id: PolicyResource(
            r.typ, r.inputs, urn(stack, r.typ, r.name), r.name, _options(), None, None, [], {}
        )
        for r in recorder.resources
    }
    for registered in recorder.resources:
        resource = resources[registered.resource_id]
        for key, value in registered.inputs.items():
            deps = [resources[i] for i in _ids_in(value) if i in resources and i != registered.resource_id]
            if deps:
                resource.property_dependencies[key] = deps
    return list(resources.values())


# -- everything the components create passes ---------------------------------------------------


def _environment() -> None:
    cluster = AwsSandboxCluster(
        "c",
        AwsSandboxClusterArgs(
            cluster_name="warren-aws-prod", region="eu-west-1", availability_zones=["a", "b"], gvisor=GVISOR
        ),
    )
    ObjectStore("ws", ObjectStoreArgs())
    Database(
        "db",
        DatabaseArgs(
            vpc_id=cluster.vpc_id,
            subnet_ids=cluster.private_subnet_ids,
            client_security_group_ids=[cluster.node_security_group_id],
            deletion_protection=True,
        ),
    )
    KvmHostPool(
        "kvm",
        KvmHostPoolArgs(
            vpc_id=cluster.vpc_id,
            subnet_ids=cluster.private_subnet_ids,
            ami_id="ami-1",
            ingress=[IngressFrom(cluster.node_security_group_id, 7070, "forkd")],
        ),
    )


@pytest.fixture(scope="module")
def production() -> Recorder:
    return run_program(_environment, stack="aws-prod")


def test_every_policy_is_mandatory() -> None:
    assert POLICIES
    assert all(p.enforcement_level == EnforcementLevel.MANDATORY for p in POLICIES)


def test_the_components_pass_every_resource_policy_in_production(production: Recorder) -> None:
    checked: set[str] = set()
    for registered in production.resources:
        for policy in POLICIES:
            if isinstance(policy, ResourceValidationPolicy):
                found = violations(policy.name, registered.typ, registered.inputs, stack="aws-prod")
                assert not found, (policy.name, registered.name, found)
                checked.add(registered.typ)
    # The rules saw the resource types they are about.
    for typ in (
        "aws:eks/cluster:Cluster",
        "aws:ec2/launchTemplate:LaunchTemplate",
        "aws:rds/instance:Instance",
    ):
        assert typ in checked


def test_the_components_pass_every_stack_policy(production: Recorder) -> None:
    resources = as_policy_resources(production, "aws-prod")
    for policy in POLICIES:
        if isinstance(policy, StackValidationPolicy):
            assert stack_violations(policy.name, resources) == [], policy.name


# -- S3 -----------------------------------------------------------------------------------------

PAB = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
ALL_BLOCKED = {
    "blockPublicAcls": True,
    "blockPublicPolicy": True,
    "ignorePublicAcls": True,
    "restrictPublicBuckets": True,
}


def test_s3_public_access_success() -> None:
    assert violations("s3-public-access-blocked", PAB, ALL_BLOCKED) == []


@pytest.mark.parametrize("setting", sorted(ALL_BLOCKED))
def test_s3_public_access_violation(setting: str) -> None:
    assert violations("s3-public-access-blocked", PAB, {**ALL_BLOCKED, setting: False}) == [
        f"{setting} must be true"
    ]


def test_s3_versioning() -> None:
    typ = "aws:s3/bucketVersioning:BucketVersioning"
    assert violations("s3-versioning-enabled", typ, {"versioningConfiguration": {"status": "Enabled"}}) == []
    assert violations("s3-versioning-enabled", typ, {"versioningConfiguration": {"status": "Suspended"}})


def test_s3_encryption() -> None:
    typ = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"

    def rules(algorithm: str) -> dict[str, Any]:
        return {"rules": [{"applyServerSideEncryptionByDefault": {"sseAlgorithm": algorithm}}]}

    assert violations("s3-encrypted", typ, rules("aws:kms")) == []
    assert violations("s3-encrypted", typ, rules("AES256")) == []
    assert violations("s3-encrypted", typ, {"rules": []})
    assert violations("s3-encrypted", typ, rules("none"))


def test_s3_ownership() -> None:
    typ = "aws:s3/bucketOwnershipControls:BucketOwnershipControls"
    assert (
        violations("s3-ownership-enforced", typ, {"rule": {"objectOwnership": "BucketOwnerEnforced"}}) == []
    )
    assert violations("s3-ownership-enforced", typ, {"rule": {"objectOwnership": "ObjectWriter"}})


def test_s3_lifecycle() -> None:
    typ = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
    expire = {"status": "Enabled", "noncurrentVersionExpiration": {"noncurrentDays": 30}}
    abort = {"status": "Enabled", "abortIncompleteMultipartUpload": {"daysAfterInitiation": 7}}
    assert violations("s3-lifecycle-expiry", typ, {"rules": [expire, abort]}) == []
    assert violations("s3-lifecycle-expiry", typ, {"rules": [expire]}) == [
        "an enabled rule must abort incomplete multipart uploads"
    ]
    assert (
        len(violations("s3-lifecycle-expiry", typ, {"rules": [{**expire, "status": "Disabled"}, abort]})) == 1
    )


def _deny_plain_http(resources: list[str], condition_value: str = "false") -> str:
    return json.dumps(
        {
            "Statement": [
                {
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": resources,
                    "Condition": {"Bool": {"aws:SecureTransport": condition_value}},
                }
            ]
        }
    )


def test_s3_tls_only() -> None:
    typ = "aws:s3/bucketPolicy:BucketPolicy"
    both = ["arn:aws:s3:::b", "arn:aws:s3:::b/*"]
    assert violations("s3-tls-only", typ, {"policy": _deny_plain_http(both)}) == []
    assert violations("s3-tls-only", typ, {"policy": _deny_plain_http(["arn:aws:s3:::b/*"])}), "objects only"
    assert violations("s3-tls-only", typ, {"policy": _deny_plain_http(both, "true")}), "wrong condition"
    assert violations("s3-tls-only", typ, {"policy": json.dumps({"Statement": []})})


def test_s3_bucket_without_companions_is_refused(production: Recorder) -> None:
    resources = as_policy_resources(production, "aws-prod")
    without_lifecycle = [
        r
        for r in resources
        if r.resource_type != "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
    ]
    found = stack_violations("s3-bucket-complete", without_lifecycle)
    lifecycle = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
    assert found == [f"bucket ws-bucket has no lifecycle rules ({lifecycle})"]


# -- RDS ----------------------------------------------------------------------------------------

RDS = "aws:rds/instance:Instance"
GOOD_DB = {
    "storageEncrypted": True,
    "publiclyAccessible": False,
    "dbSubnetGroupName": "private",
    "backupRetentionPeriod": 7,
    "deletionProtection": True,
}


def test_rds_success() -> None:
    for policy in ("rds-storage-encrypted", "rds-not-public", "rds-backups-retained"):
        assert violations(policy, RDS, GOOD_DB) == [], policy
    assert violations("rds-deletion-protection-in-production", RDS, GOOD_DB, stack="aws-prod") == []


@pytest.mark.parametrize(
    ("policy", "change"),
    [
        ("rds-storage-encrypted", {"storageEncrypted": False}),
        ("rds-not-public", {"publiclyAccessible": True}),
        ("rds-not-public", {"dbSubnetGroupName": None}),
        ("rds-backups-retained", {"backupRetentionPeriod": 0}),
    ],
)
def test_rds_violation(policy: str, change: dict[str, Any]) -> None:
    assert violations(policy, RDS, {**GOOD_DB, **change})


def test_rds_deletion_protection_only_required_in_production() -> None:
    unprotected = {**GOOD_DB, "deletionProtection": False}
    assert violations("rds-deletion-protection-in-production", RDS, unprotected, stack="aws-dev") == []
    assert violations("rds-deletion-protection-in-production", RDS, unprotected, stack="aws-prod") == [
        "deletionProtection must be true in a production stack"
    ]
    config = {"productionStacks": ["aws-dev"]}
    assert violations(
        "rds-deletion-protection-in-production", RDS, unprotected, stack="aws-dev", config=config
    )


# -- EKS ----------------------------------------------------------------------------------------

EKS = "aws:eks/cluster:Cluster"
GOOD_CLUSTER = {
    "encryptionConfig": {"resources": ["secrets"], "provider": {"keyArn": "arn:aws:kms:::key/k"}},
    "vpcConfig": {"endpointPrivateAccess": True, "endpointPublicAccess": False},
    "enabledClusterLogTypes": ["api", "audit", "authenticator"],
}


def test_eks_success() -> None:
    for policy in ("eks-secrets-encrypted", "eks-private-endpoint", "eks-control-plane-logs"):
        assert violations(policy, EKS, GOOD_CLUSTER, stack="aws-prod") == [], policy


def test_eks_secrets_must_be_encrypted() -> None:
    assert violations("eks-secrets-encrypted", EKS, {**GOOD_CLUSTER, "encryptionConfig": None})
    no_key = {"resources": ["secrets"], "provider": {}}
    assert violations("eks-secrets-encrypted", EKS, {**GOOD_CLUSTER, "encryptionConfig": no_key})


def test_eks_public_endpoint() -> None:
    public = {
        "endpointPrivateAccess": True,
        "endpointPublicAccess": True,
        "publicAccessCidrs": ["192.0.2.0/24"],
    }
    assert (
        violations("eks-private-endpoint", EKS, {**GOOD_CLUSTER, "vpcConfig": public}, stack="aws-dev") == []
    )
    assert violations(
        "eks-private-endpoint", EKS, {**GOOD_CLUSTER, "vpcConfig": public}, stack="aws-prod"
    ) == ["vpcConfig.endpointPublicAccess must be false in a production stack"]
    open_to_all = {**public, "publicAccessCidrs": ["0.0.0.0/0"]}
    assert violations(
        "eks-private-endpoint", EKS, {**GOOD_CLUSTER, "vpcConfig": open_to_all}, stack="aws-dev"
    )
    # Unset means EKS's default: public, from anywhere.
    assert violations(
        "eks-private-endpoint", EKS, {**GOOD_CLUSTER, "vpcConfig": {"endpointPrivateAccess": True}}
    )
    assert violations(
        "eks-private-endpoint", EKS, {**GOOD_CLUSTER, "vpcConfig": {"endpointPublicAccess": False}}
    )


def test_eks_audit_logs() -> None:
    assert violations("eks-control-plane-logs", EKS, {**GOOD_CLUSTER, "enabledClusterLogTypes": ["api"]}) == [
        "enabledClusterLogTypes must include audit, authenticator"
    ]


def _node_stack(user_data: str | None) -> list[PolicyResource]:
    lt_props = {"userData": user_data} if user_data is not None else {}
    template = PolicyResource(
        "aws:ec2/launchTemplate:LaunchTemplate",
        lt_props,
        urn("s", "lt", "lt"),
        "lt",
        _options(),
        None,
        None,
        [],
        {},
    )
    group = PolicyResource(
        "aws:eks/nodeGroup:NodeGroup",
        {"launchTemplate": {"id": "lt-1"}},
        urn("s", "ng", "ng"),
        "ng",
        _options(),
        None,
        None,
        [template],
        {"launchTemplate": [template]},
    )
    return [template, group]


def test_eks_nodes_gvisor_success() -> None:
    assert stack_violations("eks-nodes-run-gvisor", _node_stack(encode(node_user_data(GVISOR)))) == []


def test_eks_nodes_gvisor_violations() -> None:
    assert stack_violations("eks-nodes-run-gvisor", _node_stack(None)) == [
        "node group ng: launch template lt has no user data (nothing installs gVisor)"
    ]
    plain = base64.b64encode(b"#!/bin/bash\necho hello\n").decode()
    found = stack_violations("eks-nodes-run-gvisor", _node_stack(plain))
    assert any("missing `runsc`" in f for f in found)
    assert any("no containerd runtime entry" in f for f in found)
    no_template = [
        PolicyResource(
            "aws:eks/nodeGroup:NodeGroup", {}, urn("s", "ng", "ng"), "ng", _options(), None, None, [], {}
        )
    ]
    assert len(stack_violations("eks-nodes-run-gvisor", no_template)) == 1


# -- EC2 ----------------------------------------------------------------------------------------

LT = "aws:ec2/launchTemplate:LaunchTemplate"
GOOD_LT = {
    "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
    "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "true"}}],
    "networkInterfaces": [{"associatePublicIpAddress": "false"}],
}


def test_launch_template_success() -> None:
    for policy in ("ec2-imdsv2-hop-limit-1", "ec2-volumes-encrypted", "ec2-no-public-ip"):
        assert violations(policy, LT, GOOD_LT) == [], policy


@pytest.mark.parametrize(
    ("policy", "change"),
    [
        (
            "ec2-imdsv2-hop-limit-1",
            {"metadataOptions": {"httpTokens": "optional", "httpPutResponseHopLimit": 1}},
        ),
        (
            "ec2-imdsv2-hop-limit-1",
            {"metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 2}},
        ),
        ("ec2-imdsv2-hop-limit-1", {"metadataOptions": None}),
        (
            "ec2-volumes-encrypted",
            {"blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "false"}}]},
        ),
        ("ec2-volumes-encrypted", {"blockDeviceMappings": []}),
        ("ec2-no-public-ip", {"networkInterfaces": [{"associatePublicIpAddress": "true"}]}),
    ],
)
def test_launch_template_violation(policy: str, change: dict[str, Any]) -> None:
    assert violations(policy, LT, {**GOOD_LT, **change})


def test_instances() -> None:
    typ = "aws:ec2/instance:Instance"
    good = {
        "metadataOptions": {"httpTokens": "required", "httpPutResponseHopLimit": 1},
        "rootBlockDevice": {"encrypted": True},
        "associatePublicIpAddress": False,
    }
    for policy in (
        "ec2-instance-imdsv2-hop-limit-1",
        "ec2-instance-volumes-encrypted",
        "ec2-instance-no-public-ip",
    ):
        assert violations(policy, typ, good) == [], policy
    assert violations("ec2-instance-imdsv2-hop-limit-1", typ, {**good, "metadataOptions": {}})
    assert violations("ec2-instance-volumes-encrypted", typ, {**good, "rootBlockDevice": {}})
    assert violations(
        "ec2-instance-volumes-encrypted", typ, {**good, "ebsBlockDevices": [{"deviceName": "/dev/sdf"}]}
    )
    assert violations("ec2-instance-no-public-ip", typ, {**good, "associatePublicIpAddress": True})


def test_security_groups() -> None:
    sg = "aws:ec2/securityGroup:SecurityGroup"
    private = {"ingress": [{"fromPort": 5432, "toPort": 5432, "cidrBlocks": ["10.0.0.0/8"]}]}
    assert violations("ec2-no-internet-ingress", sg, private) == []
    assert violations("ec2-no-internet-ingress", sg, {"egress": [{"cidrBlocks": ["0.0.0.0/0"]}]}) == []
    assert violations(
        "ec2-no-internet-ingress",
        sg,
        {"ingress": [{"fromPort": 22, "toPort": 22, "cidrBlocks": ["0.0.0.0/0"]}]},
    ) == ["ingress on ports 22-22 is open to 0.0.0.0/0"]
    assert violations("ec2-no-internet-ingress", sg, {"ingress": [{"ipv6CidrBlocks": ["::/0"]}]})
    rule = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
    assert violations("ec2-no-internet-ingress-rule", rule, {"referencedSecurityGroupId": "sg-1"}) == []
    assert violations("ec2-no-internet-ingress-rule", rule, {"cidrIpv4": "0.0.0.0/0"})
    old_rule = "aws:ec2/securityGroupRule:SecurityGroupRule"
    assert (
        violations("ec2-no-internet-ingress-rule", old_rule, {"type": "egress", "cidrBlocks": ["0.0.0.0/0"]})
        == []
    )
    assert violations(
        "ec2-no-internet-ingress-rule", old_rule, {"type": "ingress", "cidrBlocks": ["0.0.0.0/0"]}
    )


def test_subnets_and_autoscaling_groups() -> None:
    subnet = "aws:ec2/subnet:Subnet"
    assert violations("ec2-subnet-no-public-ip", subnet, {"mapPublicIpOnLaunch": False}) == []
    assert violations("ec2-subnet-no-public-ip", subnet, {"mapPublicIpOnLaunch": True})
    asg = "aws:autoscaling/group:Group"
    assert violations("autoscaling-launch-template", asg, {"launchTemplate": {"id": "lt-1"}}) == []
    assert violations("autoscaling-launch-template", asg, {"launchConfiguration": "old"})


def test_kms_rotation() -> None:
    key = "aws:kms/key:Key"
    assert violations("kms-key-rotation", key, {"enableKeyRotation": True}) == []
    assert violations("kms-key-rotation", key, {}) == ["enableKeyRotation must be true"]


def test_rules_ignore_other_types() -> None:
    assert violations("kms-key-rotation", "aws:s3/bucket:Bucket", {}) == []


def test_recorded_registration_type_is_used(production: Recorder) -> None:
    # The fixture really holds the environment (guards the pass-everything tests from passing empty).
    assert isinstance(production.one("aws:eks/cluster:Cluster"), Registered)
    assert len(production.resources) > 40


# -- Kubernetes ------------------------------------------------------------------------------------

RUNTIME_CLASS = "kubernetes:node.k8s.io/v1:RuntimeClass"
NAMESPACE = "kubernetes:core/v1:Namespace"
K8S_RULES = (
    "k8s-runtime-class-gvisor",
    "k8s-sandbox-namespace-pod-security",
    "k8s-no-privileged-containers",
    "k8s-no-host-namespaces",
    "k8s-no-host-path",
    "k8s-load-balancer-restricted",
)
SANDBOX_LABELS = {
    "warren.dev/sandbox": "true",
    "pod-security.kubernetes.io/enforce": "baseline",
    "pod-security.kubernetes.io/warn": "restricted",
    "pod-security.kubernetes.io/audit": "restricted",
}
POD_SPEC: dict[str, Any] = {
    "containers": [{"name": "app", "image": "app:1", "securityContext": {"allowPrivilegeEscalation": False}}],
    "volumes": [{"name": "scratch", "emptyDir": {}}],
}


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"isolation": {"pod_security_level": "restricted", "extra_namespaces": ["warren-sandboxes-b"]}},
        {"services": {"enabled": True}},
        {
            "services": {
                "enabled": True,
                "stores": "external",
                "object_store_endpoint": "https://s3.example.com",
            }
        },
        {
            "services": {
                "enabled": True,
                "stores": "external",
                "object_store_endpoint": "https://s3.eu-west-1.amazonaws.com",
                "object_store_credentials": "ambient",
            }
        },
    ],
    ids=[
        "defaults",
        "restricted-two-namespaces",
        "workloads",
        "workloads-external-stores",
        "workloads-ambient",
    ],
)
def test_the_platform_passes_every_kubernetes_policy(config: dict[str, Any]) -> None:
    objects = render(parse_config(config))
    recorder = run_program(
        lambda: WarrenPlatform("warren", WarrenPlatformArgs(kubeconfig="kc", objects=objects))
    )
    checked: set[str] = set()
    for registered in recorder.resources:
        if not registered.typ.startswith("kubernetes:"):
            continue
        for policy in K8S_RULES:
            assert violations(policy, registered.typ, registered.inputs, stack="local") == [], (
                policy,
                registered.name,
            )
        checked.add(registered.typ)
    # The rules saw what they are about: the gVisor RuntimeClass and a sandbox namespace.
    assert {RUNTIME_CLASS, NAMESPACE} <= checked
    assert any(
        (r.inputs["metadata"].get("labels") or {}).get("warren.dev/sandbox") == "true"
        for r in recorder.of_type(NAMESPACE)
    )


def test_runtime_class_must_use_the_gvisor_handler() -> None:
    rule = "k8s-runtime-class-gvisor"
    assert violations(rule, RUNTIME_CLASS, {"metadata": {"name": "gvisor"}, "handler": "runsc"}) == []
    assert violations(rule, RUNTIME_CLASS, {"metadata": {"name": "gvisor"}, "handler": "runc"}) == [
        "handler 'runc' does not run pods under gVisor (allowed: runsc)"
    ]
    assert violations(rule, RUNTIME_CLASS, {"metadata": {"name": "gvisor"}})
    # Nodes that name the runsc handler otherwise are configured through the pack's config.
    config = {"gvisorHandlers": ["gvisor"]}
    assert violations(rule, RUNTIME_CLASS, {"handler": "gvisor"}, config=config) == []
    assert violations(rule, RUNTIME_CLASS, {"handler": "runsc"}, config=config)


def _namespace(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "ns", "labels": labels}}


@pytest.mark.parametrize("level", ["baseline", "restricted"])
def test_sandbox_namespace_pod_security_success(level: str) -> None:
    labels = {**SANDBOX_LABELS, "pod-security.kubernetes.io/enforce": level}
    assert violations("k8s-sandbox-namespace-pod-security", NAMESPACE, _namespace(labels)) == []


def test_sandbox_namespace_pod_security_violations() -> None:
    rule = "k8s-sandbox-namespace-pod-security"
    privileged = {**SANDBOX_LABELS, "pod-security.kubernetes.io/enforce": "privileged"}
    assert violations(rule, NAMESPACE, _namespace(privileged)) == [
        "label pod-security.kubernetes.io/enforce must be baseline or restricted, not 'privileged'"
    ]
    unlabelled = {"warren.dev/sandbox": "true"}
    assert len(violations(rule, NAMESPACE, _namespace(unlabelled))) == 3
    lax_audit = {**SANDBOX_LABELS, "pod-security.kubernetes.io/audit": "baseline"}
    assert violations(rule, NAMESPACE, _namespace(lax_audit)) == [
        "label pod-security.kubernetes.io/audit must be restricted"
    ]
    # Namespaces that hold no sandboxes (warren-system) are not held to this.
    assert violations(rule, NAMESPACE, _namespace({"app.kubernetes.io/part-of": "warren"})) == []
    assert violations(rule, NAMESPACE, {"metadata": {"name": "plain"}}) == []


def _workload(typ: str, spec: dict[str, Any]) -> dict[str, Any]:
    """`spec` placed where a workload of `typ` keeps its pod spec."""
    template = {"metadata": {"labels": {"app": "a"}}, "spec": spec}
    by_type: dict[str, dict[str, Any]] = {
        "kubernetes:core/v1:Pod": {"spec": spec},
        "kubernetes:core/v1:PodTemplate": {"template": template},
        "kubernetes:batch/v1:CronJob": {
            "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": template}}}
        },
    }
    return {"metadata": {"name": "w"}, **by_type.get(typ, {"spec": {"template": template}})}


@pytest.mark.parametrize("typ", WORKLOADS)
def test_workloads_success(typ: str) -> None:
    for rule in ("k8s-no-privileged-containers", "k8s-no-host-namespaces", "k8s-no-host-path"):
        assert violations(rule, typ, _workload(typ, POD_SPEC)) == [], rule


@pytest.mark.parametrize("typ", WORKLOADS)
@pytest.mark.parametrize(
    ("rule", "change", "message"),
    [
        (
            "k8s-no-privileged-containers",
            {"initContainers": [{"name": "init", "securityContext": {"privileged": True}}]},
            "container 'init' must not be privileged (securityContext.privileged)",
        ),
        (
            "k8s-no-host-namespaces",
            {"hostNetwork": True},
            "hostNetwork must not be true (the pod would share the node's namespace)",
        ),
        (
            "k8s-no-host-namespaces",
            {"hostPID": True},
            "hostPID must not be true (the pod would share the node's namespace)",
        ),
        (
            "k8s-no-host-namespaces",
            {"hostIPC": True},
            "hostIPC must not be true (the pod would share the node's namespace)",
        ),
        (
            "k8s-no-host-path",
            {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
            "volume 'root' must not mount a host path",
        ),
    ],
)
def test_workloads_violation(typ: str, rule: str, change: dict[str, Any], message: str) -> None:
    assert violations(rule, typ, _workload(typ, {**POD_SPEC, **change})) == [message]


def test_workload_rules_ignore_other_kinds() -> None:
    host = {"spec": {"hostNetwork": True, "volumes": [{"name": "v", "hostPath": {"path": "/"}}]}}
    assert violations("k8s-no-host-namespaces", "kubernetes:core/v1:Service", host) == []
    assert violations("k8s-no-host-path", "kubernetes:core/v1:ConfigMap", host) == []


def _system_workload(typ: str, name: str, namespace: str, change: dict[str, Any]) -> dict[str, Any]:
    workload = _workload(typ, {**POD_SPEC, **change})
    workload["metadata"] = {"name": name, "namespace": namespace}
    return workload


PRIVILEGED = {"containers": [{"name": "blockd", "securityContext": {"privileged": True}}]}
HOST_PATH = {"volumes": [{"name": "state", "hostPath": {"path": "/var/lib/warren"}}]}
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
STATEFULSET = "kubernetes:apps/v1:StatefulSet"


def test_only_warren_blockd_in_warren_system_may_be_privileged() -> None:
    rule = "k8s-no-privileged-containers"
    assert (
        violations(rule, DAEMONSET, _system_workload(DAEMONSET, "warren-blockd", "warren-system", PRIVILEGED))
        == []
    )
    refused = "container 'blockd' must not be privileged (securityContext.privileged)"
    for typ, name, namespace in (
        (DAEMONSET, "warren-blockd", "default"),  # the name alone is not enough
        (DEPLOYMENT, "warren-blockd", "warren-system"),  # nor another kind of that name
        (DEPLOYMENT, "warren-control", "warren-system"),
        (STATEFULSET, "warren-postgres", "warren-system"),  # a store may mount, not be privileged
    ):
        assert violations(rule, typ, _system_workload(typ, name, namespace, PRIVILEGED)) == [refused], name


def test_only_blockd_and_the_embedded_stores_may_mount_host_paths() -> None:
    rule = "k8s-no-host-path"
    for typ, name in (
        (DAEMONSET, "warren-blockd"),
        (STATEFULSET, "warren-objects"),
        (STATEFULSET, "warren-postgres"),
    ):
        assert violations(rule, typ, _system_workload(typ, name, "warren-system", HOST_PATH)) == [], name
    refused = ["volume 'state' must not mount a host path"]
    assert (
        violations(
            rule, DEPLOYMENT, _system_workload(DEPLOYMENT, "warren-control", "warren-system", HOST_PATH)
        )
        == refused
    )
    assert (
        violations(rule, STATEFULSET, _system_workload(STATEFULSET, "warren-objects", "tenant", HOST_PATH))
        == refused
    )


def test_only_warren_blockd_may_share_the_nodes_pid_namespace_and_no_other() -> None:
    rule = "k8s-no-host-namespaces"
    blockd = _system_workload(DAEMONSET, "warren-blockd", "warren-system", {"hostPID": True})
    assert violations(rule, DAEMONSET, blockd) == []
    shared = "must not be true (the pod would share the node's namespace)"
    for field in ("hostNetwork", "hostIPC"):  # only the PID namespace is granted
        change = {field: True}
        found = violations(
            rule, DAEMONSET, _system_workload(DAEMONSET, "warren-blockd", "warren-system", change)
        )
        assert found == [f"{field} {shared}"]
    for typ, name, namespace in (
        (DAEMONSET, "warren-blockd", "default"),
        (STATEFULSET, "warren-postgres", "warren-system"),
    ):
        found = violations(rule, typ, _system_workload(typ, name, namespace, {"hostPID": True}))
        assert found == [f"hostPID {shared}"], name


SERVICE = "kubernetes:core/v1:Service"


def _load_balancer(ranges: list[str] | None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "LoadBalancer", "selector": {"app": "a"}, "ports": [{"port": 443}]}
    if ranges is not None:
        spec["loadBalancerSourceRanges"] = ranges
    return {"metadata": {"name": "edge", "annotations": annotations or {}}, "spec": spec}


def test_load_balancer_success() -> None:
    rule = "k8s-load-balancer-restricted"
    assert violations(rule, SERVICE, _load_balancer(["192.0.2.0/24", "2001:db8::/32"])) == []
    # Services that are not load balancers are not this rule's business.
    assert violations(rule, SERVICE, {"metadata": {"name": "s"}, "spec": {"selector": {"app": "a"}}}) == []
    assert violations(rule, SERVICE, {"metadata": {"name": "s"}, "spec": {"type": "NodePort"}}) == []


@pytest.mark.parametrize(
    ("service", "message"),
    [
        (_load_balancer(None), "a LoadBalancer Service must name the ranges it admits"),
        (_load_balancer([]), "a LoadBalancer Service must name the ranges it admits"),
        (_load_balancer(["0.0.0.0/0"]), "load balancer source range 0.0.0.0/0 admits the whole internet"),
        (_load_balancer(["10.0.0.0/8", "::/0"]), "load balancer source range ::/0 admits the whole internet"),
        (
            _load_balancer(
                ["10.0.0.0/8"],
                {"service.beta.kubernetes.io/load-balancer-source-ranges": "10.1.0.0/16, 0.0.0.0/0"},
            ),
            "load balancer source range 0.0.0.0/0 admits the whole internet",
        ),
    ],
    ids=["no-ranges", "empty-ranges", "ipv4-everywhere", "ipv6-everywhere", "annotation-everywhere"],
)
def test_load_balancer_violation(service: dict[str, Any], message: str) -> None:
    found = violations("k8s-load-balancer-restricted", SERVICE, service)
    assert len(found) == 1 and found[0].startswith(message), found
