"""KvmHostPool: bare-metal EC2 hosts for warren-forkd's microVMs.

forkd needs /dev/kvm with hardware virtualisation, which EC2 offers on `.metal` types only.
The hosts live in private subnets with no public address; their security group admits nothing
from the internet, only the named groups (the cluster's nodes) on forkd's ports. Instance
metadata needs IMDSv2 tokens with a hop limit of 1 (a guest or container one hop further
cannot reach the host role's credentials), and every volume is encrypted. Operators reach
the hosts through Session Manager; no SSH key is installed.

Each host installs and starts warren-forkd at first boot from the extracted bundle (`forkd`,
see forkd_user_data.py: the same unit as the Ansible `forkd` role); its API is a unix socket
on the host (`forkd_socket`), reached by what runs there.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi_aws as aws

import pulumi
from warren_components.forkd_user_data import ForkdHost, combine, install_script
from warren_components.iam import assume_role_policy, managed_policy


@dataclass(frozen=True)
class IngressFrom:
    """TCP `port` admitted from members of `security_group_id`."""

    security_group_id: pulumi.Input[str]
    port: int
    description: str


@dataclass(frozen=True)
class KvmHostPoolArgs:
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]
    ami_id: pulumi.Input[str]
    instance_type: str = "c7i.metal-24xl"
    min_size: int = 1
    desired_size: int = 1
    max_size: int = 2
    root_volume_gib: int = 200
    root_device_name: str = "/dev/xvda"  # Amazon Linux; Debian and Ubuntu AMIs use other names
    ingress: Sequence[IngressFrom] = ()
    # warren-forkd from the bundle at first boot; None: the hosts get only user_data.
    forkd: ForkdHost | None = field(default_factory=ForkdHost)
    user_data: str | None = None  # plain text, run after forkd's script; encoded here

    def __post_init__(self) -> None:
        if ".metal" not in self.instance_type:
            raise ValueError(
                f"instance_type {self.instance_type!r} is not a bare-metal type (`.metal`): "
                "other EC2 types offer no /dev/kvm for forkd"
            )
        if not 0 <= self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                "sizes must satisfy min <= desired <= max "
                f"(got {self.min_size}, {self.desired_size}, {self.max_size})"
            )
        for rule in self.ingress:
            if not 0 < rule.port < 65536:  # noqa: PLR2004
                raise ValueError(f"ingress port {rule.port} is not a TCP port")


def host_user_data(args: KvmHostPoolArgs) -> str | None:
    """forkd's install script, then the caller's user data (one MIME multipart when both)."""
    scripts = [install_script(args.forkd)] if args.forkd else []
    if args.user_data:
        scripts.append(args.user_data)
    return combine(*scripts) if scripts else None


class KvmHostPool(pulumi.ComponentResource):
    security_group_id: pulumi.Output[str]
    autoscaling_group_name: pulumi.Output[str]
    role_name: pulumi.Output[str]
    # warren-forkd's API socket on each host and the accelerator asked for ("" without forkd).
    forkd_socket: pulumi.Output[str]
    forkd_accel: pulumi.Output[str]

    def __init__(self, name: str, args: KvmHostPoolArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warren:kvm_host_pool:KvmHostPool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        group = aws.ec2.SecurityGroup(
            f"{name}-hosts",
            vpc_id=args.vpc_id,
            description="Warren KVM hosts: no ingress but from named groups",
            # Outbound stays open: Session Manager, package mirrors and object storage via NAT.
            egress=[
                aws.ec2.SecurityGroupEgressArgs(
                    protocol="-1",
                    from_port=0,
                    to_port=0,
                    cidr_blocks=["0.0.0.0/0"],
                    ipv6_cidr_blocks=["::/0"],
                )
            ],
            tags={"Name": f"{name}-hosts"},
            opts=child,
        )
        for index, rule in enumerate(args.ingress):
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-ingress-{index}",
                security_group_id=group.id,
                referenced_security_group_id=rule.security_group_id,
                ip_protocol="tcp",
                from_port=rule.port,
                to_port=rule.port,
                description=rule.description,
                opts=child,
            )

        role = aws.iam.Role(
            f"{name}-host", assume_role_policy=assume_role_policy("ec2.amazonaws.com"), opts=child
        )
        aws.iam.RolePolicyAttachment(
            f"{name}-host-ssm",
            role=role.name,
            policy_arn=managed_policy("AmazonSSMManagedInstanceCore"),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(f"{name}-host", role=role.name, opts=child)

        template = aws.ec2.LaunchTemplate(
            f"{name}-hosts",
            description="Warren KVM hosts",
            image_id=args.ami_id,
            instance_type=args.instance_type,
            update_default_version=True,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=1,
                instance_metadata_tags="disabled",
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=args.root_device_name,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=args.root_volume_gib,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            network_interfaces=[
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    device_index=0,
                    associate_public_ip_address="false",
                    security_groups=[group.id],
                    delete_on_termination="true",
                )
            ],
            user_data=base64.b64encode(user_data.encode()).decode()
            if (user_data := host_user_data(args))
            else None,
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags={"Name": f"{name}-host"})
                for kind in ("instance", "volume")
            ],
            opts=child,
        )

        asg = aws.autoscaling.Group(
            f"{name}-hosts",
            vpc_zone_identifiers=args.subnet_ids,
            min_size=args.min_size,
            desired_capacity=args.desired_size,
            max_size=args.max_size,
            launch_template=aws.autoscaling.GroupLaunchTemplateArgs(
                id=template.id, version=template.latest_version.apply(str)
            ),
            health_check_type="EC2",
            # A metal host takes minutes to boot; replacing it on a slow check loses its VMs.
            health_check_grace_period=900,
            tags=[
                aws.autoscaling.GroupTagArgs(
                    key="warren.dev/role", value="kvm-host", propagate_at_launch=True
                )
            ],
            opts=child,
        )

        self.security_group_id = group.id
        self.autoscaling_group_name = asg.name
        self.role_name = role.name
        self.forkd_socket = pulumi.Output.from_input(args.forkd.socket if args.forkd else "")
        self.forkd_accel = pulumi.Output.from_input(args.forkd.accel if args.forkd else "")
        self.register_outputs(
            {
                "security_group_id": self.security_group_id,
                "autoscaling_group_name": self.autoscaling_group_name,
                "role_name": self.role_name,
                "forkd_socket": self.forkd_socket,
                "forkd_accel": self.forkd_accel,
            }
        )
