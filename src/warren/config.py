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

# Destinations a sandbox pod must never reach (docs/isolation-floor.md, "Egress floor").
DEFAULT_BLOCKED_V4 = (
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
)
DEFAULT_BLOCKED_V6 = ("fc00::/7", "fe80::/10", "fd00:ec2::254/128", "::1/128")

SYSTEM_NAMESPACE = "warren-system"  # Warren's own services; privileged
DNS_NAME_MAX = 253
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
    # Pods the kubelet admits. Its own default, 110, is what caps a node at about 100 idle
    # sandboxes; each pod takes one address of the node's pod range (checked against it).
    max_pods: Annotated[int, Field(ge=10, le=1000)] = 250
    # The kubelet learns of containers starting and ending from containerd's events (the
    # EventedPLEG feature gate) rather than from its relist once a second, which a pod's
    # start waits on at each step (its init container's end, its container's start).
    evented_pleg: bool = False

    @field_validator("name")
    @classmethod
    def _node_name(cls, value: str | None) -> str | None:
        if value is not None and not DNS_LABEL.match(value):
            raise ValueError(f"{value!r} is not a DNS label (lowercase letters, digits, '-')")
        return value


# A joined node's network interface names start with this and end with its name (15 at most).
JOINED_LINK_PREFIX = "wn-"
JOINED_NAME_MAX = 15 - len(JOINED_LINK_PREFIX)


class JoinedNodeConfig(_Model):
    """A further node of the local cluster on this same machine, in network and mount
    namespaces of its own (its kubelet, containerd, runsc, kube-proxy and egress floor),
    linked to the host by a veth pair: a real second kubelet for multi-node work."""

    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not DNS_LABEL.match(value) or len(value) > JOINED_NAME_MAX:
            raise ValueError(
                f"{value!r} is not a node name of {JOINED_NAME_MAX} characters at most "
                "(lowercase letters, digits, '-'): it also names the node's network link"
            )
        return value


class ControlPlaneConfig(_Model):
    """warren-control as a host service of the local deployment (the control_plane role, when
    `services.enabled` is off)."""

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
    """The workspace layer on the local node as host services (the object_store and blockd
    roles, when `services.enabled` is off): SeaweedFS as the object store, warren-blockd and
    its CSI node plugin, so every sandbox has a /workspace that forks by manifest and
    survives its pod."""

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

    @field_validator("link_cidr")
    @classmethod
    def _link_cidr(cls, value: str) -> str:
        if ipaddress.ip_network(_cidr(value)).version != 4:  # noqa: PLR2004
            raise ValueError(f"{value!r} is not an IPv4 network (joined nodes' links are IPv4)")
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
    # Joined nodes, each given the next /30 of link_cidr (the host's end first) and the next
    # /24 of the pod range after the first node's.
    joined_nodes: tuple[JoinedNodeConfig, ...] = ()
    link_cidr: str = "10.78.0.0/24"
    control_plane: ControlPlaneConfig = Field(default_factory=ControlPlaneConfig)
    workspaces: WorkspacesConfig = Field(default_factory=WorkspacesConfig)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)

    @model_validator(mode="after")
    def _pods_fit_the_range(self) -> ClusterConfig:
        # The node's range less its network, broadcast and bridge (gateway) addresses.
        addresses = ipaddress.ip_network(self.node_pod_cidr).num_addresses - 3
        if self.node.max_pods > addresses:
            raise ValueError(
                f"node.max_pods {self.node.max_pods} does not fit the node's pod range "
                f"{self.node_pod_cidr} ({addresses} addresses): lower it, or widen cluster.pod_cidr"
            )
        return self

    @model_validator(mode="after")
    def _joined_nodes_fit(self) -> ClusterConfig:
        names = [n.name for n in self.joined_nodes]
        if len(set(names)) != len(names) or (self.node.name and self.node.name in names):
            raise ValueError(f"joined_nodes names must differ from each other and node.name (got {names})")
        links = ipaddress.ip_network(self.link_cidr).num_addresses // 4
        ranges = len(list(ipaddress.ip_network(self.pod_cidr).subnets(new_prefix=24)))
        if len(names) > min(links, ranges - 1):
            raise ValueError(
                f"{len(names)} joined nodes do not fit link_cidr {self.link_cidr} (a /30 each) "
                f"and pod_cidr {self.pod_cidr} (a /24 each after the first node's)"
            )
        return self

    def joined_node_site(self, index: int) -> tuple[str, str, str]:
        """(host's link address, node's address, node's pod range) of joined_nodes[index]."""
        link = ipaddress.IPv4Network(self.link_cidr).network_address + 4 * index
        host, node = link + 1, link + 2
        pods = list(ipaddress.ip_network(self.pod_cidr).subnets(new_prefix=24))[index + 1]
        return str(host), str(node), str(pods)

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
    def gateway_ip(self) -> str:
        """The egress gateway's Service IP on the clusters Warren builds: the eleventh
        address of the service range, fixed so that each node's floor can let sandboxes
        reach it (and nothing else in the service range)."""
        return str(ipaddress.ip_network(self.service_cidr)[11])

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

    @model_validator(mode="after")
    def _not_the_system_namespace(self) -> IsolationConfig:
        if SYSTEM_NAMESPACE in self.sandbox_namespaces:
            raise ValueError(
                f"{SYSTEM_NAMESPACE} is the platform's own, privileged namespace: "
                "it cannot be a sandbox namespace"
            )
        return self

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


IMAGE_REGISTRY = re.compile(
    r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([a-z0-9._-]*[a-z0-9])?)*$"
)
IMAGE_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# The name Warren's images are built under. No registry serves it: with it, the installers
# import the images into the nodes instead of pulling or pushing.
DEFAULT_IMAGE_REGISTRY = "warren.dev"
# The images Warren's workloads run or deliver (warren image build), by the name the templates
# use: its services, the agent every sandbox gets and the base template.
SERVICE_IMAGES = ("warren-control", "warren-blockd", "seaweedfs", "postgres", "agent", "base")
IMAGE_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


# The templates the control plane is given (--template): the ones a warm pool can serve.
POOLED_TEMPLATES = ("base",)
# The egress gateway's port (warren-control serve's default): the Service's and the pods'.
GATEWAY_PORT = 8090


class PoolConfig(_Model):
    """A warm pool for one template: ready gVisor pods, each with a new, empty workspace of
    the API's default size, that a create of that template claims instead of starting a pod."""

    # Ready pods to keep; each holds a little memory (tens of MiB, idle) and a workspace.
    size: Annotated[int, Field(ge=0, le=1000)] = 2
    # At most this many pods made per second while the pool refills.
    refill_per_second: Annotated[float, Field(ge=0.1, le=100)] = 2.0
    # Ready pods for the children of this template's forks (the SandboxPool <name>-forks):
    # each starts with an empty workspace volume and takes its child's fork at the claim,
    # so a fork's children start without a cold pod start. 0: children start cold.
    forks: Annotated[int, Field(ge=0, le=1000)] = 0
    # Resume slots for this template's paused sandboxes (the SandboxPool <name>-resumes):
    # pods made ahead, each waiting for a memory image, so that a resume restores without a
    # pod made, scheduled and given a sandbox at the resume. Each holds an idle gVisor
    # sandbox and is renewed every 80 s. 0: a resume makes its pod.
    resumes: Annotated[int, Field(ge=0, le=100)] = 0


class ServicesConfig(_Model):
    """Warren's own services as workloads in warren-system, rendered beside the floor: the
    control plane (a Deployment), warren-blockd with its CSI node plugin (a DaemonSet on the
    sandbox nodes), the install Job that makes their Secrets on the cluster, and with
    `stores: embedded` SeaweedFS and PostgreSQL (single-node StatefulSets)."""

    # Off: the object store, the database, warren-blockd and the control plane run as host
    # services (the Ansible roles of those names) instead.
    enabled: bool = True
    # Images are <image_registry>/<service>:<image_tag> (warren image build/push).
    image_registry: str = DEFAULT_IMAGE_REGISTRY
    image_tag: str = "0.1.0"
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    control_replicas: Annotated[int, Field(ge=1, le=9)] = 2
    # What a sandbox's pod reserves on its node, as a share of its size (its limits): an
    # idle gVisor sandbox uses a few millicores and tens of MiB, so small shares let a node
    # hold many (100 for both: requests equal limits, the Guaranteed class).
    sandbox_cpu_request_percent: Annotated[int, Field(ge=1, le=100)] = 1
    sandbox_memory_request_percent: Annotated[int, Field(ge=1, le=100)] = 10
    # Warm pools, by template: a SandboxPool each in the default sandbox namespace, and the
    # control plane names it in the creates the template describes. {} for none.
    pools: dict[str, PoolConfig] = Field(default_factory=lambda: {"base": PoolConfig()})
    # A sandbox whose node has not been Ready for this long gets a new pod on another node,
    # its workspace restored there. More than warren-blockd's hold of a workspace (30 s).
    node_lost_seconds: Annotated[float, Field(ge=31, le=3600)] = 60.0
    # The nodes that run sandboxes (and so warren-blockd); empty: every node.
    sandbox_node_selector: dict[str, str] = Field(default_factory=dict)
    # embedded: the node the stores keep their data on (their host paths are that node's
    # disk, so they must never move). Empty: wherever the scheduler puts them.
    stores_node_selector: dict[str, str] = Field(default_factory=dict)
    # embedded: SeaweedFS and PostgreSQL in warren-system, their credentials made by the
    # install Job. external: the operator's stores, named by the Secrets warren-database
    # (url) and warren-object-store (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), which the
    # install Job checks for before anything starts.
    stores: Literal["embedded", "external"] = "embedded"
    object_store_endpoint: str = Field(
        default="", description="external: the S3 endpoint URL; empty for AWS S3"
    )
    # How warren-blockd and the control plane sign their S3 requests. secret: the keys in
    # the Secret warren-object-store. ambient (external stores only): the AWS SDK's default
    # chain, e.g. EKS Pod Identity or IRSA for their service accounts; no key is stored.
    object_store_credentials: Literal["secret", "ambient"] = "secret"
    bucket: str = "warren-workspaces"
    # embedded: where the stores keep their data on the node they run on.
    stores_host_path: str = "/var/lib/warren/stores"
    # Each node's warren-blockd state: the write spool and the chunk cache.
    blockd_state_host_path: str = "/var/lib/warren/blockd"
    kubelet_root: str = "/var/lib/kubelet"
    # Each node's gVisor, for warren-blockd's memory captures (a pod's sandbox checkpointed
    # with runsc): its runsc and the state root of its containerd shim (runsc.toml's root;
    # the gvisor role's defaults).
    runsc_host_path: str = "/usr/local/bin/runsc"
    runsc_root_host_path: str = "/run/warren/runsc"
    # Each node's containerd state directory, where it keeps running containers' root file
    # systems; it must be a shared mount. Given, warren-blockd can bind a fork's workspace
    # into a running pool pod's container (no container started for the child). Empty: it
    # cannot, and fork pools start the child's container at the claim.
    containerd_state_host_path: str = ""
    # Each image pinned by its manifest digest (service -> sha256:...): what runs is exactly
    # what was built, and a rebuild under the same tag rolls the workloads. The local
    # deployment fills it from what the node holds (`warren apply --local-node`).
    image_digests: dict[str, str] = Field(default_factory=dict)
    # Where E2B programs reach a sandbox's ports as {port}-{id}.{sandbox_domain}: a wildcard
    # DNS record for it points at the edge. Empty: programs set E2B_SANDBOX_URL to the edge.
    sandbox_domain: str = ""
    # A kubernetes.io/tls Secret in warren-system (tls.crt, tls.key) with a certificate for
    # the edge's name and *.{sandbox_domain}: the edge serves HTTPS with it. Empty: HTTP
    # (behind the operator's own TLS terminator, or on a private network).
    edge_tls_secret: str = ""
    # The egress gateway (every control replica serves it on GATEWAY_PORT, behind the Service
    # warren-gateway): sandboxes reach model and tool APIs through it with the organization's
    # secrets added outside the guest. Off: secrets are refused.
    gateway: bool = True
    # The Service's cluster IP. Nodes whose egress floor Warren installs let sandboxes reach
    # this address on GATEWAY_PORT only; the local deployment fills in cluster.gateway_ip.
    # Empty: the cluster picks one (its floor is then the NetworkPolicy's alone).
    gateway_cluster_ip: str = ""
    # PEM certificates the gateway trusts for destinations besides the public CAs its image
    # holds (a private model host's CA). Empty: the public ones only.
    gateway_trusted_ca: str = ""

    @field_validator("gateway_cluster_ip")
    @classmethod
    def _gateway_ip(cls, value: str) -> str:
        if value:
            try:
                ipaddress.ip_address(value)
            except ValueError as exc:
                raise ValueError(f"{value!r} is not an IP address (the gateway Service's)") from exc
        return value

    @field_validator("gateway_trusted_ca")
    @classmethod
    def _trusted_ca(cls, value: str) -> str:
        if value and "-----BEGIN CERTIFICATE-----" not in value:
            raise ValueError("gateway_trusted_ca holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
        return value

    @field_validator("pools")
    @classmethod
    def _pools(cls, value: dict[str, PoolConfig]) -> dict[str, PoolConfig]:
        for name in value:
            if name not in POOLED_TEMPLATES:
                raise ValueError(
                    f"no template {name!r} to keep a pool of: name one of {', '.join(POOLED_TEMPLATES)}"
                )
        return value

    @field_validator("sandbox_domain")
    @classmethod
    def _domain(cls, value: str) -> str:
        value = value.rstrip(".").lower()
        labels = value.split(".") if value else []
        too_long, single_label = len(value) > DNS_NAME_MAX, len(labels) < 2  # noqa: PLR2004
        if value and (too_long or single_label or not all(DNS_LABEL.match(x) for x in labels)):
            raise ValueError(f"{value!r} is not a DNS domain, e.g. sandboxes.example.com")
        return value

    @field_validator("edge_tls_secret")
    @classmethod
    def _secret_name(cls, value: str) -> str:
        if value and not DNS_LABEL.match(value):
            raise ValueError(f"{value!r} is not a Secret name (lower-case letters, digits, '-'; 63 at most)")
        return value

    @field_validator("image_registry")
    @classmethod
    def _registry(cls, value: str) -> str:
        if not IMAGE_REGISTRY.match(value):
            raise ValueError(
                f"{value!r} is not a registry host[:port][/path], e.g. registry.example.com:5000/warren"
            )
        return value

    @field_validator("image_tag")
    @classmethod
    def _tag(cls, value: str) -> str:
        if not IMAGE_TAG.match(value):
            raise ValueError(f"{value!r} is not an image tag (letters, digits, '_', '.', '-'; at most 128)")
        return value

    @field_validator("sandbox_node_selector", "stores_node_selector")
    @classmethod
    def _selector(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            if not LABEL_KEY.match(key) or not LABEL_VALUE.match(label):
                raise ValueError(
                    f"{key}={label} is not a node label (key [prefix/]name, value of 63 at most)"
                )
        return value

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, value: str) -> str:
        return WorkspacesConfig._bucket(value)

    @field_validator("image_digests")
    @classmethod
    def _digests(cls, value: dict[str, str]) -> dict[str, str]:
        for service, digest in value.items():
            if service not in SERVICE_IMAGES:
                raise ValueError(f"{service!r} is not one of Warren's images ({', '.join(SERVICE_IMAGES)})")
            if not IMAGE_DIGEST.match(digest):
                raise ValueError(f"{digest!r} ({service}) is not a digest: sha256: and 64 hex digits")
        return value

    @field_validator(
        "stores_host_path",
        "blockd_state_host_path",
        "kubelet_root",
        "runsc_host_path",
        "runsc_root_host_path",
    )
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/") or ".." in value.split("/"):
            raise ValueError(f"{value!r} is not an absolute path without '..'")
        return value.rstrip("/") or "/"

    @field_validator("containerd_state_host_path")
    @classmethod
    def _absolute_or_empty(cls, value: str) -> str:
        return cls._absolute(value) if value else value

    @field_validator("object_store_endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if value and not re.match(r"^https?://[^/\s]+$", value):
            raise ValueError(f"{value!r} is not an endpoint URL, e.g. https://s3.example.com:9000")
        return value

    @model_validator(mode="after")
    def _stores(self) -> ServicesConfig:
        if self.stores == "embedded" and self.object_store_endpoint:
            raise ValueError(
                "object_store_endpoint is for stores: external (embedded stores are found in the cluster)"
            )
        if self.stores == "embedded" and self.object_store_credentials == "ambient":
            raise ValueError(
                "object_store_credentials: ambient is for stores: external (the embedded store "
                "knows only the keys the install Job makes); use secret"
            )
        return self

    @property
    def gateway_port(self) -> int:
        return GATEWAY_PORT

    @property
    def install_job(self) -> str:
        """The install Job's name: one per version and, when pinned, per warren-control
        image (a Job's pod template cannot change, so a rebuilt image needs a new Job)."""
        name = "warren-install-" + self.image_tag.replace(".", "-").replace("_", "-").lower()[:30].strip("-")
        pinned = self.image_digests.get("warren-control")
        return f"{name}-{pinned.removeprefix('sha256:')[:10]}" if pinned else name

    def image(self, service: str) -> str:
        pinned = self.image_digests.get(service)
        reference = f"{self.image_registry}/{service}:{self.image_tag}"
        return f"{reference}@{pinned}" if pinned else reference


class WarrenConfig(_Model):
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    isolation: IsolationConfig = Field(default_factory=IsolationConfig)
    egress: EgressConfig = Field(default_factory=EgressConfig)
    services: ServicesConfig = Field(default_factory=ServicesConfig)


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
