"""Building blocks: a rule is a function from a resource's properties to violation messages."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
)

Check = Callable[[Mapping[str, Any], ResourceValidationArgs], list[str]]


def resource_rule(
    name: str,
    description: str,
    resource_types: tuple[str, ...],
    check: Check,
    config_schema: PolicyConfigSchema | None = None,
) -> ResourceValidationPolicy:
    """A mandatory policy that runs `check` on every resource of the given types."""

    def validate(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
        if args.resource_type not in resource_types:
            return
        for message in check(args.props, args):
            report_violation(message, None)

    return ResourceValidationPolicy(
        name=name,
        description=description,
        validate=validate,
        enforcement_level=EnforcementLevel.MANDATORY,
        config_schema=config_schema,
    )
