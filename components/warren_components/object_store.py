"""ObjectStore: the S3 bucket workspaces replicate to (warren-blockd's chunks, manifests, logs).

- Public access blocked by all four settings, and object ownership enforced (ACLs disabled),
  so no object can be made public or owned by another account.
- Versioning on: an overwritten or deleted object stays recoverable. blockd writes chunks once
  under unique keys, so old versions come only from mistakes or attacks; they expire after a
  window instead of piling up.
- Default encryption with a KMS key (the component's own unless one is given) or SSE-S3.
- Incomplete multipart uploads (a node lost mid-upload) are aborted after a few days.
- A bucket policy that refuses any request not made over TLS 1.2 or later.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import pulumi_aws as aws

import pulumi


@dataclass(frozen=True)
class ObjectStoreArgs:
    bucket_name: str | None = None  # None: a unique name from the resource name
    encryption: Literal["aws:kms", "AES256"] = "aws:kms"
    kms_key_arn: pulumi.Input[str] | None = None  # with aws:kms; None creates a key
    noncurrent_version_days: int = 30
    abort_multipart_days: int = 7
    force_destroy: bool = False  # True lets `pulumi destroy` delete a bucket that holds objects

    def __post_init__(self) -> None:
        if self.encryption == "AES256" and self.kms_key_arn is not None:
            raise ValueError("kms_key_arn is given but encryption is AES256: use aws:kms or drop the key")
        if self.noncurrent_version_days < 1 or self.abort_multipart_days < 1:
            raise ValueError("noncurrent_version_days and abort_multipart_days must be at least 1")


def tls_only_policy(bucket_arn: str) -> str:
    """Deny every request over plain HTTP or TLS older than 1.2, to the bucket and its objects."""
    resources = [bucket_arn, f"{bucket_arn}/*"]
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Sid": "DenyInsecureTransport",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": resources,
                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                },
                {
                    "Sid": "DenyOldTls",
                    "Effect": "Deny",
                    "Principal": "*",
                    "Action": "s3:*",
                    "Resource": resources,
                    "Condition": {"NumericLessThan": {"s3:TlsVersion": "1.2"}},
                },
            ],
        }
    )


class ObjectStore(pulumi.ComponentResource):
    bucket_name: pulumi.Output[str]
    bucket_arn: pulumi.Output[str]
    kms_key_arn: pulumi.Output[str] | None

    def __init__(self, name: str, args: ObjectStoreArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("warren:object_store:ObjectStore", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        key_arn: pulumi.Input[str] | None = args.kms_key_arn
        if args.encryption == "aws:kms" and key_arn is None:
            key = aws.kms.Key(
                f"{name}-key",
                description=f"Warren object store {name}",
                enable_key_rotation=True,
                deletion_window_in_days=30,
                opts=child,
            )
            key_arn = key.arn

        bucket = aws.s3.Bucket(
            f"{name}-bucket",
            bucket=args.bucket_name,
            force_destroy=args.force_destroy,
            opts=child,
        )
        ownership = aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        public_access = aws.s3.BucketPublicAccessBlock(
            f"{name}-public-access",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        versioning = aws.s3.BucketVersioning(
            f"{name}-versioning",
            bucket=bucket.id,
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"),
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm=args.encryption,
                        kms_master_key_id=key_arn,
                    ),
                    # Fewer KMS calls (and less cost) for many small chunk writes.
                    bucket_key_enabled=args.encryption == "aws:kms",
                )
            ],
            opts=child,
        )
        everything = aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix="")
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-lifecycle",
            bucket=bucket.id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-noncurrent-versions",
                    status="Enabled",
                    filter=everything,
                    noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                        noncurrent_days=args.noncurrent_version_days
                    ),
                    # Delete markers left with no versions behind them.
                    expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(
                        expired_object_delete_marker=True
                    ),
                ),
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="abort-incomplete-multipart-uploads",
                    status="Enabled",
                    filter=everything,
                    abort_incomplete_multipart_upload=aws.s3.BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                        days_after_initiation=args.abort_multipart_days
                    ),
                ),
            ],
            # Noncurrent-version rules on an unversioned bucket are refused.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[versioning]),
        )
        aws.s3.BucketPolicy(
            f"{name}-tls-only",
            bucket=bucket.id,
            policy=bucket.arn.apply(tls_only_policy),
            # S3 evaluates a new policy against the public access block; set that first.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_access, ownership]),
        )

        self.bucket_name = bucket.bucket
        self.bucket_arn = bucket.arn
        self.kms_key_arn = pulumi.Output.from_input(key_arn) if key_arn is not None else None
        outputs: dict[str, pulumi.Output[str]] = {
            "bucket_name": self.bucket_name,
            "bucket_arn": self.bucket_arn,
        }
        if self.kms_key_arn is not None:
            outputs["kms_key_arn"] = self.kms_key_arn
        self.register_outputs(outputs)
