"""warren.platform.apply: the platform's rendered objects, applied to a cluster."""

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
module: apply
short_description: Apply the objects Warren renders from its configuration
description:
  - Renders the platform's objects (the admission floor, the isolation floor, Warren's
    workloads) from the Warren configuration, validated first, and applies them with
    server-side apply through C(warren apply --json).
  - Reports changed only when an object changed on the server.
  - In check mode the apply is a server-side dry run, where the API server validates every
    object, admission included, and stores nothing; the objects that would change are reported.
version_added: "0.1.0"
author: Warren maintainers
extends_documentation_fragment:
  - warren.platform.warren
options:
  kubeconfig:
    description: A kubeconfig allowed to create the platform's objects.
    type: path
    required: true
  config:
    description: A Warren configuration file; empty for the embedded defaults.
    type: str
    default: ""
  local_node:
    description:
      - The objects are for the local cluster's node (C(warren apply --local-node)), whose
        containerd holds Warren's images.
    type: bool
    default: false
  bundle:
    description:
      - An extracted bundle whose image digests pin the workloads (C(warren apply --bundle));
        empty for none.
    type: str
    default: ""
notes:
  - Supports check mode (a server-side dry run) and diff (the objects that change).
"""

EXAMPLES = r"""
- name: Apply the platform's objects
  warren.platform.apply:
    warren: /opt/warren/platform/bin/warren
    kubeconfig: /etc/kubernetes/admin.conf
    config: /etc/warren/warren.yaml
    bundle: /opt/warren/bundle
"""

RETURN = r"""
objects:
  description: How many objects were applied (or validated, in check mode).
  returned: success
  type: int
  sample: 42
changed_objects:
  description: The objects that changed (would change, in check mode), as C(Kind/name -n namespace).
  returned: success
  type: list
  elements: str
  sample: ["Deployment/warren-control -n warren-system"]
"""

ARGUMENT_SPEC: dict[str, Any] = {
    "warren": WARREN_OPTION,
    "kubeconfig": {"type": "path", "required": True},
    "config": {"type": "str", "default": ""},
    "local_node": {"type": "bool", "default": False},
    "bundle": {"type": "str", "default": ""},
}


def command(params: dict[str, Any], check_mode: bool) -> list[str]:
    argv = [params["warren"], "apply", "--json", "--kubeconfig", params["kubeconfig"]]
    argv = with_config(argv, params["config"])
    if params["local_node"]:
        argv.append("--local-node")
    if params["bundle"]:
        argv += ["--bundle", params["bundle"]]
    if check_mode:
        argv.append("--dry-run")
    return argv


def outcome(document: dict[str, Any], diff: bool) -> dict[str, Any]:
    changed_objects = [str(label) for label in document.get("changed_objects", [])]
    result: dict[str, Any] = {
        "changed": bool(document["changed"]),
        "objects": int(document.get("objects", 0)),
        "changed_objects": changed_objects,
    }
    if diff and changed_objects:
        result["diff"] = {"prepared": listing("~", changed_objects)}
    return result


def main() -> None:
    run_module(ARGUMENT_SPEC, command, outcome)


if __name__ == "__main__":
    main()
