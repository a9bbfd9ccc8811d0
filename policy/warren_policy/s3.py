"""S3: public access blocked, ownership enforced, versioned, encrypted, expiring, TLS only."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    ReportViolation,
    ResourceValidationArgs,
    StackValidationArgs,
    StackValidationPolicy,
)

from warren_policy.props import get, is_true, items
from warren_policy.rules import resource_rule

BUCKET = "aws:s3/bucket:Bucket"
PUBLIC_ACCESS_BLOCK = "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"
OWNERSHIP = "aws:s3/bucketOwnershipControls:BucketOwnershipControls"
VERSIONING = "aws:s3/bucketVersioning:BucketVersioning"
ENCRYPTION = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
LIFECYCLE = "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration"
POLICY = "aws:s3/bucketPolicy:BucketPolicy"

# What every bucket must have beside it, and what each one is for.
COMPANIONS = {
    PUBLIC_ACCESS_BLOCK: "a public access block",
    OWNERSHIP: "ownership controls",
    VERSIONING: "versioning",
    ENCRYPTION: "default encryption",
    LIFECYCLE: "lifecycle rules",
    POLICY: "a TLS-only bucket policy",
}
PUBLIC_ACCESS_SETTINGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
ENCRYPTION_ALGORITHMS = ("aws:kms", "aws:kms:dsse", "AES256")


def _public_access(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    return [
        f"{setting} must be true" for setting in PUBLIC_ACCESS_SETTINGS if not is_true(props.get(setting))
    ]


def _ownership(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    owner = get(props, "rule", "objectOwnership")
    return (
        []
        if owner == "BucketOwnerEnforced"
        else [f"objectOwnership must be BucketOwnerEnforced (ACLs off), not {owner}"]
    )


def _versioning(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    status = get(props, "versioningConfiguration", "status")
    return [] if status == "Enabled" else [f"versioning must be Enabled, not {status}"]


def _encryption(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    rules = items(props.get("rules"))
    algorithms = [get(rule, "applyServerSideEncryptionByDefault", "sseAlgorithm") for rule in rules]
    if not algorithms or any(a not in ENCRYPTION_ALGORITHMS for a in algorithms):
        return [f"default encryption must use one of {', '.join(ENCRYPTION_ALGORITHMS)} (got {algorithms})"]
    return []


def _lifecycle(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    enabled = [rule for rule in items(props.get("rules")) if get(rule, "status") == "Enabled"]
    messages = []
    if not any(get(rule, "noncurrentVersionExpiration", "noncurrentDays") for rule in enabled):
        messages.append("an enabled rule must expire noncurrent versions (noncurrentVersionExpiration)")
    if not any(get(rule, "abortIncompleteMultipartUpload", "daysAfterInitiation") for rule in enabled):
        messages.append("an enabled rule must abort incomplete multipart uploads")
    return messages


def denies_insecure_transport(document: Any) -> bool:
    """Whether a policy document denies every action when aws:SecureTransport is false."""
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except ValueError:
            return False
    for statement in items(get(document, "Statement")):
        if (
            get(statement, "Effect") == "Deny"
            and get(statement, "Principal") in ("*", {"AWS": "*"})
            and "s3:*" in items(get(statement, "Action"))
            and str(get(statement, "Condition", "Bool", "aws:SecureTransport")).lower() == "false"
        ):
            resources = [str(r) for r in items(get(statement, "Resource"))]
            if any(r.endswith("/*") for r in resources) and any(not r.endswith("/*") for r in resources):
                return True
    return False


def _tls_only(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    if denies_insecure_transport(props.get("policy")):
        return []
    return [
        "the bucket policy must deny s3:* to everyone when aws:SecureTransport is false, "
        "for the bucket and its objects"
    ]


def _buckets_complete(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    buckets = [r for r in args.resources if r.resource_type == BUCKET]
    for bucket in buckets:
        present = {
            r.resource_type
            for r in args.resources
            if r.resource_type in COMPANIONS
            and bucket.urn in {d.urn for d in r.property_dependencies.get("bucket", [])}
        }
        for missing in sorted(set(COMPANIONS) - present):
            report_violation(f"bucket {bucket.name} has no {COMPANIONS[missing]} ({missing})", bucket.urn)


POLICIES = [
    resource_rule(
        "s3-public-access-blocked",
        "All four public access block settings are true.",
        (PUBLIC_ACCESS_BLOCK,),
        _public_access,
    ),
    resource_rule(
        "s3-ownership-enforced",
        "Object ownership is BucketOwnerEnforced (ACLs disabled).",
        (OWNERSHIP,),
        _ownership,
    ),
    resource_rule("s3-versioning-enabled", "Bucket versioning is Enabled.", (VERSIONING,), _versioning),
    resource_rule("s3-encrypted", "Default encryption uses KMS or SSE-S3.", (ENCRYPTION,), _encryption),
    resource_rule(
        "s3-lifecycle-expiry",
        "Lifecycle rules expire noncurrent versions and abort incomplete multipart uploads.",
        (LIFECYCLE,),
        _lifecycle,
    ),
    resource_rule(
        "s3-tls-only", "The bucket policy denies requests not made over TLS.", (POLICY,), _tls_only
    ),
    StackValidationPolicy(
        name="s3-bucket-complete",
        description="Every bucket has its public access block, ownership controls, versioning, "
        "encryption, lifecycle rules and TLS-only policy.",
        validate=_buckets_complete,
        enforcement_level=EnforcementLevel.MANDATORY,
    ),
]
