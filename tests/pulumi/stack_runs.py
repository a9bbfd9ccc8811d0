"""The program (infra/) run under Pulumi's mocks with a stack's settings (stacks/), as the
engine would give them: Pulumi.yaml's defaults under the stack file's values under the test's."""

from __future__ import annotations

import json
from typing import Any

import yaml
from conftest import REPO, SHA_RUNSC, SHA_SHIM, Program, Recorder, run_program

import pulumi

PROJECT: dict[str, Any] = yaml.safe_load((REPO / "infra" / "Pulumi.yaml").read_text())
DECLARED: dict[str, dict[str, Any]] = PROJECT["config"]
STACKS = ("local", "aws-dev", "aws-prod")
GVISOR = {
    "warren:gvisorBaseUrl": "https://mirror.example/gvisor/x86_64",
    "warren:gvisorRunscSha256": SHA_RUNSC,
    "warren:gvisorShimSha256": SHA_SHIM,
}
REGISTRY = "registry.example.com/warren"
CERTIFICATE = "arn:aws:acm:eu-west-1:123456789012:certificate/00000000-1111-2222-3333-444444444444"
DEV_HOSTNAME = "api.dev.example.com"
# What an operator sets before the first `up` (the stack files leave them empty).
AWS: dict[str, dict[str, Any]] = {
    "aws-dev": {
        **GVISOR,
        "warren:imageRegistry": REGISTRY,
        "warren:apiCertificateArn": CERTIFICATE,
        "warren:apiHostname": DEV_HOSTNAME,
    },
    "aws-prod": {**GVISOR, "warren:imageRegistry": REGISTRY},
}


def stack_file(stack: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "stacks" / f"Pulumi.{stack}.yaml").read_text())
    return dict(data["config"])


def _engine_value(value: Any) -> str:
    """How the engine hands a config value to the program: strings as they are, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def effective_config(stack: str, overrides: dict[str, Any] | None = None) -> dict[str, str]:
    """Pulumi.yaml's defaults under the stack file's values, as the engine merges them."""
    merged = {f"warren:{key}": spec["default"] for key, spec in DECLARED.items() if "default" in spec}
    merged.update(stack_file(stack))
    merged.update(overrides or {})
    return {key: _engine_value(value) for key, value in merged.items()}


def program() -> None:
    import environments
    import stack_settings

    environments.deploy(stack_settings.load())


def deploy(stack: str, overrides: dict[str, Any] | None = None, run: Program = program) -> Recorder:
    """Run `run` (by default the program) as stack `stack` with its settings."""
    pulumi.runtime.set_all_config(effective_config(stack, overrides))
    return run_program(run, stack=stack)
