"""Database: RDS PostgreSQL for warren-control's product records.

- In private subnets through its own subnet group, never publicly accessible; its security
  group admits PostgreSQL only from the named client groups (the cluster's nodes).
- Storage encrypted (with the given KMS key, or RDS's default key); TLS required by the
  parameter group (`rds.force_ssl`).
- The master password is generated once by the program and kept in a Secrets Manager secret
  of the component's own; Pulumi holds it only as a secret (encrypted in state, never in
  config or a plain output). It is not rotated behind the platform's back: RDS's own
  managed password rotates every seven days, and the control plane, which reads its
  database URL once at start, would lose the database a week after `pulumi up`.
- `connection_url` (a secret output): what warren-control connects with, TLS required.
- Automated backups retained; deletion protection configurable (on in production), and a
  final snapshot taken whenever deletion protection is on.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote

import pulumi_aws as aws

import pulumi

POSTGRES_PORT = 5432
_MAJOR = re.compile(r"^(\d+)(\.\d+)?$")


@dataclass(frozen=True)
class DatabaseArgs:
    vpc_id: pulumi.Input[str]
    subnet_ids: pulumi.Input[Sequence[pulumi.Input[str]]]  # private subnets, two zones at least
    client_security_group_ids: Sequence[pulumi.Input[str]]
    deletion_protection: bool
    engine_version: str = "17"
    instance_class: str = "db.t4g.medium"
    allocated_storage_gib: int = 50
    max_allocated_storage_gib: int = 200
    backup_retention_days: int = 7
    multi_az: bool = False
    database_name: str = "warren"
    master_username: str = "warren"
    kms_key_arn: pulumi.Input[str] | None = None

    def __post_init__(self) -> None:
        if not _MAJOR.match(self.engine_version):
            raise ValueError(
                f"engine_version {self.engine_version!r} is not a PostgreSQL version such as 17 or 17.5"
            )
        if not 1 <= self.backup_retention_days <= 35:  # noqa: PLR2004
            raise ValueError(
                f"backup_retention_days {self.backup_retention_days} must be 1 to 35 (0 turns backups off)"
            )
        if not self.client_security_group_ids:
            raise ValueError("client_security_group_ids is empty: nothing could reach the database")
        if self.max_allocated_storage_gib < self.allocated_storage_gib:
            raise ValueError("max_allocated_storage_gib must be at least allocated_storage_gib")

    @property
    def parameter_family(self) -> str:
        return f"postgres{self.engine_version.split('.')[0]}"


def connection_url(username: str, password: str, host: str, port: int, database: str) -> str:
    """The SQLAlchemy URL warren-control reads (psycopg), refusing a connection without TLS."""
    credentials = f"{quote(username, safe='')}:{quote(password, safe='')}"
    return f"postgresql+psycopg://{credentials}@{host}:{port}/{quote(database, safe='')}?sslmode=require"


def new_password() -> str:
    """43 URL-safe characters: none RDS refuses ('/', '@', '"', ' '), none a URL must quote."""
    return secrets.token_urlsafe(32)


def _password(secret_string: str | None) -> str:
    return str(json.loads(secret_string or "{}")["password"])


class Database(pulumi.ComponentResource):
    address: pulumi.Output[str]
    port: pulumi.Output[int]
    master_user_secret_arn: pulumi.Output[str]
    security_group_id: pulumi.Output[str]
    connection_url: pulumi.Output[str]  # secret

    def __init__(self, name: str, args: DatabaseArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warren:database:Database", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        # No egress: the database answers connections and opens none.
        group = aws.ec2.SecurityGroup(
            f"{name}-db",
            vpc_id=args.vpc_id,
            description="Warren PostgreSQL: only from the cluster's nodes",
            tags={"Name": f"{name}-db"},
            opts=child,
        )
        for index, source in enumerate(args.client_security_group_ids):
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-db-client-{index}",
                security_group_id=group.id,
                referenced_security_group_id=source,
                ip_protocol="tcp",
                from_port=POSTGRES_PORT,
                to_port=POSTGRES_PORT,
                description="PostgreSQL from Warren nodes",
                opts=child,
            )

        subnets = aws.rds.SubnetGroup(
            f"{name}-db",
            subnet_ids=args.subnet_ids,
            description="Warren PostgreSQL: private subnets",
            opts=child,
        )
        parameters = aws.rds.ParameterGroup(
            f"{name}-db",
            family=args.parameter_family,
            description="Warren PostgreSQL: TLS required",
            parameters=[aws.rds.ParameterGroupParameterArgs(name="rds.force_ssl", value="1")],
            opts=child,
        )

        # The password is made once: later runs generate another, which ignore_changes drops,
        # so the stored one (and the database's) stays. Replacing this secret version is the
        # way to change it (and the platform's Secret warren-database follows).
        master = aws.secretsmanager.Secret(
            f"{name}-db-master",
            description=f"Warren PostgreSQL {name}: the master user's password",
            kms_key_id=args.kms_key_arn,
            recovery_window_in_days=7,
            opts=child,
        )
        generated = json.dumps({"username": args.master_username, "password": new_password()})
        version = aws.secretsmanager.SecretVersion(
            f"{name}-db-master",
            secret_id=master.id,
            secret_string=pulumi.Output.secret(generated),
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["secretString"]),
        )
        password: pulumi.Output[str] = pulumi.Output.secret(version.secret_string.apply(_password))

        instance = aws.rds.Instance(
            f"{name}-db",
            engine="postgres",
            engine_version=args.engine_version,
            instance_class=args.instance_class,
            allocated_storage=args.allocated_storage_gib,
            max_allocated_storage=args.max_allocated_storage_gib,
            storage_type="gp3",
            storage_encrypted=True,
            kms_key_id=args.kms_key_arn,
            db_name=args.database_name,
            username=args.master_username,
            password=password,
            iam_database_authentication_enabled=True,
            db_subnet_group_name=subnets.name,
            vpc_security_group_ids=[group.id],
            parameter_group_name=parameters.name,
            publicly_accessible=False,
            multi_az=args.multi_az,
            backup_retention_period=args.backup_retention_days,
            copy_tags_to_snapshot=True,
            deletion_protection=args.deletion_protection,
            skip_final_snapshot=not args.deletion_protection,
            final_snapshot_identifier=f"{name}-final" if args.deletion_protection else None,
            auto_minor_version_upgrade=True,
            enabled_cloudwatch_logs_exports=["postgresql", "upgrade"],
            opts=child,
        )

        self.address = instance.address
        self.port = instance.port
        self.master_user_secret_arn = master.arn
        self.security_group_id = group.id
        self.connection_url = pulumi.Output.secret(
            pulumi.Output.all(password, instance.address, instance.port).apply(
                lambda values: connection_url(
                    args.master_username, values[0], values[1], values[2], args.database_name
                )
            )
        )
        self.register_outputs(
            {
                "address": self.address,
                "port": self.port,
                "master_user_secret_arn": self.master_user_secret_arn,
                "security_group_id": self.security_group_id,
                "connection_url": self.connection_url,
            }
        )
