"""Reading resource properties as the engine hands them to policies (camelCase, nested)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import ResourceValidationArgs

# Stacks whose resources get the production-only rules, unless the pack's config says otherwise.
DEFAULT_PRODUCTION_STACKS = ("aws-prod",)
PRODUCTION_CONFIG_SCHEMA: dict[str, dict[str, Any]] = {
    "productionStacks": {
        "type": "array",
        "items": {"type": "string"},
        "default": list(DEFAULT_PRODUCTION_STACKS),
        "description": "Stacks held to the production-only rules.",
    }
}


def get(props: Mapping[str, Any] | None, *path: str) -> Any:
    """props[a][b]...; None where any step is missing."""
    value: Any = props
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def items(value: Any) -> list[Any]:
    """A list property as a list (a missing one is empty)."""
    if value is None:
        return []
    if isinstance(value, Sequence) and not isinstance(value, str):
        return list(value)
    return [value]


def is_true(value: Any) -> bool:
    """Booleans arrive as bools, but launch templates carry them as the strings "true"/"false"."""
    return value is True or value == "true"


def is_internet(cidr: Any) -> bool:
    """0.0.0.0/0 or ::/0 (or any /0)."""
    try:
        return isinstance(cidr, str) and ipaddress.ip_network(cidr, strict=False).prefixlen == 0
    except ValueError:
        return False


def stack_of(urn: str) -> str:
    """urn:pulumi:<stack>::<project>::<type>::<name> -> <stack>."""
    return urn.removeprefix("urn:pulumi:").split("::", 1)[0]


def is_production(args: ResourceValidationArgs) -> bool:
    configured = args.get_config().get("productionStacks")
    stacks = configured if configured is not None else DEFAULT_PRODUCTION_STACKS
    return stack_of(args.urn) in stacks
