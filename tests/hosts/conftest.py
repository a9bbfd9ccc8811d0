"""Fixtures of the multi-host tests: the extracted bundle, three hosts made of namespaces
(lab.py), the existing cluster they install onto (a throw-away Kubernetes control plane on
the control host, whose one node is kwok's; run_control_plane.py), the node host's own
containerd, and the sample inventory pointed at them.

The inventory is inventories/sample's own group_vars and warren.yaml with the lab's hosts;
extra variables (and the object store's endpoint in warren.yaml) change only what a lab must:
its addresses, Warren's supervisor instead of systemd (no init system here), and a smaller
free-space floor.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import yaml
from lab import Lab

from warren.bundle.build import default_output
from warren.bundle.extract import extract

REPO = Path(__file__).resolve().parents[2]
BUNDLE_ON_HOSTS = "/opt/warren/bundle"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
SAMPLE_STORE = "http://10.0.20.5:19003"  # inventories/sample/warren.yaml's object store
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
        # An existing node has containerd running with its configuration (the gvisor role
        # adds its runtime there; Warren's images are imported into it).
        made.hosts["node"].shell("printf 'version = 3\\n' > /etc/containerd/config.toml", check=True)
        started = [_start_containerd(made, extracted)]
        try:
            started.append(_start_cluster(made, extracted))
            yield made
        finally:
            for process in reversed(started):
                process.terminate()
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()


def _in_host(made: Lab, name: str, argv: list[str], stdout: IO[str] | int) -> subprocess.Popen[str]:
    """A process inside a lab host's namespaces, its output (stderr too) to `stdout`."""
    host = made.hosts[name]
    assert host.sshd is not None
    return subprocess.Popen(
        ["nsenter", "-t", str(host.sshd.pid), "-n", "-m", "-u", "--", *argv],
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _start_containerd(made: Lab, extracted: Path) -> subprocess.Popen[str]:
    """The node's containerd (the bundle's build), on its usual socket, state in the node's
    own /var/lib/containerd and /run/containerd. No kubelet uses it: kwok plays the node."""
    node = made.hosts["node"]
    log = (node.root / "containerd.log").open("w")
    process = _in_host(
        made,
        "node",
        [str(extracted / "bin" / "cluster" / "containerd"), "--config", "/etc/containerd/config.toml"],
        log,
    )
    ctr = [f"{BUNDLE_ON_HOSTS}/bin/cluster/ctr", "--address", CONTAINERD_SOCKET, "version"]
    deadline = time.monotonic() + 60
    while node.run(ctr).returncode != 0:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(
                f"the node's containerd did not start: {(node.root / 'containerd.log').read_text()[-3000:]}"
            )
        time.sleep(0.5)
    return process


def _start_cluster(made: Lab, extracted: Path) -> subprocess.Popen[str]:
    """The throw-away control plane in the control host's namespaces (run_control_plane.py),
    its kwok node named like the node host."""
    process = _in_host(
        made,
        "control",
        [
            str(REPO / ".venv" / "bin" / "python"),
            str(Path(__file__).with_name("run_control_plane.py")),
            str(extracted / "bin" / "cluster"),
            "node",
        ],
        subprocess.PIPE,
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
    config: Path  # the sample's warren.yaml with the lab's addresses

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
    store = f"http://{address['store']}:19003"
    settings = yaml.safe_load((REPO / "inventories" / "sample" / "warren.yaml").read_text())
    assert settings["services"]["object_store_endpoint"] == SAMPLE_STORE, "the sample's store moved"
    settings["services"]["object_store_endpoint"] = store
    (inventory / "warren.yaml").write_text(yaml.safe_dump(settings))
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
                # The lab's hosts make new SSH host keys each run.
                "ansible_host_key_checking": False,
            },
        }
    }
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    overrides = {
        "service_manager": "supervisor",
        "preflight_min_free_gib": 1,
        "object_store_listen_address": address["store"],
        "postgres_listen_addresses": ["127.0.0.1", address["control"]],
        "postgres_url_host": address["control"],
        # The node's address: where pods' connections come from when the CNI masquerades them.
        "postgres_allowed_cidrs": ["127.0.0.1/32", f"{address['node']}/32"],
        "egress_floor_node_addresses": [address["node"]],
        "egress_floor_api_addresses": [address["control"]],
        # No guest runs under KVM on this machine (nested): microVMs are emulated here.
        "forkd_accel": "tcg",
    }
    (inventory / "lab.yml").write_text(yaml.safe_dump(overrides))
    return Site(lab, inventory / "hosts.yml", inventory / "lab.yml", inventory / "warren.yaml")
