"""Warren's security floor as Pulumi policies, one module per service."""

from pulumi_policy import Policy

from warren_policy import ec2, eks, kms, rds, s3

POLICIES: list[Policy] = [*s3.POLICIES, *rds.POLICIES, *eks.POLICIES, *ec2.POLICIES, *kms.POLICIES]

__all__ = ["POLICIES"]
