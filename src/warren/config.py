"""The one typed configuration every rendered object and the local cluster come from.

Operators write YAML; `load_config` validates all of it before anything is applied and
turns every problem into a `ConfigError` that names the key, what was given and what is
allowed.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

# Destinations a sandbox pod must never reach (ARCHITECTURE.md, "Egress deny floor").
DEFAULT_BLOCKED_V4 = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
)
DEFAULT_BLOCKED_V6 = ("fc00::/7", "fe80::/10", "fd00:ec2::254/128", "::1/128")

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class ConfigError(ValueError):
    """A configuration problem, phrased for the operator who has to fix it."""


class _Model(BaseModel):
    # Unknown keys are errors: a misspelt key must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


Port = Annotated[int, Field(ge=1, le=65535)]


def _cidr(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=True))
    except ValueError as exc:
        raise ValueError(f"{value!r} is not a network in CIDR form, e.g. 10.96.0.0/16 ({exc})") from exc


class NodeConfig(_Model):
    """The local cluster's node: containerd, gVisor, kubelet, kube-proxy and cluster DNS."""

    enabled: bool = True
    name: str | None = Field(default=None, description="Node name; default: the host name.")
    kubelet_port: Port = 10250
    kubelet_healthz_port: Port = 10248
    kube_proxy_healthz_port: Port = 10256
    kube_proxy_metrics_port: Port = 10249
    # kvm on bare metal with a working /dev/kvm; systrap in VMs; ptrace on old kernels.
    runsc_platform: Literal["auto", "systrap", "ptrace", "kvm"] = "auto"
    bridge: str = "warren0"
    # OCI runtime for pods that are not sandboxes (runc.v2 shim). crun refuses hosts with
    # hybrid cgroups (v1 controllers beside a v2 mount); runc handles them.
    oci_runtime: Literal["runc", "crun"] = "runc"

    @field_validator("name")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        if value is not None and not DNS_LABEL.match(value):
            raise ValueError(f"{value!r} is not a DNS label (lowercase letters, digits, '-')")
        return value


class ControlPlaneConfig(_Model):
    """warren-control as a process of the local deployment (`warren control-plane up`)."""

    edge_port: Port = 8080  # the API endpoint clients use, on loopback
    api_port: Port = 8081  # the API behind the edge, loopback only
    # Whether sandboxes get workspaces (fork, stop, sizes); without them the API refuses
    # those by name. Default: exactly when the local workspace layer runs.
    workspaces: bool | None = None

    @model_validator(mode="after")
    def _distinct_ports(self) -> ControlPlaneConfig:
        if self.edge_port == self.api_port:
            raise ValueError(f"edge_port and api_port must differ (both are {self.edge_port})")
        return self


BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class WorkspacesConfig(_Model):
    """The workspace layer on the local node (`warren workspaces up`): SeaweedFS as the object
    store, warren-blockd and its CSI node plugin, so every sandbox has a /workspace that
    forks by manifest and survives its pod."""

    enabled: bool = True
    # SeaweedFS listens on loopback from here: master, volume, filer, S3, admin, WebDAV
    # (base .. base+5), and each gRPC port 10000 above its HTTP port.
    base_port: Annotated[int, Field(ge=1024, le=55529)] = 19000
    bucket: str = "warren-workspaces"
    # How long an unpublish (pod stop) waits for a `replicated` receipt.
    replicate_wait_seconds: Annotated[float, Field(gt=0, le=110)] = 45.0

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        if not BUCKET.match(value):
            raise ValueError(f"{value!r} is not an S3 bucket name (3-63 of a-z, 0-9, '.', '-')")
        return value

    @property
    def s3_port(self) -> int:
        return self.base_port + 3


class DatabaseConfig(_Model):
    """The control plane's records on the local deployment: PostgreSQL (the postgres role, on
    loopback) or SQLite in the control plane's state (one process only)."""

    engine: Literal["postgres", "sqlite"] = "postgres"
    port: Port = 15432


class ClusterConfig(_Model):
    """The local single-node cluster that `warren cluster up` runs."""

    bind_address: str = "0.0.0.0"  # noqa: S104  # the node and its pods reach the API on the host's address
    advertise_address: str | None = Field(
        default=None, description="Address the API server advertises; default: the host's primary IPv4."
    )
    api_port: Port = 6443
    etcd_client_port: Port = 2379
    etcd_peer_port: Port = 2380
    etcd_metrics_port: Port = 2381
    controller_manager_port: Port = 10257
    scheduler_port: Port = 10259
    service_cidr: str = "10.96.0.0/16"
    pod_cidr: str = "10.244.0.0/16"
    cluster_domain: str = "cluster.local"
    ready_timeout_seconds: Annotated[int, Field(ge=10, le=1800)] = 180

    @field_validator("service_cidr", "pod_cidr")
    @classmethod
    def _valid_cidr(cls, value: str) -> str:
        return _cidr(value)

    @field_validator("bind_address", "advertise_address")
    @classmethod
    def _valid_ip(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            ipaddress.ip_address(value)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not an IP address") from exc
        return value

    node: NodeConfig = Field(default_factory=NodeConfig)
    control_plane: ControlPlaneConfig = Field(default_factory=ControlPlaneConfig)
    workspaces: WorkspacesConfig = Field(default_factory=WorkspacesConfig)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)

    @property
    def sandbox_workspaces(self) -> bool:
        """Whether the control plane gives sandboxes workspaces."""
        wanted = self.control_plane.workspaces
        return self.workspaces.enabled if wanted is None else wanted

    @property
    def service_ip(self) -> str:
        """The `kubernetes` Service's cluster IP: the first address of the service range."""
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    @property
    def dns_ip(self) -> str:
        """Cluster DNS's Service IP: the tenth address of the service range, as kubeadm does."""
        return str(ipaddress.ip_network(self.service_cidr)[10])

    @property
    def node_pod_cidr(self) -> str:
        """The node's pod range: the first /24 of the pod range (what the controller
        manager allocates to the first node)."""
        network = ipaddress.ip_network(self.pod_cidr)
        return str(next(network.subnets(new_prefix=max(24, network.prefixlen))))


class IsolationConfig(_Model):
    """The isolation floor: runtime class, admission policy and namespace labels."""

    runtime_class: str = "gvisor"
    runtime_handler: str = "runsc"
    default_namespace: str = "warren-sandboxes"
    extra_namespaces: tuple[str, ...] = ()
    pod_security_level: Literal["baseline", "restricted"] = "baseline"
    # Requesters in these groups may change the floor's guarded objects (sandbox namespace
    # labels, the gvisor RuntimeClass). Everyone else is refused by the guard policy.
    platform_groups: tuple[str, ...] = ("system:masters", "warren:platform")
    # CSI drivers whose inline volumes sandbox pods may use (the workspace driver).
    allowed_csi_drivers: tuple[str, ...] = ("blockd.warren.dev",)

    @field_validator("default_namespace", "runtime_class", "runtime_handler")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if not DNS_LABEL.match(value):
            raise ValueError(f"{value!r} is not a DNS label (lowercase letters, digits, '-')")
        return value

    @field_validator("extra_namespaces")
    @classmethod
    def _dns_labels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            cls._dns_label(name)
        return value

    @field_validator("platform_groups")
    @classmethod
    def _some_groups(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one group must be able to manage the floor")
        return value

    @property
    def sandbox_namespaces(self) -> tuple[str, ...]:
        return (self.default_namespace, *self.extra_namespaces)


class EgressConfig(_Model):
    """The egress deny floor's NetworkPolicy half (nftables on nodes is the other)."""

    blocked_cidrs: tuple[str, ...] = DEFAULT_BLOCKED_V4 + DEFAULT_BLOCKED_V6
    # Node and API server addresses to block too, when they are outside the ranges above.
    extra_blocked_cidrs: tuple[str, ...] = ()
    dns_namespace: str = "kube-system"
    dns_pod_labels: dict[str, str] = Field(default_factory=lambda: {"k8s-app": "kube-dns"})

    @field_validator("blocked_cidrs", "extra_blocked_cidrs")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_cidr(item) for item in value)

    def blocked(self, version: Literal[4, 6]) -> list[str]:
        cidrs = (*self.blocked_cidrs, *self.extra_blocked_cidrs)
        return [c for c in cidrs if ipaddress.ip_network(c).version == version]


class WarrenConfig(_Model):
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    isolation: IsolationConfig = Field(default_factory=IsolationConfig)
    egress: EgressConfig = Field(default_factory=EgressConfig)


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "(top level)"
        if item["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key; remove it or check its spelling")
            continue
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {key}: {message} (got {item.get('input')!r})")
    return "invalid Warren configuration:\n" + "\n".join(lines)


def parse_config(data: dict[str, Any] | None) -> WarrenConfig:
    try:
        return WarrenConfig.model_validate(data or {})
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


def load_config(path: Path | None) -> WarrenConfig:
    """Read and validate a YAML configuration file; None gives the embedded defaults."""
    if path is None:
        return WarrenConfig()
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read configuration {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"configuration {path} is not valid YAML: {exc}") from None
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"configuration {path} must be a mapping at the top level")
    try:
        return parse_config(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
