"""The stack's `warren:` configuration, read once into typed settings.

Pulumi.yaml declares every key with its type and default; this checks what types cannot (which
keys a target needs, paths that must exist) and names the key to fix in every error.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from warren_components import GvisorBinaries
from warren_components.edge import CERTIFICATE_ARN, HOSTNAME

import pulumi
from warren import paths
from warren.config import (
    BUCKET,
    IMAGE_REGISTRY,
    IMAGE_TAG,
    ConfigError,
    ServicesConfig,
    WarrenConfig,
    load_config,
)

INFRA_DIR = Path(__file__).resolve().parent

Target = Literal["local", "aws"]
CapacityType = Literal["ON_DEMAND", "SPOT"]
Encryption = Literal["aws:kms", "AES256"]


class SettingsError(ValueError):
    """A stack setting that is missing or wrong, phrased for whoever runs `pulumi up`."""


@dataclass(frozen=True)
class LocalSettings:
    kubeconfig: Path
    context: str | None
    # The local cluster's own node (`make deploy`'s): the workloads get its kubelet directory,
    # host paths under its state and the images it holds, pinned (`warren apply --local-node`).
    local_node: bool


@dataclass(frozen=True)
class EdgeSettings:
    """Who reaches the API from outside the cluster, and how (WarrenEdge)."""

    allowed_cidrs: list[str]
    internet_facing: bool
    certificate_arn: str | None
    hostname: str | None


@dataclass(frozen=True)
class AwsSettings:
    region: str
    availability_zones: list[str]
    vpc_cidr: str
    nat_gateway_per_zone: bool
    kubernetes_version: str
    endpoint_public_access: bool
    public_access_cidrs: list[str]
    node_instance_types: list[str]
    node_min_size: int
    node_desired_size: int
    node_max_size: int
    node_disk_gib: int
    node_capacity_type: CapacityType
    containerd_config_version: Literal[2, 3]
    gvisor: GvisorBinaries
    log_retention_days: int
    bucket_name: str | None
    bucket_encryption: Encryption
    noncurrent_version_days: int
    database_engine_version: str
    database_instance_class: str
    database_storage_gib: int
    database_multi_az: bool
    database_backup_retention_days: int
    database_deletion_protection: bool
    kvm_instance_type: str
    kvm_host_count: int
    kvm_ami_id: str | None
    kvm_ingress_ports: list[int]
    image_registry: str
    image_tag: str | None
    edge: EdgeSettings


@dataclass(frozen=True)
class StackSettings:
    stack: str
    target: Target
    config_file: Path | None
    local: LocalSettings | None
    aws: AwsSettings | None
    # What the platform's objects are rendered from: the configuration file as it is (local),
    # or with the services the aws program runs on its own stores (aws_services).
    warren: WarrenConfig


def _path(value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else (INFRA_DIR / path).resolve()


def _choice(config: pulumi.Config, key: str, choices: tuple[str, ...]) -> str:
    value = config.require(key)
    if value in choices:
        return value
    raise SettingsError(f"warren:{key} is {value!r}: use one of {', '.join(choices)}")


def _required(config: pulumi.Config, key: str, why: str) -> str:
    value = config.get(key) or ""
    if not value:
        raise SettingsError(f"warren:{key} is not set: {why} (`pulumi config set warren:{key} ...`)")
    return value


def _list(config: pulumi.Config, key: str) -> list[str]:
    value = config.get_object(key) or []
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SettingsError(f"warren:{key} must be a list of strings (got {value!r})")
    return list(value)


def _int(config: pulumi.Config, key: str) -> int:
    value = config.get_int(key)
    if value is None:
        raise SettingsError(
            f"warren:{key} is not set (Pulumi.yaml gives it a default: is the project file current?)"
        )
    return value


def _bool(config: pulumi.Config, key: str) -> bool:
    value = config.get_bool(key)
    if value is None:
        raise SettingsError(
            f"warren:{key} is not set (Pulumi.yaml gives it a default: is the project file current?)"
        )
    return value


def _image_registry(config: pulumi.Config) -> str:
    value = _required(
        config,
        "imageRegistry",
        "the cluster's nodes pull Warren's service images from it (`warren image push`)",
    )
    if not IMAGE_REGISTRY.match(value):
        raise SettingsError(
            f"warren:imageRegistry is {value!r}: give a registry host[:port][/path] such as "
            "registry.example.com/warren (no scheme, no tag)"
        )
    return value


def _image_tag(config: pulumi.Config) -> str | None:
    value = config.get("imageTag") or ""
    if value and not IMAGE_TAG.match(value):
        raise SettingsError(
            f"warren:imageTag is {value!r}: letters, digits, '_', '.', '-' (at most 128), or empty "
            "for the warren configuration's services.image_tag"
        )
    return value or None


def _edge(config: pulumi.Config) -> EdgeSettings:
    allowed = _list(config, "apiAllowedCidrs")
    if not allowed:
        raise SettingsError(
            "warren:apiAllowedCidrs is empty: name the ranges that may reach the API "
            "(`pulumi config set --path 'warren:apiAllowedCidrs[0]' 203.0.113.0/24`)"
        )
    for cidr in allowed:
        try:
            network = ipaddress.ip_network(cidr, strict=True)
        except ValueError as exc:
            raise SettingsError(
                f"warren:apiAllowedCidrs: {cidr!r} is not a network in CIDR form ({exc})"
            ) from None
        if network.prefixlen == 0:
            raise SettingsError(
                f"warren:apiAllowedCidrs: {cidr} opens the API to the whole internet: name ranges"
            )
    certificate = config.get("apiCertificateArn") or None
    hostname = config.get("apiHostname") or None
    if certificate and not CERTIFICATE_ARN.match(certificate):
        raise SettingsError(f"warren:apiCertificateArn is {certificate!r}: give an ACM certificate's ARN")
    if hostname and not HOSTNAME.match(hostname):
        raise SettingsError(
            f"warren:apiHostname is {hostname!r}: give the DNS name clients use, e.g. api.example.com"
        )
    if bool(certificate) != bool(hostname):
        missing = "apiHostname" if certificate else "apiCertificateArn"
        raise SettingsError(
            f"warren:{missing} is not set: TLS at the edge needs both the certificate "
            "(warren:apiCertificateArn) and the name it is issued for (warren:apiHostname)"
        )
    internet_facing = _bool(config, "apiInternetFacing")
    if internet_facing and not certificate:
        raise SettingsError(
            "warren:apiCertificateArn is not set: an internet-facing API carries API keys in every "
            "request, so it needs TLS (set warren:apiCertificateArn and warren:apiHostname, or set "
            "warren:apiInternetFacing to false for an endpoint inside the VPC only)"
        )
    return EdgeSettings(allowed, internet_facing, certificate, hostname)


def _local(config: pulumi.Config) -> LocalSettings:
    value = config.get("kubeconfig") or ""
    # Empty means the local cluster's own admin kubeconfig, the one `warren cluster kubeconfig` prints.
    kubeconfig = _path(value) if value else paths.admin_kubeconfig()
    if not kubeconfig.is_file():
        raise SettingsError(
            f"warren:kubeconfig {'names' if value else 'is empty, so the local cluster is meant, but'} "
            f"{kubeconfig} does not exist: start the cluster (`make deploy`) or set warren:kubeconfig "
            "to another cluster's kubeconfig"
        )
    return LocalSettings(
        kubeconfig=kubeconfig,
        context=config.get("kubeContext") or None,
        local_node=_bool(config, "localNode"),
    )


def _bin_dir() -> Path:
    """The cluster binaries (ctr reads the node's images): $WARREN_BIN_DIR, else the directory
    the running local cluster was started from."""
    from warren.cluster.local import BIN_DIR_RECORD

    if value := os.environ.get("WARREN_BIN_DIR"):
        return Path(value)
    record = paths.cluster_state_dir() / BIN_DIR_RECORD
    if record.is_file():
        return Path(record.read_text().strip())
    raise SettingsError(
        "warren:localNode is true, but the cluster binaries are unknown: set WARREN_BIN_DIR "
        "(tools/build-cluster-binaries.sh prints it) or start the local cluster (`make deploy`)"
    )


def _for_local_node(base: WarrenConfig) -> WarrenConfig:
    """What `warren apply --local-node` renders: the configuration as the local node needs it."""
    from warren.node import images
    from warren.node.layout import NodeLayout
    from warren.node.workloads import NODE_DIR, LocalNodeError, for_local_node

    if not base.services.enabled:
        return base
    state = paths.cluster_state_dir()
    node = NodeLayout(state / NODE_DIR)
    if not node.containerd_socket.exists():
        raise SettingsError(
            f"warren:localNode is true, but no local node runs here ({node.containerd_socket} is "
            "missing): start it (`make deploy`), or set warren:localNode to false for another cluster"
        )
    try:
        return for_local_node(base, state, images.imported(_bin_dir(), node))
    except LocalNodeError as exc:
        raise SettingsError(f"warren:localNode: {exc}") from None


def _aws(config: pulumi.Config) -> AwsSettings:
    why = "the aws target needs it"
    ports_raw = config.get_object("kvmIngressPorts") or []
    if not isinstance(ports_raw, list) or not all(isinstance(p, int) for p in ports_raw):
        raise SettingsError(f"warren:kvmIngressPorts must be a list of port numbers (got {ports_raw!r})")
    version = _int(config, "containerdConfigVersion")
    if version not in (2, 3):
        raise SettingsError(f"warren:containerdConfigVersion is {version}: use 3 (containerd 2.x) or 2 (1.x)")
    gvisor_why = "nodes install gVisor from a pinned build and refuse anything else"
    try:
        gvisor = GvisorBinaries(
            base_url=_required(config, "gvisorBaseUrl", gvisor_why),
            runsc_sha256=_required(config, "gvisorRunscSha256", gvisor_why),
            shim_sha256=_required(config, "gvisorShimSha256", gvisor_why),
        )
    except ValueError as exc:
        raise SettingsError(f"warren:gvisor*: {exc}") from None
    bucket_name = config.get("bucketName") or None
    if bucket_name and not BUCKET.match(bucket_name):
        raise SettingsError(
            f"warren:bucketName is {bucket_name!r}: an S3 bucket name (3-63 of a-z, 0-9, '.', '-'), "
            "or empty for a generated one"
        )
    return AwsSettings(
        region=_required(config, "awsRegion", why),
        availability_zones=_list(config, "availabilityZones"),
        vpc_cidr=config.require("vpcCidr"),
        nat_gateway_per_zone=_bool(config, "natGatewayPerZone"),
        kubernetes_version=config.require("kubernetesVersion"),
        endpoint_public_access=_bool(config, "endpointPublicAccess"),
        public_access_cidrs=_list(config, "publicAccessCidrs"),
        node_instance_types=_list(config, "nodeInstanceTypes"),
        node_min_size=_int(config, "nodeMinSize"),
        node_desired_size=_int(config, "nodeDesiredSize"),
        node_max_size=_int(config, "nodeMaxSize"),
        node_disk_gib=_int(config, "nodeDiskGib"),
        node_capacity_type=cast(CapacityType, _choice(config, "nodeCapacityType", ("ON_DEMAND", "SPOT"))),
        containerd_config_version=3 if version == 3 else 2,  # noqa: PLR2004
        gvisor=gvisor,
        log_retention_days=_int(config, "logRetentionDays"),
        bucket_name=bucket_name,
        bucket_encryption=cast(Encryption, _choice(config, "bucketEncryption", ("aws:kms", "AES256"))),
        noncurrent_version_days=_int(config, "noncurrentVersionDays"),
        database_engine_version=config.require("databaseEngineVersion"),
        database_instance_class=config.require("databaseInstanceClass"),
        database_storage_gib=_int(config, "databaseStorageGib"),
        database_multi_az=_bool(config, "databaseMultiAz"),
        database_backup_retention_days=_int(config, "databaseBackupRetentionDays"),
        database_deletion_protection=_bool(config, "databaseDeletionProtection"),
        kvm_instance_type=config.require("kvmInstanceType"),
        kvm_host_count=_int(config, "kvmHostCount"),
        kvm_ami_id=config.get("kvmAmiId") or None,
        kvm_ingress_ports=list(ports_raw),
        image_registry=_image_registry(config),
        image_tag=_image_tag(config),
        edge=_edge(config),
    )


def aws_services(aws: AwsSettings) -> dict[str, object]:
    """The services section the aws program sets: Warren's services as workloads on the
    stack's own stores (its RDS database and S3 bucket, reached with the pods' identity) and
    images from the stack's registry. A generated bucket's name is filled in at deploy time."""
    services: dict[str, object] = {
        "enabled": True,
        "stores": "external",
        "object_store_endpoint": f"https://s3.{aws.region}.amazonaws.com",
        "object_store_credentials": "ambient",
        "image_registry": aws.image_registry,
    }
    if aws.image_tag:
        services["image_tag"] = aws.image_tag
    if aws.bucket_name:
        services["bucket"] = aws.bucket_name
    return services


def _aws_warren(aws: AwsSettings, base: WarrenConfig, config_file: Path | None) -> WarrenConfig:
    owned = aws_services(aws)
    explicit = base.services.model_fields_set
    # A key the file sets that the stack decides too, with another value, is a conflict to
    # resolve, not something to override quietly.
    for key in sorted(explicit & (set(owned) | {"bucket"})):
        wanted = owned.get(key)
        if wanted is None or getattr(base.services, key) != wanted:
            source = "warren:bucketName (empty: a generated bucket)" if key == "bucket" else "the stack"
            raise SettingsError(
                f"warren:configFile {config_file} sets services.{key}: {getattr(base.services, key)!r}, "
                f"but on aws {source} decides it: remove it from the file"
            )
    try:
        return base.model_copy(
            update={"services": ServicesConfig.model_validate(base.services.model_dump() | owned)}
        )
    except ValueError as exc:
        raise SettingsError(f"the aws program's services settings are refused: {exc}") from None


def load() -> StackSettings:
    """The current stack's settings; SettingsError names the first key to fix."""
    config = pulumi.Config("warren")
    target = cast(Target, _choice(config, "target", ("local", "aws")))
    config_file_value = config.get("configFile") or ""
    config_file = _path(config_file_value) if config_file_value else None
    if config_file is not None and not config_file.is_file():
        raise SettingsError(f"warren:configFile names {config_file}, which does not exist")
    try:
        base = load_config(config_file)
    except ConfigError as exc:
        raise SettingsError(f"warren:configFile: {exc}") from None
    aws = _aws(config) if target == "aws" else None
    local = _local(config) if target == "local" else None
    if aws is not None:
        warren = _aws_warren(aws, base, config_file)
    elif local is not None and local.local_node:
        warren = _for_local_node(base)
    else:
        warren = base
    return StackSettings(
        stack=pulumi.get_stack(),
        target=target,
        config_file=config_file,
        local=local,
        aws=aws,
        warren=warren,
    )
