"""warren.platform.control_plane_bootstrap: the records migrated, the first organization and key."""

from __future__ import annotations

from typing import Any

from ansible_collections.warren.platform.plugins.module_utils.warren_cli import run_module

DOCUMENTATION = r"""
---
module: control_plane_bootstrap
short_description: Migrate the control plane's records and make the first organization and API key
description:
  - Brings the records' schema up to date, then, on the first run only, makes an
    organization, its first user and one API key, written (0600) to O(key_file)
    (C(warren-control admin bootstrap)).
  - Reports changed when it migrated or made the organization.
  - The records' database comes from C(WARREN_DATABASE_URL) (the task's C(environment)).
version_added: "0.1.0"
author: Warren maintainers
options:
  warren_control:
    description: The C(warren-control) command to run (a path, or a name on C(PATH)).
    type: str
    default: warren-control
  key_file:
    description: Where the first API key is written.
    type: path
    required: true
  org:
    description: The first organization's name.
    type: str
    default: default
  user:
    description: The first user's subject.
    type: str
    default: admin
notes:
  - Supports check mode (reads the records and says what it would do) and diff.
"""

EXAMPLES = r"""
- name: Migrate the records and make the first organization and API key
  warren.platform.control_plane_bootstrap:
    warren_control: /opt/warren/control/bin/warren-control
    key_file: /var/lib/warren/control-plane/api-key
  environment:
    WARREN_DATABASE_URL: "{{ database_url }}"
  no_log: true
"""

RETURN = r"""
migrated:
  description: Whether the schema was (would be, in check mode) brought up to date.
  returned: success
  type: bool
created:
  description: Whether the first organization and its key were (would be) made.
  returned: success
  type: bool
"""

ARGUMENT_SPEC: dict[str, Any] = {
    "warren_control": {"type": "str", "default": "warren-control"},
    "key_file": {"type": "path", "required": True},
    "org": {"type": "str", "default": "default"},
    "user": {"type": "str", "default": "admin"},
}


def command(params: dict[str, Any], check_mode: bool) -> list[str]:
    argv = [params["warren_control"], "admin", "bootstrap", "--key-file", params["key_file"]]
    argv += ["--org", params["org"], "--user", params["user"]]
    return [*argv, "--check"] if check_mode else argv


def outcome(document: dict[str, Any], diff: bool) -> dict[str, Any]:
    migrated, created = bool(document["migrated"]), bool(document["created"])
    result: dict[str, Any] = {"changed": migrated or created, "migrated": migrated, "created": created}
    if diff and result["changed"]:
        after = ("the records' schema migrated\n" if migrated else "") + (
            f"organization {document['org']} and its first API key\n" if created else ""
        )
        result["diff"] = {"before": "", "after": after}
    return result


def main() -> None:
    run_module(ARGUMENT_SPEC, command, outcome)


if __name__ == "__main__":
    main()
