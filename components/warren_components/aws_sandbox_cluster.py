"""AwsSandboxCluster: an EKS cluster whose nodes run sandboxes under gVisor.

Built from plain pulumi_aws resources (no pulumi_eks or awsx: those need Node.js).
- The network (network.py): private subnets for nodes, public ones only for NAT.
- The control plane: private endpoint always on, public endpoint off unless asked for (and
  then only from named ranges); Kubernetes secrets envelope-encrypted with a KMS key of its
  own; every control plane log type sent to a log group with a retention.
- One managed node group whose launch template installs gVisor (node_user_data.py), requires
  IMDSv2 with a hop limit of 1 (a pod, one hop further, cannot reach the metadata service
  and the node role's credentials), and encrypts the root volume.
- The VPC CNI add-on with network policy enforcement on, so the egress floor's NetworkPolicy
  is enforced rather than merely stored.
- The EKS Pod Identity agent add-on, through which Warren's own pods get their AWS identity
  (ObjectStoreAccess) without any key; the node role's managed policy lets the agent ask
  for it. Sandbox pods cannot reach the agent (its link-local address is in the egress
  floor's blocked ranges), and none of their service accounts has an association.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pulumi_aws as aws
import yaml

import pulumi
from warren_components.iam import assume_role_policy, managed_policy
from warren_components.network import Network, NetworkArgs
from warren_components.node_user_data import GvisorBinaries, encode, node_user_data

CONTROL_PLANE_LOGS = ("api", "audit", "authenticator", "controllerManager", "scheduler")
NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonSSMManagedInstanceCore",  # operators reach nodes through Session Manager, not SSH
)


@dataclass(frozen=True)
class AwsSandboxClusterArgs:
    cluster_name: str
    region: str
    availability_zones: Sequence[str]
    gvisor: GvisorBinaries
    vpc_cidr: str = "10.40.0.0/16"
    kubernetes_version: str = "1.34"
    endpoint_public_access: bool = False
    public_access_cidrs: Sequence[str] = ()
    nat_gateway_per_zone: bool = True
    node_instance_types: Sequence[str] = ("m7i.xlarge",)
    node_min_size: int = 2
    node_desired_size: int = 2
    node_max_size: int = 6
    node_disk_gib: int = 100
    node_capacity_type: Literal["ON_DEMAND", "SPOT"] = "ON_DEMAND"
    runtime_handler: str = "runsc"  # the RuntimeClass handler warren renders (isolation.runtime_handler)
    containerd_config_version: Literal[2, 3] = 3  # 3: containerd 2.x, on the AL2023 AMIs for 1.33 and later
    log_retention_days: int = 90
    node_labels: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.endpoint_public_access:
            if not self.public_access_cidrs:
                raise ValueError(
                    "endpoint_public_access is on but public_access_cidrs is empty: name the ranges "
                    "that may reach the API server"
                )
            for cidr in self.public_access_cidrs:
                if ipaddress.ip_network(cidr, strict=True).prefixlen == 0:
                    raise ValueError(
                        f"public_access_cidrs: {cidr} opens the API server to the whole internet"
                    )
        elif self.public_access_cidrs:
            raise ValueError("public_access_cidrs is set but endpoint_public_access is off")
        if not 0 <= self.node_min_size <= self.node_desired_size <= self.node_max_size:
            raise ValueError(
                f"node sizes must satisfy min <= desired <= max (got {self.node_min_size}, "
                f"{self.node_desired_size}, {self.node_max_size})"
            )


def kubeconfig_for(name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token` (no long-lived credential in it)."""
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "aws",
            "args": ["eks", "get-token", "--cluster-name", name, "--region", region, "--output", "json"],
            "interactiveMode": "Never",
        }
    }
    config: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": endpoint, "certificate-authority-data": ca_data}}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    return yaml.safe_dump(config, sort_keys=False)


class AwsSandboxCluster(pulumi.ComponentResource):
    cluster_name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    node_security_group_id: pulumi.Output[str]
    cluster_security_group_id: pulumi.Output[str]
    secrets_key_arn: pulumi.Output[str]

    def __init__(
        self, name: str, args: AwsSandboxClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("warren:aws_sandbox_cluster:AwsSandboxCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        network = Network(
            f"{name}-net",
            NetworkArgs(
                cidr=args.vpc_cidr,
                availability_zones=args.availability_zones,
                cluster_name=args.cluster_name,
                nat_gateway_per_zone=args.nat_gateway_per_zone,
            ),
            opts=child,
        )

        # Envelope encryption of Kubernetes secrets, with a key used for nothing else.
        secrets_key = aws.kms.Key(
            f"{name}-secrets",
            description=f"EKS secrets encryption for {args.cluster_name}",
            enable_key_rotation=True,
            deletion_window_in_days=30,
            opts=child,
        )
        aws.kms.Alias(
            f"{name}-secrets",
            name=f"alias/{args.cluster_name}-secrets",
            target_key_id=secrets_key.id,
            opts=child,
        )

        cluster_role = aws.iam.Role(
            f"{name}-cluster", assume_role_policy=assume_role_policy("eks.amazonaws.com"), opts=child
        )
        cluster_policy = aws.iam.RolePolicyAttachment(
            f"{name}-cluster",
            role=cluster_role.name,
            policy_arn=managed_policy("AmazonEKSClusterPolicy"),
            opts=child,
        )
        key_use = aws.iam.RolePolicy(
            f"{name}-cluster-secrets-key",
            role=cluster_role.id,
            policy=secrets_key.arn.apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Action": ["kms:Encrypt", "kms:Decrypt", "kms:ListGrants", "kms:DescribeKey"],
                                "Resource": arn,
                            }
                        ],
                    }
                )
            ),
            opts=child,
        )

        # Created before the cluster so the retention applies from the first line EKS writes.
        logs = aws.cloudwatch.LogGroup(
            f"{name}-control-plane",
            name=f"/aws/eks/{args.cluster_name}/cluster",
            retention_in_days=args.log_retention_days,
            opts=child,
        )

        cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=args.kubernetes_version,
            role_arn=cluster_role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=network.private_subnet_ids,
                endpoint_private_access=True,
                endpoint_public_access=args.endpoint_public_access,
                public_access_cidrs=list(args.public_access_cidrs) if args.endpoint_public_access else None,
            ),
            encryption_config=aws.eks.ClusterEncryptionConfigArgs(
                provider=aws.eks.ClusterEncryptionConfigProviderArgs(key_arn=secrets_key.arn),
                resources=["secrets"],
            ),
            enabled_cluster_log_types=list(CONTROL_PLANE_LOGS),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API",  # access entries only; no aws-auth ConfigMap to drift
                bootstrap_cluster_creator_admin_permissions=True,
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[cluster_policy, key_use, logs]),
        )
        cluster_sg_id = cluster.vpc_config.apply(lambda vpc: vpc.cluster_security_group_id or "")

        # The nodes' own group: no rules (EKS's cluster group carries node traffic); it exists so
        # that other groups (the database's) can admit the nodes and nothing else.
        node_sg = aws.ec2.SecurityGroup(
            f"{name}-nodes",
            vpc_id=network.vpc_id,
            description=f"Warren sandbox nodes of {args.cluster_name}",
            tags={"Name": f"{args.cluster_name}-nodes"},
            opts=child,
        )

        node_role = aws.iam.Role(
            f"{name}-node", assume_role_policy=assume_role_policy("ec2.amazonaws.com"), opts=child
        )
        node_policies = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{policy}", role=node_role.name, policy_arn=managed_policy(policy), opts=child
            )
            for policy in NODE_POLICIES
        ]

        launch_template = aws.ec2.LaunchTemplate(
            f"{name}-nodes",
            description=f"Warren gVisor nodes of {args.cluster_name}",
            update_default_version=True,
            user_data=encode(
                node_user_data(
                    args.gvisor,
                    handler=args.runtime_handler,
                    containerd_config_version=args.containerd_config_version,
                )
            ),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(
                http_endpoint="enabled",
                http_tokens="required",
                http_put_response_hop_limit=1,
                instance_metadata_tags="disabled",
            ),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name="/dev/xvda",
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=args.node_disk_gib,
                        volume_type="gp3",
                        encrypted="true",
                        delete_on_termination="true",
                    ),
                )
            ],
            # Naming groups here replaces EKS's default, so the cluster group is named too.
            vpc_security_group_ids=[cluster_sg_id, node_sg.id],
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(
                    resource_type=kind, tags={"Name": f"{args.cluster_name}-node"}
                )
                for kind in ("instance", "volume")
            ],
            opts=child,
        )

        aws.eks.NodeGroup(
            f"{name}-nodes",
            cluster_name=cluster.name,
            node_role_arn=node_role.arn,
            subnet_ids=network.private_subnet_ids,
            ami_type="AL2023_x86_64_STANDARD",  # nodeadm user data; x86_64 to match the gVisor build
            capacity_type=args.node_capacity_type,
            instance_types=list(args.node_instance_types),
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                min_size=args.node_min_size, desired_size=args.node_desired_size, max_size=args.node_max_size
            ),
            update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=launch_template.id, version=launch_template.latest_version.apply(str)
            ),
            labels={"warren.dev/runtime-handler": args.runtime_handler, **args.node_labels},
            opts=pulumi.ResourceOptions(parent=self, depends_on=node_policies),
        )

        # Without this the VPC CNI stores NetworkPolicies and enforces none of them.
        aws.eks.Addon(
            f"{name}-vpc-cni",
            cluster_name=cluster.name,
            addon_name="vpc-cni",
            configuration_values=json.dumps({"enableNetworkPolicy": "true"}),
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            opts=child,
        )
        aws.eks.Addon(
            f"{name}-pod-identity",
            cluster_name=cluster.name,
            addon_name="eks-pod-identity-agent",
            resolve_conflicts_on_create="OVERWRITE",
            resolve_conflicts_on_update="PRESERVE",
            opts=child,
        )

        self.cluster_name = cluster.name
        self.kubeconfig = pulumi.Output.all(
            cluster.name, cluster.endpoint, cluster.certificate_authority.apply(lambda ca: ca.data or "")
        ).apply(lambda values: kubeconfig_for(values[0], values[1], values[2], args.region))
        self.vpc_id = network.vpc_id
        self.private_subnet_ids = network.private_subnet_ids
        self.node_security_group_id = node_sg.id
        self.cluster_security_group_id = cluster_sg_id
        self.secrets_key_arn = secrets_key.arn
        self.register_outputs(
            {
                "cluster_name": self.cluster_name,
                "kubeconfig": self.kubeconfig,
                "vpc_id": self.vpc_id,
                "private_subnet_ids": self.private_subnet_ids,
                "node_security_group_id": self.node_security_group_id,
                "cluster_security_group_id": self.cluster_security_group_id,
                "secrets_key_arn": self.secrets_key_arn,
            }
        )
