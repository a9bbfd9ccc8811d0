"""warren.platform.image_push: Warren's images on an operator's registry."""

from __future__ import annotations

from typing import Any

from ansible_collections.warren.platform.plugins.module_utils.warren_cli import (
    WARREN_OPTION,
    listing,
    run_module,
    with_config,
)

DOCUMENTATION = r"""
---
module: image_push
short_description: Push an air-gapped bundle's images to the site's registry
description:
  - Pushes the service images the configuration's workloads run, from an extracted bundle, to
    the configuration's C(services.image_registry) with skopeo
    (C(warren image push --bundle --json)), each unless the registry already serves it with the
    same digest.
  - Reports changed only when an image was pushed.
version_added: "0.1.0"
author: Warren maintainers
extends_documentation_fragment:
  - warren.platform.warren
options:
  bundle:
    description: The extracted bundle.
    type: path
    required: true
  config:
    description: A Warren configuration file naming the registry; empty for the defaults.
    type: str
    default: ""
  tls_verify:
    description: Check the registry's TLS certificate.
    type: bool
    default: true
  authfile:
    description: Registry credentials in containers-auth.json form; empty for none.
    type: str
    default: ""
notes:
  - Supports check mode (the registry is asked what it serves, nothing is pushed) and diff.
"""

EXAMPLES = r"""
- name: Push the bundle's images to the registry
  warren.platform.image_push:
    bundle: /opt/warren/bundle
    config: inventories/site/warren.yaml
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
pushed:
  description: The references pushed (would be pushed, in check mode).
  returned: success
  type: list
  elements: str
  sample: ["registry.example:5000/warren/warren-control:0.1.0"]
digests:
  description: Each reference's manifest digest.
  returned: success
  type: dict
"""

ARGUMENT_SPEC: dict[str, Any] = {
    "warren": WARREN_OPTION,
    "bundle": {"type": "path", "required": True},
    "config": {"type": "str", "default": ""},
    "tls_verify": {"type": "bool", "default": True},
    "authfile": {"type": "str", "default": ""},
}


def command(params: dict[str, Any], check_mode: bool) -> list[str]:
    argv = [params["warren"], "image", "push", "--json", "--bundle", params["bundle"]]
    argv = with_config(argv, params["config"])
    if not params["tls_verify"]:
        argv.append("--no-tls-verify")
    if params["authfile"]:
        argv += ["--authfile", params["authfile"]]
    return [*argv, "--dry-run"] if check_mode else argv


def outcome(document: dict[str, Any], diff: bool) -> dict[str, Any]:
    pushed = [str(reference) for reference in document.get("pushed", [])]
    result: dict[str, Any] = {
        "changed": bool(document["changed"]),
        "pushed": pushed,
        "digests": dict(document.get("digests", {})),
    }
    if diff and pushed:
        result["diff"] = {"prepared": listing("+", pushed)}
    return result


def main() -> None:
    run_module(ARGUMENT_SPEC, command, outcome)


if __name__ == "__main__":
    main()
