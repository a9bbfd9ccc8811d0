"""The VPC's address plan and its subnets: private for workloads, public only for NAT."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from conftest import Recorder
from warren_components.network import Network, NetworkArgs, plan_subnets

ZONES = ["eu-west-1a", "eu-west-1b", "eu-west-1c"]


def test_plan_keeps_subnets_inside_the_vpc_and_apart() -> None:
    plan = plan_subnets("10.40.0.0/16", 3)
    vpc = ipaddress.IPv4Network("10.40.0.0/16")
    nets = [ipaddress.IPv4Network(c) for c in plan.private + plan.public]
    assert all(net.subnet_of(vpc) for net in nets)
    for i, a in enumerate(nets):
        for b in nets[i + 1 :]:
            assert not a.overlaps(b), (a, b)
    assert [ipaddress.ip_network(c).prefixlen for c in plan.private] == [19, 19, 19]
    assert [ipaddress.ip_network(c).prefixlen for c in plan.public] == [24, 24, 24]


@pytest.mark.parametrize(
    ("cidr", "zones", "message"),
    [("10.40.0.0/16", 1, "availability zones"), ("10.40.0.0/24", 2, "/16 to /20"), ("fd00::/48", 2, "IPv4")],
)
def test_plan_refuses_what_it_cannot_lay_out(cidr: str, zones: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_subnets(cidr, zones)


def test_no_subnet_hands_out_public_addresses(run: Callable[..., Recorder]) -> None:
    recorder = run(
        lambda: Network("n", NetworkArgs(cidr="10.40.0.0/16", availability_zones=ZONES, cluster_name="c"))
    )
    subnets = recorder.of_type("aws:ec2/subnet:Subnet")
    assert len(subnets) == 6
    assert all(s.inputs["mapPublicIpOnLaunch"] is False for s in subnets)


def test_private_subnets_route_through_nat_and_public_ones_through_the_gateway(
    run: Callable[..., Recorder],
) -> None:
    recorder = run(
        lambda: Network("n", NetworkArgs(cidr="10.40.0.0/16", availability_zones=ZONES, cluster_name="c"))
    )
    tables = {t.name: t for t in recorder.of_type("aws:ec2/routeTable:RouteTable")}
    assert "gatewayId" in tables["n-public"].inputs["routes"][0]
    for zone in ZONES:
        route = tables[f"n-private-{zone}"].inputs["routes"][0]
        assert route["cidrBlock"] == "0.0.0.0/0"
        assert "natGatewayId" in route and "gatewayId" not in route
    assert len(recorder.of_type("aws:ec2/natGateway:NatGateway")) == 3


def test_one_nat_gateway_when_asked(run: Callable[..., Recorder]) -> None:
    args = NetworkArgs(
        cidr="10.40.0.0/16", availability_zones=ZONES, cluster_name="c", nat_gateway_per_zone=False
    )
    recorder = run(lambda: Network("n", args))
    assert len(recorder.of_type("aws:ec2/natGateway:NatGateway")) == 1


def test_default_security_group_is_emptied(run: Callable[..., Recorder]) -> None:
    recorder = run(
        lambda: Network("n", NetworkArgs(cidr="10.40.0.0/16", availability_zones=ZONES, cluster_name="c"))
    )
    default = recorder.one("aws:ec2/defaultSecurityGroup:DefaultSecurityGroup")
    assert not default.inputs.get("ingress") and not default.inputs.get("egress")


def test_subnets_are_tagged_for_the_clusters_load_balancers(run: Callable[..., Recorder]) -> None:
    recorder = run(
        lambda: Network("n", NetworkArgs(cidr="10.40.0.0/16", availability_zones=ZONES, cluster_name="c"))
    )
    for subnet in recorder.of_type("aws:ec2/subnet:Subnet"):
        tags = subnet.inputs["tags"]
        assert tags["kubernetes.io/cluster/c"] == "shared", subnet.name
        role = "kubernetes.io/role/elb" if "-public-" in subnet.name else "kubernetes.io/role/internal-elb"
        assert tags[role] == "1", subnet.name
