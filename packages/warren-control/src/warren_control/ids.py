"""Opaque identifiers: random, so they reveal nothing about a pod, container, node or count."""

from __future__ import annotations

import secrets

# RFC 4648 base32 in lower case: safe in URLs, in Kubernetes names and read aloud.
_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
_LENGTH = 26  # 130 bits: guessing another organization's id is hopeless


def _random(length: int = _LENGTH) -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(length))


def new_sandbox_id() -> str:
    return f"sbx_{_random()}"


def new_org_id() -> str:
    return f"org_{_random()}"


def new_user_id() -> str:
    return f"usr_{_random()}"


def new_workspace_id() -> str:
    return f"ws_{_random()}"


def new_snapshot_id() -> str:
    return f"snp_{_random()}"


def new_object_name() -> str:
    """The Kubernetes name of a Sandbox resource: drawn on its own, so the public id can't be
    derived from it (or it from the public id)."""
    return f"sandbox-{_random()}"


def new_secret_id() -> str:
    return f"sec_{_random()}"
