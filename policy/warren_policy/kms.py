"""KMS: every key rotates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pulumi_policy import ResourceValidationArgs

from warren_policy.props import is_true
from warren_policy.rules import resource_rule

KEY = "aws:kms/key:Key"


def _rotation(props: Mapping[str, Any], _args: ResourceValidationArgs) -> list[str]:
    return [] if is_true(props.get("enableKeyRotation")) else ["enableKeyRotation must be true"]


POLICIES = [resource_rule("kms-key-rotation", "KMS keys rotate yearly.", (KEY,), _rotation)]
