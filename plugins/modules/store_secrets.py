"""warren.platform.store_secrets: the host stores' credentials as Secrets on the cluster."""

from __future__ import annotations

import json
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warren.platform.plugins.module_utils.warren_cli import (
    WARREN_OPTION,
    run_json,
    with_config,
)

DOCUMENTATION = r"""
---
module: store_secrets
short_description: Make or update the external stores' Secrets in warren-system
description:
  - Hands the database's URL and the object store's credentials (host services the workloads
    reach over the network) to the cluster as the Secrets C(warren-database) and
    C(warren-object-store) (C(warren platform store-secrets --json), the values on its standard
    input, never on a command line).
  - An updated Secret restarts the workloads that read it.
  - Reports changed when a Secret was created or updated. Values are never returned or shown.
version_added: "0.1.0"
author: Warren maintainers
extends_documentation_fragment:
  - warren.platform.warren
options:
  kubeconfig:
    description: A kubeconfig allowed to write Secrets in warren-system.
    type: path
    required: true
  config:
    description: A Warren configuration file; empty for the embedded defaults.
    type: str
    default: ""
  database_url:
    description: The database's URL (with its password).
    type: str
    required: true
  object_store_credentials:
    description: The object store's C(credentials.env) text; empty when it is not external.
    type: str
    default: ""
notes:
  - Supports check mode (the API server is asked, nothing is stored) and diff (each Secret's
    name and what happens to it, never a value).
"""

EXAMPLES = r"""
- name: Make or update the Secrets on the cluster
  warren.platform.store_secrets:
    warren: /opt/warren/platform/bin/warren
    kubeconfig: /etc/kubernetes/admin.conf
    database_url: "{{ url.content | b64decode | trim }}"
  no_log: true
"""

RETURN = r"""
secrets:
  description: Each Secret's name and what happened to it (would happen, in check mode).
  returned: success
  type: dict
  sample: {"warren-database": "unchanged", "warren-object-store": "created"}
"""

ARGUMENT_SPEC: dict[str, Any] = {
    "warren": WARREN_OPTION,
    "kubeconfig": {"type": "path", "required": True},
    "config": {"type": "str", "default": ""},
    "database_url": {"type": "str", "required": True, "no_log": True},
    "object_store_credentials": {"type": "str", "default": "", "no_log": True},
}


def command(params: dict[str, Any], check_mode: bool) -> list[str]:
    argv = [params["warren"], "platform", "store-secrets", "--json", "--kubeconfig", params["kubeconfig"]]
    argv = with_config(argv, params["config"])
    return [*argv, "--dry-run"] if check_mode else argv


def stdin(params: dict[str, Any]) -> str:
    """The document the CLI reads: the credentials, on standard input only."""
    document = {"database_url": params["database_url"]}
    if params["object_store_credentials"]:
        document["object_store_credentials"] = params["object_store_credentials"]
    return json.dumps(document)


def outcome(document: dict[str, Any], diff: bool) -> dict[str, Any]:
    secrets = {str(name): str(what) for name, what in document.get("secrets", {}).items()}
    result: dict[str, Any] = {"changed": bool(document["changed"]), "secrets": secrets}
    changes = {name: what for name, what in secrets.items() if what != "unchanged"}
    if diff and changes:
        result["diff"] = {"prepared": "".join(f"Secret {n}: {w}\n" for n, w in sorted(changes.items()))}
    return result


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    document = run_json(module, command(module.params, module.check_mode), data=stdin(module.params))
    module.exit_json(**outcome(document, module._diff))


if __name__ == "__main__":
    main()
