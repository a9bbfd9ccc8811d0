"""Run Warren's own Ansible playbooks, so the local cluster uses the operators' code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
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


def run_playbook(playbook: str, extra_vars: dict[str, Any], log: Path, check: bool = False) -> str:
    """Run playbooks/<playbook> against the local inventory; returns its output."""
    base = ansible_dir()
    bin_dir = Path(sys.executable).parent
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="warren-vars-", delete=False) as handle:
        json.dump(extra_vars, handle)
        vars_file = handle.name
    argv = [
        str(bin_dir / "ansible-playbook"),
        "-i",
        str(base / "inventories" / "local" / "hosts.yml"),
        str(base / "playbooks" / playbook),
        "-e",
        f"@{vars_file}",
    ]
    if check:
        argv += ["--check", "--diff"]
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(base / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(base / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
    }
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=base, check=False)
    finally:
        Path(vars_file).unlink(missing_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        out.write(result.stdout + result.stderr)
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
        raise PlaybookError(f"ansible-playbook {playbook} failed (full output in {log}):\n{tail}")
    return result.stdout
