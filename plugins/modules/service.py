"""warren.platform.service: a service unit run under Warren's own supervisor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ansible_collections.warren.platform.plugins.module_utils.warren_cli import WARREN_OPTION, run_module

DOCUMENTATION = r"""
---
module: service
short_description: Converge a service unit under Warren's supervisor (hosts without systemd)
description:
  - Starts the C(ExecStart) of a service unit file under Warren's own supervisor, restarts it
    when the unit or an environment file it reads changed (or O(restart) says a file it reads
    changed), or leaves a running, current, healthy service alone (C(warren service up)).
  - Waits until it is healthy (O(health_url) answers 200, or O(health_command) exits 0).
  - With O(state=stopped), stops it instead (SIGTERM, then SIGKILL after the unit's stop
    timeout; C(warren service down)).
  - Reports changed when it started, restarted or stopped the service.
version_added: "0.1.0"
author: Warren maintainers
extends_documentation_fragment:
  - warren.platform.warren
options:
  unit_file:
    description: The service unit file (systemd's syntax) to run.
    type: path
    required: true
  state_dir:
    description: Where the supervisor keeps its pid records and logs.
    type: path
    required: true
  timeout:
    description: Seconds to wait for the service to be healthy.
    type: int
    default: 180
  health_url:
    description: Healthy once this URL answers 200; empty for none.
    type: str
    default: ""
  health_command:
    description: Healthy once this command (split like a shell) exits 0; empty for none.
    type: str
    default: ""
  restart:
    description: Restart even if the unit is unchanged (a file it reads at start changed).
    type: bool
    default: false
  state:
    description: Whether the service runs (V(started)) or not (V(stopped)).
    type: str
    choices: [started, stopped]
    default: started
notes:
  - Supports check mode (says whether it would start, restart or stop, and does none of it) and diff.
"""

EXAMPLES = r"""
- name: Run the object store under the supervisor
  warren.platform.service:
    warren: /opt/warren/platform/bin/warren
    unit_file: /var/lib/warren/cluster/units/warren-object-store.service
    state_dir: /var/lib/warren/cluster
    health_url: http://127.0.0.1:19003/healthz
"""

RETURN = r"""
name:
  description: The service's name (the unit file's, without C(.service)).
  returned: success
  type: str
  sample: warren-object-store
action:
  description: What was done (would be done, in check mode).
  returned: success
  type: str
  choices: [unchanged, started, restarted, stopped]
pid:
  description: The running service's process id; null when it does not run.
  returned: success
  type: int
"""

ARGUMENT_SPEC: dict[str, Any] = {
    "warren": WARREN_OPTION,
    "unit_file": {"type": "path", "required": True},
    "state_dir": {"type": "path", "required": True},
    "timeout": {"type": "int", "default": 180},
    "health_url": {"type": "str", "default": ""},
    "health_command": {"type": "str", "default": ""},
    "restart": {"type": "bool", "default": False},
    "state": {"type": "str", "choices": ["started", "stopped"], "default": "started"},
}


def command(params: dict[str, Any], check_mode: bool) -> list[str]:
    if params["state"] == "stopped":
        name = Path(params["unit_file"]).name.removesuffix(".service")
        argv = [params["warren"], "service", "down", name, "--state-dir", params["state_dir"]]
        return [*argv, "--unit-file", params["unit_file"], *(["--check"] if check_mode else [])]
    argv = [params["warren"], "service", "up", params["unit_file"]]
    argv += ["--state-dir", params["state_dir"], "--timeout", str(params["timeout"])]
    if params["health_url"]:
        argv += ["--health-url", params["health_url"]]
    if params["health_command"]:
        argv += ["--health-command", params["health_command"]]
    if check_mode:
        argv.append("--check")
    if params["restart"]:
        argv.append("--restart")
    return argv


def outcome(document: dict[str, Any], diff: bool) -> dict[str, Any]:
    if "action" not in document:  # `service down` says only whether it ran
        action = "stopped" if document["changed"] else "unchanged"
        stopped: dict[str, Any] = {"changed": bool(document["changed"]), "name": str(document["name"])}
        if diff and stopped["changed"]:
            stopped["diff"] = {"before": "running\n", "after": "stopped\n"}
        return {**stopped, "action": action, "pid": None}
    action = str(document["action"])
    result: dict[str, Any] = {
        "changed": bool(document["changed"]),
        "name": str(document["name"]),
        "action": action,
        "pid": document.get("pid"),
    }
    if diff and result["changed"]:
        result["diff"] = {
            "before_header": result["name"],
            "after_header": result["name"],
            "before": ("stopped" if action == "started" else "running") + "\n",
            "after": f"running ({action})\n",
        }
    return result


def main() -> None:
    run_module(ARGUMENT_SPEC, command, outcome)


if __name__ == "__main__":
    main()
