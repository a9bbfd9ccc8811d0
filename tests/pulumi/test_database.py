"""Database: encrypted, private, backed up, reachable only from the nodes; protected in prod."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Recorder, is_secret, revealed
from warren_components import Database, DatabaseArgs

import pulumi

INSTANCE = "aws:rds/instance:Instance"
PRIVATE = ["subnet-private-a", "subnet-private-b"]


def args(**overrides: Any) -> DatabaseArgs:
    values: dict[str, Any] = {
        "vpc_id": "vpc-1",
        "subnet_ids": PRIVATE,
        "client_security_group_ids": ["sg-nodes"],
        "deletion_protection": True,
    }
    return DatabaseArgs(**{**values, **overrides})


@pytest.fixture
def prod(run: Callable[..., Recorder]) -> Recorder:
    return run(lambda: Database("db", args()), stack="aws-prod")


def test_storage_is_encrypted_and_not_public(prod: Recorder) -> None:
    instance = prod.one(INSTANCE).inputs
    assert instance["storageEncrypted"] is True
    assert instance["publiclyAccessible"] is False


def test_it_sits_in_the_given_private_subnets(prod: Recorder) -> None:
    group = prod.one("aws:rds/subnetGroup:SubnetGroup")
    assert group.inputs["subnetIds"] == PRIVATE
    # The group is autonamed; the mocks give it its logical name.
    assert prod.one(INSTANCE).inputs["dbSubnetGroupName"] == group.name


def test_deletion_protection_and_final_snapshot_in_prod(prod: Recorder) -> None:
    instance = prod.one(INSTANCE).inputs
    assert instance["deletionProtection"] is True
    assert instance["skipFinalSnapshot"] is False
    assert instance["finalSnapshotIdentifier"] == "db-final"


def test_backups_are_retained(prod: Recorder) -> None:
    assert prod.one(INSTANCE).inputs["backupRetentionPeriod"] == 7


def test_only_the_nodes_reach_postgres(prod: Recorder) -> None:
    group = prod.one("aws:ec2/securityGroup:SecurityGroup")
    assert not group.inputs.get("ingress")
    rules = prod.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    assert len(rules) == 1
    rule = rules[0].inputs
    assert rule["securityGroupId"] == group.resource_id
    assert rule["referencedSecurityGroupId"] == "sg-nodes"
    assert (rule["fromPort"], rule["toPort"], rule["ipProtocol"]) == (5432, 5432, "tcp")
    assert "cidrIpv4" not in rule and "cidrIpv6" not in rule
    assert prod.one(INSTANCE).inputs["vpcSecurityGroupIds"] == [group.resource_id]


def test_tls_is_required(prod: Recorder) -> None:
    parameters = prod.one("aws:rds/parameterGroup:ParameterGroup").inputs
    assert parameters["family"] == "postgres17"
    assert {(p["name"], p["value"]) for p in parameters["parameters"]} == {("rds.force_ssl", "1")}


def test_the_password_is_made_once_and_kept_in_a_secret_of_its_own(
    run: Callable[..., Recorder], monkeypatch: pytest.MonkeyPatch
) -> None:
    from warren_components import database

    monkeypatch.setattr(database, "new_password", lambda: "made-once")
    seen: dict[str, Any] = {}

    def program() -> pulumi.Output[None]:
        db = Database("db", args())
        return pulumi.Output.all(
            db.connection_url.is_secret(), db.connection_url, db.master_user_secret_arn
        ).apply(lambda v: seen.update(secret=v[0], url=v[1], arn=v[2]))

    recorder = run(program, stack="aws-prod")
    instance = recorder.one(INSTANCE).inputs
    # RDS's own managed password rotates weekly, under a control plane that read it once.
    assert "manageMasterUserPassword" not in instance
    assert is_secret(instance["password"]) and revealed(instance["password"]) == "made-once"
    version = recorder.one("aws:secretsmanager/secretVersion:SecretVersion")
    assert is_secret(version.inputs["secretString"])
    assert json.loads(revealed(version.inputs["secretString"])) == {
        "username": "warren",
        "password": "made-once",
    }
    secret = recorder.one("aws:secretsmanager/secret:Secret")
    assert version.inputs["secretId"] == secret.resource_id
    assert seen["arn"] == secret.arn
    assert seen["secret"] is True
    assert (
        seen["url"]
        == "postgresql+psycopg://warren:made-once@db-db.mock.rds.example:5432/warren?sslmode=require"
    )


def test_the_connection_url_quotes_what_a_url_cannot_hold() -> None:
    from warren_components.database import connection_url

    assert connection_url("u", "p@ss/w:rd", "h", 5432, "db") == (
        "postgresql+psycopg://u:p%40ss%2Fw%3Ard@h:5432/db?sslmode=require"
    )


def test_dev_can_turn_deletion_protection_off(run: Callable[..., Recorder]) -> None:
    recorder = run(lambda: Database("db", args(deletion_protection=False)), stack="aws-dev")
    instance = recorder.one(INSTANCE).inputs
    assert instance["deletionProtection"] is False
    assert instance["skipFinalSnapshot"] is True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"backup_retention_days": 0}, "1 to 35"),
        ({"client_security_group_ids": []}, "nothing could reach"),
        ({"engine_version": "latest"}, "PostgreSQL version"),
    ],
)
def test_bad_args_are_refused(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        args(**overrides)
