"""warren.platform.control_plane_kubeconfig: the control plane's own kubeconfig, written once."""

from __future__ import annotations

from typing import Any

from ansible_collections.warren.platform.plugins.module_utils.warren_cli import WARREN_OPTION, run_module

DOCUMENTATION = r"""
---
module: control_plane_kubeconfig
short_description: Write the kubeconfig of the control plane's ServiceAccount
description:
  - Writes (0600) a kubeconfig for the ServiceAccount C(warren-controller), made from the
    cluster named by O(admin_kubeconfig) and the account's token Secret, unless O(output)
    already holds exactly that (C(warren control-plane kubeconfig)).
  - Reports changed only when it wrote the file.
version_added: "0.1.0"
author: Warren maintainers
extends_documentation_fragment:
  - warren.platform.warren
options:
  admin_kubeconfig:
    description: A kubeconfig that may read Secrets in C(warren-system).
    type: path
    required: true
  output:
    description: The kubeconfig to write.
    type: path
    required: true
notes:
  - Supports check mode (reads the token and says whether the file would change) and diff.
"""

EXAMPLES = r"""
- name: Write the ServiceAccount's kubeconfig
  warren.platform.control_plane_kubeconfig:
    warren: /opt/warren/platform/bin/warren
    admin_kubeconfig: /etc/kubernetes/admin.conf
    output: /var/lib/warren/control-plane/controller.kubeconfig
"""

RETURN = r"""
path:
  description: The kubeconfig's path.
  returned: success
  type: str
"""

ARGUMENT_SPEC: dict[str, Any] = {
    "warren": WARREN_OPTION,
    "admin_kubeconfig": {"type": "path", "required": True},
    "output": {"type": "path", "required": True},
}


def command(params: dict[str, Any], check_mode: bool) -> list[str]:
    argv = [params["warren"], "control-plane", "kubeconfig"]
    argv += ["--admin-kubeconfig", params["admin_kubeconfig"], "--output", params["output"]]
    return [*argv, "--check"] if check_mode else argv


def outcome(document: dict[str, Any], diff: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"changed": bool(document["changed"]), "path": str(document["path"])}
    if diff and result["changed"]:
        # The token is a credential: the diff names the file, never its content.
        result["diff"] = {"before": "", "after": f"{result['path']} (the ServiceAccount's token)\n"}
    return result


def main() -> None:
    run_module(ARGUMENT_SPEC, command, outcome)


if __name__ == "__main__":
    main()
