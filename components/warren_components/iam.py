"""IAM documents the AWS components share."""

from __future__ import annotations

import json


def assume_role_policy(service: str) -> str:
    """A trust policy letting one AWS service (e.g. ec2.amazonaws.com) assume the role."""
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": service},
                    "Action": ["sts:AssumeRole", "sts:TagSession"],
                }
            ],
        }
    )


def managed_policy(name: str) -> str:
    """The ARN of an AWS-managed policy in the standard partition."""
    return f"arn:aws:iam::aws:policy/{name}"
