"""WarrenEdge: the platform's API endpoint outside the cluster, a load balancer in front of the
edge (warren-control's authenticating entry), reachable only from named ranges.

- A Service `warren-edge` of type LoadBalancer in warren-system beside the rendered ClusterIP
  Service `warren-control`, selecting the same pods and port (both taken from that Service,
  so the two cannot drift apart). On EKS the cloud provider makes a Network Load Balancer
  of it: internal (private subnets, `kubernetes.io/role/internal-elb`) unless asked to face
  the internet (public subnets, `kubernetes.io/role/elb`).
- `loadBalancerSourceRanges` lets in only the given ranges; the whole internet (a /0) is
  refused here and by the policy pack (`k8s-load-balancer-restricted`).
- TLS at the load balancer with an ACM certificate for the given host name; an
  internet-facing edge must have one, because every request carries an API key. Without a
  certificate the edge is plain HTTP inside the VPC.
- Outputs: the load balancer's host name (point the certificate's name at it in DNS) and
  the API URL clients use.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi_kubernetes as k8s

import pulumi

SERVICE_NAME = "warren-edge"
AWS_LB = "service.beta.kubernetes.io/aws-load-balancer-"
HTTPS_PORT = 443
HOSTNAME = re.compile(r"^(?=.{1,253}$)([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$")
CERTIFICATE_ARN = re.compile(r"^arn:aws[a-z-]*:acm:[a-z0-9-]+:\d{12}:certificate/[0-9a-f-]+$")


@dataclass(frozen=True)
class WarrenEdgeArgs:
    """edge_service: the rendered ClusterIP Service of the edge (`warren render`'s
    Service/warren-system/warren-control): its namespace, labels, selector and port are used."""

    edge_service: Mapping[str, Any]
    allowed_cidrs: Sequence[str]
    internet_facing: bool = False
    certificate_arn: str | None = None
    hostname: str | None = None

    def __post_init__(self) -> None:
        if not self.allowed_cidrs:
            raise ValueError("allowed_cidrs is empty: name the ranges that may reach the API")
        for cidr in self.allowed_cidrs:
            try:
                network = ipaddress.ip_network(cidr, strict=True)
            except ValueError as exc:
                raise ValueError(f"allowed_cidrs: {cidr!r} is not a network in CIDR form ({exc})") from None
            if network.prefixlen == 0:
                raise ValueError(f"allowed_cidrs: {cidr} opens the API to the whole internet")
        if bool(self.certificate_arn) != bool(self.hostname):
            raise ValueError(
                "certificate_arn and hostname go together: TLS needs the certificate and the name "
                "clients use (the one it is issued for)"
            )
        if self.certificate_arn and not CERTIFICATE_ARN.match(self.certificate_arn):
            raise ValueError(f"certificate_arn {self.certificate_arn!r} is not an ACM certificate ARN")
        if self.hostname and not HOSTNAME.match(self.hostname):
            raise ValueError(f"hostname {self.hostname!r} is not a DNS name such as api.example.com")
        if self.internet_facing and not self.certificate_arn:
            raise ValueError(
                "an internet-facing edge needs TLS (every request carries an API key): give "
                "certificate_arn and hostname, or keep the edge internal"
            )
        spec = self.edge_service.get("spec") or {}
        if not spec.get("selector") or len(spec.get("ports") or []) != 1:
            raise ValueError("edge_service must be the rendered edge Service: a selector and one port")

    @property
    def tls(self) -> bool:
        return bool(self.certificate_arn)


def service_manifest(args: WarrenEdgeArgs) -> dict[str, Any]:
    """The LoadBalancer Service, as it is sent to the cluster."""
    rendered = args.edge_service
    (port,) = rendered["spec"]["ports"]
    annotations = {f"{AWS_LB}type": "nlb"}
    if not args.internet_facing:
        annotations[f"{AWS_LB}internal"] = "true"
    if args.tls:
        annotations[f"{AWS_LB}ssl-cert"] = str(args.certificate_arn)
        annotations[f"{AWS_LB}ssl-ports"] = "https"
    listener = (
        {"name": "https", "port": HTTPS_PORT, "targetPort": port["targetPort"]}
        if args.tls
        else {"name": port["name"], "port": port["port"], "targetPort": port["targetPort"]}
    )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": SERVICE_NAME,
            "namespace": rendered["metadata"]["namespace"],
            "labels": dict(rendered["metadata"].get("labels") or {}),
            "annotations": annotations,
        },
        "spec": {
            "type": "LoadBalancer",
            "selector": dict(rendered["spec"]["selector"]),
            "ports": [{**listener, "protocol": "TCP"}],
            "loadBalancerSourceRanges": list(args.allowed_cidrs),
        },
    }


def _ingress_hostname(status: Any) -> str:
    """The load balancer's name from a Service's status (empty until the cloud has made it)."""
    balancer = getattr(status, "load_balancer", None)
    ingress = getattr(balancer, "ingress", None) or []
    if not ingress:
        return ""
    return str(getattr(ingress[0], "hostname", None) or getattr(ingress[0], "ip", None) or "")


class WarrenEdge(pulumi.ComponentResource):
    hostname: pulumi.Output[str]  # the load balancer's
    url: pulumi.Output[str]  # the API clients use

    def __init__(self, name: str, args: WarrenEdgeArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        """Give the platform's Kubernetes provider in `opts.providers` (WarrenPlatform.provider)."""
        super().__init__("warren:edge:WarrenEdge", name, None, opts)
        manifest = service_manifest(args)
        # The provider waits until the cloud has made the load balancer and named it.
        service = k8s.core.v1.Service(
            f"{name}-service",
            metadata=manifest["metadata"],
            spec=manifest["spec"],
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.hostname = service.status.apply(_ingress_hostname)
        (listener,) = manifest["spec"]["ports"]
        if args.tls:
            self.url = pulumi.Output.from_input(f"https://{args.hostname}")
        else:
            self.url = self.hostname.apply(lambda host: f"http://{host}:{listener['port']}")
        self.register_outputs({"hostname": self.hostname, "url": self.url})
