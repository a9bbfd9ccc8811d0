"""KvmHostPool: metal, private, IMDSv2 with one hop, encrypted, no ingress from the internet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import Recorder
from warren_components import IngressFrom, KvmHostPool, KvmHostPoolArgs

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


def args(**overrides: Any) -> KvmHostPoolArgs:
    values: dict[str, Any] = {"vpc_id": "vpc-1", "subnet_ids": ["subnet-a", "subnet-b"], "ami_id": "ami-1"}
    return KvmHostPoolArgs(**{**values, **overrides})


@pytest.fixture
def pool(run: Callable[..., Recorder]) -> Recorder:
    return run(lambda: KvmHostPool("kvm", args(ingress=[IngressFrom("sg-nodes", 7070, "forkd")])))


def test_hosts_get_no_public_address(pool: Recorder) -> None:
    interfaces = pool.one(LAUNCH_TEMPLATE).inputs["networkInterfaces"]
    assert [i["associatePublicIpAddress"] for i in interfaces] == ["false"]


def test_metadata_needs_imdsv2_with_one_hop(pool: Recorder) -> None:
    options = pool.one(LAUNCH_TEMPLATE).inputs["metadataOptions"]
    assert options["httpTokens"] == "required"
    assert options["httpPutResponseHopLimit"] == 1


def test_volumes_are_encrypted(pool: Recorder) -> None:
    mappings = pool.one(LAUNCH_TEMPLATE).inputs["blockDeviceMappings"]
    assert mappings and all(m["ebs"]["encrypted"] == "true" for m in mappings)


def test_metal_hosts_in_the_given_private_subnets(pool: Recorder) -> None:
    template = pool.one(LAUNCH_TEMPLATE)
    assert template.inputs["instanceType"] == "c7i.metal-24xl"
    group = pool.one("aws:autoscaling/group:Group").inputs
    assert group["vpcZoneIdentifiers"] == ["subnet-a", "subnet-b"]
    assert group["launchTemplate"]["id"] == template.resource_id


def test_no_ingress_from_the_internet_only_from_named_groups(pool: Recorder) -> None:
    group = pool.one("aws:ec2/securityGroup:SecurityGroup")
    assert not group.inputs.get("ingress")
    assert pool.one(LAUNCH_TEMPLATE).inputs["networkInterfaces"][0]["securityGroups"] == [group.resource_id]
    rules = [r.inputs for r in pool.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")]
    assert rules == [
        {
            "securityGroupId": group.resource_id,
            "referencedSecurityGroupId": "sg-nodes",
            "ipProtocol": "tcp",
            "fromPort": 7070,
            "toPort": 7070,
            "description": "forkd",
        }
    ]


def test_no_ingress_at_all_by_default(run: Callable[..., Recorder]) -> None:
    recorder = run(lambda: KvmHostPool("kvm", args()))
    assert not recorder.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"instance_type": "c7i.24xlarge"}, "bare-metal"),
        ({"min_size": 2, "desired_size": 1}, "min <= desired"),
    ],
)
def test_bad_args_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        args(**overrides)
