"""Warren's security floor as Pulumi policies, one module per service (k8s: the platform's objects)."""

from pulumi_policy import Policy

from warren_policy import ec2, eks, k8s, kms, rds, s3

POLICIES: list[Policy] = [
    *s3.POLICIES,
    *rds.POLICIES,
    *eks.POLICIES,
    *ec2.POLICIES,
    *kms.POLICIES,
    *k8s.POLICIES,
]

__all__ = ["POLICIES"]
