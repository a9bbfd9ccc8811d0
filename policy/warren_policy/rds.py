"""RDS: encrypted, private, in a subnet group, backed up; deletion protection in production."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import PolicyConfigSchema, ResourceValidationArgs

from warren_policy.props import PRODUCTION_CONFIG_SCHEMA, is_production, is_true
from warren_policy.rules import resource_rule

INSTANCE = "aws:rds/instance:Instance"
CLUSTER = "aws:rds/cluster:Cluster"


def _encrypted(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    return [] if is_true(props.get("storageEncrypted")) else ["storageEncrypted must be true"]


def _private(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    messages = []
    if is_true(props.get("publiclyAccessible")):
        messages.append("publiclyAccessible must be false")
    if not props.get("dbSubnetGroupName"):
        messages.append(
            "dbSubnetGroupName must name a subnet group of private subnets (else the default VPC is used)"
        )
    return messages


def _backups(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    days = props.get("backupRetentionPeriod")
    if isinstance(days, int | float) and days >= 1:
        return []
    return [f"backupRetentionPeriod must be at least 1 day (got {days})"]


def _deletion_protection(props: Mapping[str, Any], args: ResourceValidationArgs) -> list[str]:
    if not is_production(args) or is_true(props.get("deletionProtection")):
        return []
    return ["deletionProtection must be true in a production stack"]


POLICIES = [
    resource_rule("rds-storage-encrypted", "Database storage is encrypted.", (INSTANCE, CLUSTER), _encrypted),
    resource_rule(
        "rds-not-public",
        "Databases are not publicly accessible and sit in a subnet group.",
        (INSTANCE,),
        _private,
    ),
    resource_rule(
        "rds-backups-retained", "Automated backups are kept for a day or more.", (INSTANCE,), _backups
    ),
    resource_rule(
        "rds-deletion-protection-in-production",
        "Databases in production stacks have deletion protection.",
        (INSTANCE, CLUSTER),
        _deletion_protection,
        config_schema=PolicyConfigSchema(properties=PRODUCTION_CONFIG_SCHEMA),
    ),
]
