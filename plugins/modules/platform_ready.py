"""warren.platform.platform_ready: Warren's workloads rolled out, and where the API answers."""

from __future__ import annotations

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warren.platform.plugins.module_utils.warren_cli import (
    WARREN_OPTION,
    run_json,
    with_config,
)

DOCUMENTATION = r"""
---
module: platform_ready
short_description: Wait for Warren's services in warren-system and record where the API answers
description:
  - Waits until every workload of C(warren-system) is rolled out and ready, the install Job of
    this version complete, naming what is not and why (C(warren platform ready --json)).
  - Records the edge's URL and the first API key (0600, from the Secret C(warren-first-key))
    in O(record_dir) for C(warren sandbox); reports changed only when a record changed.
version_added: "0.1.0"
author: Warren maintainers
extends_documentation_fragment:
  - warren.platform.warren
options:
  kubeconfig:
    description: A kubeconfig allowed to read C(warren-system).
    type: path
    required: true
  config:
    description: A Warren configuration file; empty for the embedded defaults.
    type: str
    default: ""
  timeout:
    description: Seconds the rollout may take.
    type: int
    default: 900
  record_dir:
    description: Where the edge's URL and the first API key are written.
    type: path
    required: true
notes:
  - Supports check mode, in which it waits and reads, and writes nothing.
"""

EXAMPLES = r"""
- name: Wait for Warren's services and record where the API answers
  warren.platform.platform_ready:
    warren: /opt/warren/platform/bin/warren
    kubeconfig: /etc/kubernetes/admin.conf
    record_dir: /etc/warren/control-plane
  register: ready
"""

RETURN = r"""
url:
  description: Where the edge answers.
  returned: success
  type: str
  sample: http://10.0.10.5:8080
key_file:
  description: The recorded first API key's file; null when none is recorded (and in check mode).
  returned: success
  type: str
"""

ARGUMENT_SPEC: dict[str, Any] = {
    "warren": WARREN_OPTION,
    "kubeconfig": {"type": "path", "required": True},
    "config": {"type": "str", "default": ""},
    "timeout": {"type": "int", "default": 900},
    "record_dir": {"type": "path", "required": True},
}


def command(params: dict[str, Any], check_mode: bool) -> list[str]:
    argv = [params["warren"], "platform", "ready", "--json", "--kubeconfig", params["kubeconfig"]]
    argv = with_config([*argv, "--timeout", str(params["timeout"])], params["config"])
    return argv if check_mode else [*argv, "--record", params["record_dir"]]


def outcome(document: dict[str, Any]) -> dict[str, Any]:
    return {
        "changed": bool(document["changed"]),
        "url": document["url"],
        "key_file": document.get("key_file"),
    }


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**outcome(run_json(module, command(module.params, module.check_mode))))


if __name__ == "__main__":
    main()
