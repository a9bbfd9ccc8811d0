"""The stack's `warren:` configuration, read once into typed settings.

Pulumi.yaml declares every key with its type and default; this checks what types cannot (which
keys a target needs, paths that must exist) and names the key to fix in every error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

from warren_components import GvisorBinaries

import pulumi
from warren import paths

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


@dataclass(frozen=True)
class StackSettings:
    stack: str
    target: Target
    config_file: Path | None
    local: LocalSettings | None
    aws: AwsSettings | None


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
    return LocalSettings(kubeconfig=kubeconfig, context=config.get("kubeContext") or None)


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
        bucket_name=config.get("bucketName") or None,
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
    )


def load() -> StackSettings:
    """The current stack's settings; SettingsError names the first key to fix."""
    config = pulumi.Config("warren")
    target = cast(Target, _choice(config, "target", ("local", "aws")))
    config_file_value = config.get("configFile") or ""
    config_file = _path(config_file_value) if config_file_value else None
    if config_file is not None and not config_file.is_file():
        raise SettingsError(f"warren:configFile names {config_file}, which does not exist")
    return StackSettings(
        stack=pulumi.get_stack(),
        target=target,
        config_file=config_file,
        local=_local(config) if target == "local" else None,
        aws=_aws(config) if target == "aws" else None,
    )
