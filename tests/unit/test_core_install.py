"""The warren package's core (configuration, rendering, apply, the host commands) installs and
imports without Ansible or pytest: Pulumi's environment and the hosts take only what they use,
and a command that needs an extra says which one."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest

from warren import ansible
from warren.cli import _needs_extra

REPO = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return requirement.split("==", maxsplit=1)[0].split("[", maxsplit=1)[0].strip().lower()


def test_ansible_core_and_pytest_are_extras_not_core_dependencies() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    assert not core & {"ansible-core", "pytest"}
    extras = project["optional-dependencies"]
    assert {_name(r) for r in extras["ansible"]} == {
        "ansible-core",
        "mitogen",
    }  # mitogen: the strategy plays run with
    assert {_name(r) for r in extras["conformance"]} == {"pytest"}


def test_the_core_and_the_cli_import_neither_ansible_nor_pytest() -> None:
    probe = (
        "import sys\n"
        "import warren.cli, warren.config, warren.render, warren.kube, warren.rollout\n"
        "import warren.store_secrets, warren.services.runner, warren.node.images\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ansible', 'pytest', '_pytest'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_a_command_without_its_extra_names_the_extra_and_the_fix() -> None:
    with pytest.raises(click.ClickException, match=r"warren\[conformance\]"):
        _needs_extra("conformance", "a_module_that_is_not_installed", "warren conformance")
    _needs_extra("conformance", "pytest", "warren conformance")  # installed here: no error


def test_playbooks_without_ansible_name_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ansible, "playbook_command", lambda *_a: [str(tmp_path / "ansible-playbook")])
    with pytest.raises(ansible.PlaybookError, match=r"warren\[ansible\]"):
        ansible.run_playbook("site.yml", {}, tmp_path / "vars.json", tmp_path / "log")
