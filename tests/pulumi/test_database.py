"""Database: encrypted, private, backed up, reachable only from the nodes; protected in prod."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import Recorder
from warren_components import Database, DatabaseArgs

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


def test_password_is_managed_by_rds_and_tls_required(prod: Recorder) -> None:
    instance = prod.one(INSTANCE).inputs
    assert instance["manageMasterUserPassword"] is True
    assert "password" not in instance
    parameters = prod.one("aws:rds/parameterGroup:ParameterGroup").inputs
    assert parameters["family"] == "postgres17"
    assert {(p["name"], p["value"]) for p in parameters["parameters"]} == {("rds.force_ssl", "1")}


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
