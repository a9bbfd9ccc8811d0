"""Run Warren's own Ansible playbooks, so the local cluster uses the operators' code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


class PlaybookError(RuntimeError):
    pass


def ansible_dir() -> Path:
    """The directory holding ansible.cfg, roles/, playbooks/ and inventories/: inside an
    installed wheel (warren/ansible), or the repository top."""
    packaged = Path(__file__).parent / "ansible"
    if (packaged / "playbooks").is_dir():
        return packaged
    return Path(__file__).resolve().parents[2]


def playbook_command(playbook: str, vars_file: Path, check: bool = False) -> list[str]:
    """The ansible-playbook command line for playbooks/<playbook> on the local inventory."""
    base = ansible_dir()
    argv = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        str(base / "inventories" / "local" / "hosts.yml"),
        str(base / "playbooks" / playbook),
        "-e",
        f"@{vars_file}",
    ]
    if check:
        argv += ["--check", "--diff"]
    return argv


def playbook_env() -> dict[str, str]:
    base = ansible_dir()
    bin_dir = Path(sys.executable).parent
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(base / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(base / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
    }


def run_playbook(
    playbook: str, extra_vars: dict[str, Any], vars_file: Path, log: Path, check: bool = False
) -> str:
    """Run playbooks/<playbook> against the local inventory with `extra_vars` (kept in
    `vars_file`, so an operator can rerun exactly this); returns its output."""
    vars_file.parent.mkdir(parents=True, exist_ok=True)
    vars_file.write_text(json.dumps(extra_vars, indent=2, sort_keys=True))
    argv = playbook_command(playbook, vars_file, check)
    if not Path(argv[0]).is_file():
        raise PlaybookError(
            f"{argv[0]} is missing: the playbooks need warren's `ansible` extra in this environment "
            "(pip install 'warren[ansible]')"
        )
    result = subprocess.run(
        argv, capture_output=True, text=True, env=playbook_env(), cwd=ansible_dir(), check=False
    )
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(result.stdout + result.stderr)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
        raise PlaybookError(f"ansible-playbook {playbook} failed (full output in {log}):\n{tail}")
    return result.stdout
