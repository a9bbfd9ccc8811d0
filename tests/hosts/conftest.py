"""Fixtures of the multi-host tests: the extracted bundle, three hosts made of namespaces
(lab.py) with a throw-away Kubernetes control plane on one of them, and the sample
inventory pointed at them.

The inventory is inventories/sample's own group_vars with the lab's hosts; extra variables
change only what a lab must: its addresses, Warren's supervisor instead of systemd (no
init system here), and a smaller free-space floor.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from lab import Lab

from warren.bundle.build import default_output
from warren.bundle.extract import extract

REPO = Path(__file__).resolve().parents[2]
BUNDLE_ON_HOSTS = "/opt/warren/bundle"
HOSTS = ("store", "control", "node")  # 10.77.0.2, .3, .4; node is also the KVM host
RESULTS = REPO / "test-results"
RECAP = re.compile(
    r"^(?P<host>\S+)\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


@pytest.fixture(scope="session")
def extracted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    archive = Path(os.environ.get("WARREN_BUNDLE") or default_output(REPO))
    if not archive.is_file():
        pytest.fail(f"no bundle at {archive}: run `make hosts-test` (it builds one) or set WARREN_BUNDLE")
    dest = tmp_path_factory.mktemp("bundle") / "extracted"
    extract(archive, dest)
    return dest


@pytest.fixture(scope="session")
def lab(extracted: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests create namespaces and run sshd: run them as root")
    with Lab(tmp_path_factory.mktemp("lab") / "hosts", HOSTS, bind={extracted: BUNDLE_ON_HOSTS}) as made:
        # An existing node has containerd's configuration (the gvisor role adds its runtime).
        made.hosts["node"].shell("printf 'version = 3\\n' > /etc/containerd/config.toml", check=True)
        cluster = _start_cluster(made, extracted)
        try:
            yield made
        finally:
            cluster.terminate()
            try:
                cluster.wait(timeout=60)
            except subprocess.TimeoutExpired:
                cluster.kill()


def _start_cluster(made: Lab, extracted: Path) -> subprocess.Popen[str]:
    """The throw-away API server in the control host's namespaces (run_control_plane.py)."""
    control = made.hosts["control"]
    assert control.sshd is not None
    process = subprocess.Popen(
        [
            "nsenter",
            "-t",
            str(control.sshd.pid),
            "-n",
            "-m",
            "-u",
            "--",
            str(REPO / ".venv" / "bin" / "python"),
            str(Path(__file__).with_name("run_control_plane.py")),
            str(extracted / "bin" / "cluster"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if line.strip() != "ready":
        process.kill()
        pytest.fail(f"the control host's API server did not start: {line}{process.stdout.read()}")
    return process


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str

    def recap(self) -> dict[str, dict[str, int]]:
        found = {
            m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
            for m in RECAP.finditer(self.output)
        }
        assert found, f"no PLAY RECAP in:\n{self.output[-4000:]}"
        return found


@dataclass(frozen=True)
class Site:
    """site.yml run from the controller's namespace against the lab inventory."""

    lab: Lab
    inventory: Path
    overrides: Path

    def run(self, *args: str, log: str | None = None) -> Run:
        done = self.lab.controller(
            [
                REPO / ".venv" / "bin" / "ansible-playbook",
                "-i",
                self.inventory,
                "-e",
                f"@{self.overrides}",
                "playbooks/site.yml",
                *args,
            ],
            env={
                "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
                "ANSIBLE_FORCE_COLOR": "0",
                "PIP_CONFIG_FILE": os.devnull,
            },
            cwd=REPO,
        )
        output = done.stdout + done.stderr
        if log:
            RESULTS.mkdir(exist_ok=True)
            (RESULTS / log).write_text(output)
        return Run(done.returncode, output)


@pytest.fixture(scope="session")
def site(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Site:
    inventory = tmp_path_factory.mktemp("inventory")
    shutil.copytree(REPO / "inventories" / "sample" / "group_vars", inventory / "group_vars")
    address = {name: host.address for name, host in lab.hosts.items()}
    ssh_args = " ".join(lab.ssh_args())
    hosts = {
        "all": {
            "children": {
                "warren_nodes": {"hosts": {"node": {"ansible_host": address["node"]}}},
                "warren_control_plane": {"hosts": {"control": {"ansible_host": address["control"]}}},
                "warren_database": {"hosts": {"control": None}},
                "warren_object_store": {"hosts": {"store": {"ansible_host": address["store"]}}},
                "warren_kvm_hosts": {"hosts": {"node": None}},
            },
            "vars": {
                "ansible_user": "root",
                "ansible_ssh_common_args": ssh_args,
                "ansible_python_interpreter": "/usr/bin/python3",
            },
        }
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    store = f"http://{address['store']}:19003"
    overrides = {
        "service_manager": "supervisor",
        "preflight_min_free_gib": 1,
        "object_store_listen_address": address["store"],
        "blockd_s3_endpoint": store,
        "control_plane_host": address["control"],
        "control_plane_workspace_endpoint": store,
        "egress_floor_node_addresses": [address["node"]],
        "egress_floor_api_addresses": [address["control"]],
        # No guest runs under KVM on this machine (nested): microVMs are emulated here.
        "forkd_accel": "tcg",
    }
    (inventory / "lab.yml").write_text(yaml.safe_dump(overrides))
    return Site(lab, inventory / "hosts.yml", inventory / "lab.yml")
