"""Network: the VPC a Warren environment lives in.

Nodes, KVM hosts and the database sit in private subnets, one per availability zone; public
subnets hold only NAT gateways (and load balancers, when one is added). Nothing launched in
any subnet gets a public address by default, and the VPC's default security group is emptied
so a resource that forgets to name a group gets no traffic at all.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi_aws as aws

import pulumi

MIN_ZONES = 2  # EKS needs subnets in two zones at least
MAX_ZONES = 4  # the address plan below has room for four


@dataclass(frozen=True)
class SubnetPlan:
    private: list[str]
    public: list[str]


def plan_subnets(cidr: str, zones: int) -> SubnetPlan:
    """Split the VPC range: the first eighths are private subnets (pods take VPC addresses with
    the VPC CNI, so these are large), and /24-sized slices of the last eighth are public."""
    network = ipaddress.ip_network(cidr, strict=True)
    if not isinstance(network, ipaddress.IPv4Network) or not 16 <= network.prefixlen <= 20:  # noqa: PLR2004
        raise ValueError(f"VPC range {cidr!r} must be an IPv4 network from /16 to /20")
    if not MIN_ZONES <= zones <= MAX_ZONES:
        raise ValueError(f"{zones} availability zones given: use {MIN_ZONES} to {MAX_ZONES}")
    eighths = list(network.subnets(prefixlen_diff=3))
    public = list(eighths[-1].subnets(new_prefix=network.prefixlen + 8))
    return SubnetPlan(
        private=[str(eighths[i]) for i in range(zones)],
        public=[str(public[i]) for i in range(zones)],
    )


@dataclass(frozen=True)
class NetworkArgs:
    cidr: str
    availability_zones: Sequence[str]
    cluster_name: str  # subnets are tagged for this EKS cluster's load balancer controller
    nat_gateway_per_zone: bool = True  # False: one NAT gateway (cheaper, one zone's outage cuts egress)


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    public_subnet_ids: pulumi.Output[list[str]]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warren:network:Network", name, None, opts)
        plan = plan_subnets(args.cidr, len(args.availability_zones))
        child = pulumi.ResourceOptions(parent=self)

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=args.cidr,
            enable_dns_hostnames=True,  # EKS nodes and the private API endpoint need DNS names
            enable_dns_support=True,
            tags={"Name": name},
            opts=child,
        )
        # Managing the default group removes its rules: nothing may rely on it.
        aws.ec2.DefaultSecurityGroup(
            f"{name}-default-sg", vpc_id=vpc.id, tags={"Name": f"{name}-default-unused"}, opts=child
        )

        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags={"Name": name}, opts=child)
        public_routes = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags={"Name": f"{name}-public"},
            opts=child,
        )

        public_subnets: list[aws.ec2.Subnet] = []
        for zone, cidr in zip(args.availability_zones, plan.public, strict=True):
            subnet = aws.ec2.Subnet(
                f"{name}-public-{zone}",
                vpc_id=vpc.id,
                cidr_block=cidr,
                availability_zone=zone,
                map_public_ip_on_launch=False,  # NAT gateways and load balancers bring their own
                # Where an internet-facing load balancer of the cluster's goes (WarrenEdge).
                tags={
                    "Name": f"{name}-public-{zone}",
                    "kubernetes.io/role/elb": "1",
                    f"kubernetes.io/cluster/{args.cluster_name}": "shared",
                },
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{zone}", subnet_id=subnet.id, route_table_id=public_routes.id, opts=child
            )
            public_subnets.append(subnet)

        nat_zones = args.availability_zones if args.nat_gateway_per_zone else args.availability_zones[:1]
        nats: list[aws.ec2.NatGateway] = []
        for zone, subnet in zip(nat_zones, public_subnets, strict=False):
            eip = aws.ec2.Eip(
                f"{name}-nat-{zone}", domain="vpc", tags={"Name": f"{name}-nat-{zone}"}, opts=child
            )
            nats.append(
                aws.ec2.NatGateway(
                    f"{name}-nat-{zone}",
                    allocation_id=eip.id,
                    subnet_id=subnet.id,
                    tags={"Name": f"{name}-nat-{zone}"},
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
                )
            )

        private_subnets: list[aws.ec2.Subnet] = []
        for index, (zone, cidr) in enumerate(zip(args.availability_zones, plan.private, strict=True)):
            subnet = aws.ec2.Subnet(
                f"{name}-private-{zone}",
                vpc_id=vpc.id,
                cidr_block=cidr,
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={
                    "Name": f"{name}-private-{zone}",
                    "kubernetes.io/role/internal-elb": "1",
                    f"kubernetes.io/cluster/{args.cluster_name}": "shared",
                },
                opts=child,
            )
            nat = nats[index] if args.nat_gateway_per_zone else nats[0]
            routes = aws.ec2.RouteTable(
                f"{name}-private-{zone}",
                vpc_id=vpc.id,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
                tags={"Name": f"{name}-private-{zone}"},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{zone}", subnet_id=subnet.id, route_table_id=routes.id, opts=child
            )
            private_subnets.append(subnet)

        self.vpc_id = vpc.id
        self.private_subnet_ids = pulumi.Output.all(*[s.id for s in private_subnets])
        self.public_subnet_ids = pulumi.Output.all(*[s.id for s in public_subnets])
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "private_subnet_ids": self.private_subnet_ids,
                "public_subnet_ids": self.public_subnet_ids,
            }
        )
