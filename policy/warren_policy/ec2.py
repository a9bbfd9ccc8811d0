"""EC2: IMDSv2 with hop limit 1, encrypted volumes, no public addresses, no ingress from the internet."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import ResourceValidationArgs

from warren_policy.props import get, is_internet, is_true, items
from warren_policy.rules import resource_rule

LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
INSTANCE = "aws:ec2/instance:Instance"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
SECURITY_GROUP_RULE = "aws:ec2/securityGroupRule:SecurityGroupRule"
INGRESS_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
SUBNET = "aws:ec2/subnet:Subnet"
AUTOSCALING_GROUP = "aws:autoscaling/group:Group"


def _metadata(options: Any) -> list[str]:
    messages = []
    if get(options, "httpTokens") != "required":
        messages.append("metadataOptions.httpTokens must be required (IMDSv2 only)")
    if get(options, "httpPutResponseHopLimit") != 1:
        messages.append(
            "metadataOptions.httpPutResponseHopLimit must be 1 (containers and guests cannot reach it)"
        )
    return messages


def _launch_template_imds(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    return _metadata(props.get("metadataOptions"))


def _instance_imds(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    return _metadata(props.get("metadataOptions"))


def _launch_template_volumes(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    mappings = items(props.get("blockDeviceMappings"))
    if not mappings:
        return ["blockDeviceMappings must name the root volume, encrypted (the AMI's default may not be)"]
    return [
        f"volume {get(m, 'deviceName')} must be encrypted"
        for m in mappings
        if get(m, "ebs") is not None and not is_true(get(m, "ebs", "encrypted"))
    ]


def _instance_volumes(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    messages = []
    if not is_true(get(props, "rootBlockDevice", "encrypted")):
        messages.append("rootBlockDevice.encrypted must be true")
    messages += [
        f"volume {get(d, 'deviceName')} must be encrypted"
        for d in items(props.get("ebsBlockDevices"))
        if not is_true(get(d, "encrypted"))
    ]
    return messages


def _launch_template_no_public_ip(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    return [
        "networkInterfaces must not associate a public IP address"
        for interface in items(props.get("networkInterfaces"))
        if is_true(get(interface, "associatePublicIpAddress"))
    ]


def _instance_no_public_ip(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    return (
        ["associatePublicIpAddress must not be true"]
        if is_true(props.get("associatePublicIpAddress"))
        else []
    )


def _subnet_no_public_ip(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    if is_true(props.get("mapPublicIpOnLaunch")):
        return [
            "mapPublicIpOnLaunch must be false (NAT gateways and load balancers bring their own addresses)"
        ]
    return []


def _open_ranges(rule: Any) -> list[str]:
    ranges = [*items(get(rule, "cidrBlocks")), *items(get(rule, "ipv6CidrBlocks"))]
    ranges += [get(rule, "cidrIpv4"), get(rule, "cidrIpv6")]
    return [str(cidr) for cidr in ranges if is_internet(cidr)]


def _group_ingress(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    return [
        f"ingress on ports {get(rule, 'fromPort')}-{get(rule, 'toPort')} is open to {cidr}"
        for rule in items(props.get("ingress"))
        for cidr in _open_ranges(rule)
    ]


def _rule_ingress(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    if props.get("type", "ingress") != "ingress":  # aws:ec2/securityGroupRule carries a type
        return []
    return [f"ingress is open to {cidr}" for cidr in _open_ranges(props)]


def _asg_launch_template(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    if props.get("launchTemplate") or get(props, "mixedInstancesPolicy", "launchTemplate"):
        return []
    return ["autoscaling groups must launch from a launch template (where IMDSv2 and encryption are set)"]


POLICIES = [
    resource_rule(
        "ec2-imdsv2-hop-limit-1",
        "Instance metadata needs IMDSv2 tokens and answers one hop only.",
        (LAUNCH_TEMPLATE,),
        _launch_template_imds,
    ),
    resource_rule(
        "ec2-instance-imdsv2-hop-limit-1",
        "Instances need IMDSv2 tokens with a hop limit of 1.",
        (INSTANCE,),
        _instance_imds,
    ),
    resource_rule(
        "ec2-volumes-encrypted",
        "Launch template volumes are encrypted.",
        (LAUNCH_TEMPLATE,),
        _launch_template_volumes,
    ),
    resource_rule(
        "ec2-instance-volumes-encrypted", "Instance volumes are encrypted.", (INSTANCE,), _instance_volumes
    ),
    resource_rule(
        "ec2-no-public-ip",
        "Launch templates give no interface a public address.",
        (LAUNCH_TEMPLATE,),
        _launch_template_no_public_ip,
    ),
    resource_rule(
        "ec2-instance-no-public-ip", "Instances get no public address.", (INSTANCE,), _instance_no_public_ip
    ),
    resource_rule(
        "ec2-subnet-no-public-ip", "Subnets assign no public addresses.", (SUBNET,), _subnet_no_public_ip
    ),
    resource_rule(
        "ec2-no-internet-ingress",
        "No security group admits traffic from 0.0.0.0/0 or ::/0.",
        (SECURITY_GROUP,),
        _group_ingress,
    ),
    resource_rule(
        "ec2-no-internet-ingress-rule",
        "No security group rule admits traffic from 0.0.0.0/0 or ::/0.",
        (SECURITY_GROUP_RULE, INGRESS_RULE),
        _rule_ingress,
    ),
    resource_rule(
        "autoscaling-launch-template",
        "Autoscaling groups launch from launch templates.",
        (AUTOSCALING_GROUP,),
        _asg_launch_template,
    ),
]
