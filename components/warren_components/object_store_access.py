"""ObjectStoreAccess: the workspace bucket for warren-blockd and the control plane, by the
identity of their pods (EKS Pod Identity), with no access key anywhere.

- One IAM role that only EKS Pod Identity may assume (`pods.eks.amazonaws.com`), associated
  with the named service accounts of one namespace: Kubernetes decides which pods are them.
  The cluster needs the `eks-pod-identity-agent` add-on (AwsSandboxCluster installs it).
- Its policy: list the bucket; read, write and delete its objects (blockd's chunks, manifests
  and log records; the control plane's workspace tool); and, when the bucket is encrypted
  with a KMS key of the stack's own, use that key for S3 alone. Nothing else.
- Why not IRSA: an IRSA role is named by an annotation on the ServiceAccount, a value only
  the deployment knows, so the objects applied would differ from what `warren render` makes
  for every other install path. A Pod Identity association is an AWS resource beside them.
The workloads then render with `services.object_store_credentials: ambient` (boto3's default
chain finds the pod's credentials).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi_aws as aws

import pulumi
from warren_components.iam import assume_role_policy

# The service accounts whose pods sign S3 requests (manifests/warren-system.yaml.j2, rbac.yaml.j2).
WORKSPACE_SERVICE_ACCOUNTS = ("warren-blockd", "warren-controller")


@dataclass(frozen=True)
class ObjectStoreAccessArgs:
    cluster_name: pulumi.Input[str]
    bucket_arn: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str] | None = None  # the bucket's key, when it has one of its own
    namespace: str = "warren-system"
    service_accounts: Sequence[str] = WORKSPACE_SERVICE_ACCOUNTS

    def __post_init__(self) -> None:
        if not self.service_accounts:
            raise ValueError("service_accounts is empty: name the service accounts whose pods use the bucket")
        if len(set(self.service_accounts)) != len(self.service_accounts):
            raise ValueError(f"service_accounts names one twice: {list(self.service_accounts)}")


def bucket_policy(bucket_arn: str, kms_key_arn: str | None) -> str:
    """What the workspace layer does with the bucket, and with its key through S3 only."""
    statements: list[dict[str, object]] = [
        {
            "Sid": "ListTheBucket",
            "Effect": "Allow",
            "Action": ["s3:ListBucket", "s3:GetBucketLocation"],
            "Resource": bucket_arn,
        },
        {
            "Sid": "ReadWriteObjects",
            "Effect": "Allow",
            "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
            "Resource": f"{bucket_arn}/*",
        },
    ]
    if kms_key_arn:
        statements.append(
            {
                "Sid": "UseTheBucketKeyThroughS3",
                "Effect": "Allow",
                "Action": ["kms:Decrypt", "kms:GenerateDataKey"],
                "Resource": kms_key_arn,
                "Condition": {"StringLike": {"kms:ViaService": "s3.*.amazonaws.com"}},
            }
        )
    return json.dumps({"Version": "2012-10-17", "Statement": statements})


class ObjectStoreAccess(pulumi.ComponentResource):
    role_arn: pulumi.Output[str]

    def __init__(
        self, name: str, args: ObjectStoreAccessArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("warren:object_store_access:ObjectStoreAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)

        role = aws.iam.Role(
            f"{name}-role",
            description=f"Warren workspaces: the bucket for {args.namespace}'s "
            f"{', '.join(args.service_accounts)} (EKS Pod Identity)",
            assume_role_policy=assume_role_policy("pods.eks.amazonaws.com"),
            opts=child,
        )
        key = pulumi.Output.from_input(args.kms_key_arn) if args.kms_key_arn is not None else None
        document = (
            pulumi.Output.all(args.bucket_arn, key).apply(lambda v: bucket_policy(v[0], v[1]))
            if key is not None
            else pulumi.Output.from_input(args.bucket_arn).apply(lambda arn: bucket_policy(arn, None))
        )
        policy = aws.iam.RolePolicy(f"{name}-bucket", role=role.id, policy=document, opts=child)
        self.associations = [
            aws.eks.PodIdentityAssociation(
                f"{name}-{account}",
                cluster_name=args.cluster_name,
                namespace=args.namespace,
                service_account=account,
                role_arn=role.arn,
                # A pod given the role before its permissions would fail its first requests.
                opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]),
            )
            for account in args.service_accounts
        ]

        self.role_arn = role.arn
        self.register_outputs({"role_arn": self.role_arn})
