"""AwsSandboxCluster: encrypted secrets, a private API, logs, and gVisor nodes behind IMDSv2."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from conftest import SHA_RUNSC, SHA_SHIM, Recorder
from warren_components import AwsSandboxCluster, AwsSandboxClusterArgs, GvisorBinaries

import pulumi

GVISOR = GvisorBinaries("https://mirror.example/gvisor/x86_64", SHA_RUNSC, SHA_SHIM)
ZONES = ["eu-west-1a", "eu-west-1b"]
CLUSTER = "aws:eks/cluster:Cluster"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"


def args(**overrides: Any) -> AwsSandboxClusterArgs:
    values: dict[str, Any] = {
        "cluster_name": "warren-test",
        "region": "eu-west-1",
        "availability_zones": ZONES,
        "gvisor": GVISOR,
    }
    return AwsSandboxClusterArgs(**{**values, **overrides})


@pytest.fixture(scope="module")
def recorder() -> Recorder:
    from conftest import run_program

    return run_program(lambda: AwsSandboxCluster("c", args()))


def test_secrets_are_encrypted_with_a_rotating_key_of_their_own(recorder: Recorder) -> None:
    cluster = recorder.one(CLUSTER).inputs
    encryption = cluster["encryptionConfig"]
    assert encryption["resources"] == ["secrets"]
    key = recorder.one("aws:kms/key:Key")
    assert encryption["provider"]["keyArn"] == key.arn
    assert key.inputs["enableKeyRotation"] is True
    # The cluster's role may use that key (and the policy names no other resource).
    role_policy = recorder.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"]
    assert f'"Resource": "{key.arn}"' in role_policy


def test_api_endpoint_is_private_by_default(recorder: Recorder) -> None:
    vpc = recorder.one(CLUSTER).inputs["vpcConfig"]
    assert vpc["endpointPrivateAccess"] is True
    assert vpc["endpointPublicAccess"] is False
    assert "publicAccessCidrs" not in vpc


def test_control_plane_sits_in_private_subnets(recorder: Recorder) -> None:
    vpc = recorder.one(CLUSTER).inputs["vpcConfig"]
    subnets = [recorder.by_id(i) for i in vpc["subnetIds"]]
    assert {s.name for s in subnets} == {f"c-net-private-{z}" for z in ZONES}


def test_every_control_plane_log_is_on_and_kept(recorder: Recorder) -> None:
    cluster = recorder.one(CLUSTER).inputs
    assert set(cluster["enabledClusterLogTypes"]) == {
        "api",
        "audit",
        "authenticator",
        "controllerManager",
        "scheduler",
    }
    group = recorder.one("aws:cloudwatch/logGroup:LogGroup").inputs
    assert group["name"] == "/aws/eks/warren-test/cluster"
    assert group["retentionInDays"] == 90
    assert cluster["accessConfig"]["authenticationMode"] == "API"


def test_node_launch_template_requires_imdsv2_with_one_hop(recorder: Recorder) -> None:
    options = recorder.one(LAUNCH_TEMPLATE).inputs["metadataOptions"]
    assert options["httpTokens"] == "required"
    assert options["httpPutResponseHopLimit"] == 1
    assert options["httpEndpoint"] == "enabled"


def test_node_volumes_are_encrypted(recorder: Recorder) -> None:
    mappings = recorder.one(LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
    assert mappings, "no root volume named"
    assert all(m["ebs"]["encrypted"] == "true" for m in mappings)


def test_node_user_data_installs_gvisor(recorder: Recorder) -> None:
    user_data = base64.b64decode(recorder.one(LAUNCH_TEMPLATE).inputs["userData"]).decode()
    assert "containerd-shim-runsc-v1" in user_data
    assert f"{SHA_RUNSC}  runsc" in user_data
    node_config = yaml.safe_load(
        user_data.split("Content-Type: application/node.eks.aws\n\n", 1)[1].split("\n--", 1)[0]
    )
    assert 'runtime_type = "io.containerd.runsc.v1"' in node_config["spec"]["containerd"]["config"]
    assert "runtimes.runsc]" in node_config["spec"]["containerd"]["config"]


def test_node_group_launches_from_the_template_in_private_subnets(recorder: Recorder) -> None:
    group = recorder.one(NODE_GROUP).inputs
    template = recorder.one(LAUNCH_TEMPLATE)
    assert group["launchTemplate"]["id"] == template.resource_id
    assert {recorder.by_id(i).name for i in group["subnetIds"]} == {f"c-net-private-{z}" for z in ZONES}
    assert group["amiType"].startswith("AL2023_x86_64")
    assert group["labels"]["warren.dev/runtime-handler"] == "runsc"


def test_nodes_carry_the_cluster_group_and_their_own(recorder: Recorder) -> None:
    groups = recorder.one(LAUNCH_TEMPLATE).inputs["vpcSecurityGroupIds"]
    node_group = recorder.one("aws:ec2/securityGroup:SecurityGroup")
    assert groups == ["sg-cluster", node_group.resource_id]
    assert not node_group.inputs.get("ingress")


def test_vpc_cni_enforces_network_policy(recorder: Recorder) -> None:
    addons = {r.inputs["addonName"]: r.inputs for r in recorder.of_type("aws:eks/addon:Addon")}
    assert '"enableNetworkPolicy": "true"' in addons["vpc-cni"]["configurationValues"]


def test_pods_can_get_an_identity_through_the_pod_identity_agent(recorder: Recorder) -> None:
    addons = {r.inputs["addonName"]: r.inputs for r in recorder.of_type("aws:eks/addon:Addon")}
    assert set(addons) == {"vpc-cni", "eks-pod-identity-agent"}
    assert addons["eks-pod-identity-agent"]["clusterName"] == "warren-test"


def test_kubeconfig_authenticates_through_aws_cli(run: Callable[..., Recorder]) -> None:
    seen: dict[str, str] = {}

    def program() -> pulumi.Output[None]:
        cluster = AwsSandboxCluster("c", args())
        return cluster.kubeconfig.apply(lambda text: seen.update(kubeconfig=text))

    run(program)
    config = yaml.safe_load(seen["kubeconfig"])
    assert config["clusters"][0]["cluster"]["server"] == "https://mock.eks.example"
    user = config["users"][0]["user"]
    assert "token" not in user
    assert user["exec"]["command"] == "aws"
    assert user["exec"]["args"][:4] == ["eks", "get-token", "--cluster-name", "warren-test"]


def test_public_endpoint_only_with_named_ranges(run: Callable[..., Recorder]) -> None:
    recorder = run(
        lambda: AwsSandboxCluster(
            "c", args(endpoint_public_access=True, public_access_cidrs=["192.0.2.0/24"])
        )
    )
    vpc = recorder.one(CLUSTER).inputs["vpcConfig"]
    assert vpc["endpointPublicAccess"] is True
    assert vpc["publicAccessCidrs"] == ["192.0.2.0/24"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"endpoint_public_access": True}, "name the ranges"),
        ({"endpoint_public_access": True, "public_access_cidrs": ["0.0.0.0/0"]}, "whole internet"),
        ({"public_access_cidrs": ["192.0.2.0/24"]}, "endpoint_public_access is off"),
        ({"node_min_size": 3, "node_desired_size": 2}, "min <= desired <= max"),
    ],
)
def test_unsafe_or_inconsistent_args_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        args(**overrides)
