"""Running the `warren` CLI from the collection's modules.

Each module builds one `warren ...` command line with the CLI's machine-readable flag
(`--json`; `service up` prints JSON always) and reads the JSON document the CLI prints as its
last line of standard output: progress goes to standard error. This file is the one place
that reads that output, so the roles no longer parse it themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

WARREN_OPTION: dict[str, Any] = {"type": "str", "default": "warren"}


class OutputError(ValueError):
    """The CLI ended well but printed no JSON document to read."""


def last_json(stdout: str) -> dict[str, Any]:
    """The JSON object on the last non-empty line of `stdout`."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise OutputError("the warren command printed nothing on standard output")
    try:
        document = json.loads(lines[-1])
    except ValueError:
        raise OutputError(f"the warren command's last line is not JSON: {lines[-1][:200]!r}") from None
    if not isinstance(document, dict):
        raise OutputError(f"the warren command's last line is not a JSON object: {lines[-1][:200]!r}")
    return document


def with_config(argv: list[str], config: str | None) -> list[str]:
    """`--config FILE` appended when a configuration file is named (empty: the defaults)."""
    return [*argv, "--config", config] if config else argv


def run_json(module: Any, argv: list[str], data: str | None = None, cwd: str | None = None) -> dict[str, Any]:
    """Run `argv` (stdin `data`), fail the task with its standard error if it fails, and
    return the JSON document it printed last."""
    rc, out, err = module.run_command(argv, data=data, cwd=cwd, binary_data=False)
    if rc != 0:
        message = err.strip().splitlines()[-1] if err.strip() else f"{argv[0]} exited with {rc}"
        module.fail_json(msg=message, rc=rc, cmd=argv, stdout=out, stderr=err)
    try:
        return last_json(out)
    except OutputError as exc:
        module.fail_json(msg=str(exc), rc=rc, cmd=argv, stdout=out, stderr=err)
        raise  # fail_json exits; this is for type checkers


def listing(prefix: str, names: list[str]) -> str:
    """A diff's prepared text: one line per name."""
    return "".join(f"{prefix} {name}\n" for name in names)


def run_module(
    argument_spec: dict[str, Any],
    command: Callable[[dict[str, Any], bool], list[str]],
    outcome: Callable[[dict[str, Any], bool], dict[str, Any]],
) -> None:
    """A module's whole run: its command (check mode passed on), the document it prints, the
    task's result from that (a diff when asked)."""
    from ansible.module_utils.basic import AnsibleModule

    module = AnsibleModule(argument_spec=argument_spec, supports_check_mode=True)
    argv = command(module.params, module.check_mode)
    if module.check_mode and Path(argv[0]).is_absolute() and not Path(argv[0]).exists():
        # Check mode on a host the run has not installed yet: the install's task was only
        # planned, so everything after it would change too.
        module.exit_json(changed=True, msg=f"{argv[0]} is not installed yet; the run installs it first")
    document = run_json(module, argv)
    module.exit_json(**outcome(document, module._diff))
