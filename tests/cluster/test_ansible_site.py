"""The platform as Ansible deployed it (tests/cluster/run.sh ran playbooks/site.yml with the
local inventory once): a second run changes nothing and restarts nothing, a `--check --diff`
run reports nothing to change, and the host is what the roles promise (testinfra): secrets
0600 in 0700 directories, every service running as its user, the object store, the database
and the control plane on loopback only, the control plane's records in PostgreSQL, and the
object store refusing anyone without its generated credentials."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import testinfra

from warren.config import ClusterConfig
from warren.controlplane.local import layout as control_layout
from warren.workspaces.local import blockd_env
from warren.workspaces.local import layout as workspaces_layout

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SERVICES = ("warren-objects", "warren-postgres", "warren-blockd", "warren-blockd-csi", "warren-control")
# Who each service runs as: root where it mounts (blockd) or holds root-only secrets.
USERS = {name: "postgres" if name == "warren-postgres" else "root" for name in SERVICES}
RECAP = re.compile(r"^localhost\s*:\s*(.*)$", re.MULTILINE)


def playbook(env: dict[str, str], *args: str) -> dict[str, int]:
    """Run site.yml on the local inventory as run.sh did; the PLAY RECAP's counters."""
    cmd = [
        str(Path(sys.executable).parent / "ansible-playbook"),
        "-i",
        "inventories/local/hosts.yml",
        "playbooks/site.yml",
        *args,
    ]
    run_env = {**env, "WARREN_CONFIG": env["WARREN_TEST_CONFIG"], "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    done = subprocess.run(
        cmd, cwd=REPO, env=run_env, capture_output=True, text=True, check=False, timeout=1800
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    found = RECAP.search(done.stdout)
    assert found, done.stdout[-2000:]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", found.group(1))}


def pids(state: Path) -> dict[str, int]:
    return {name: int(json.loads((state / "run" / f"{name}.json").read_text())["pid"]) for name in SERVICES}


@pytest.fixture(scope="module")
def host() -> Any:
    return testinfra.get_host("local://")


def test_a_second_run_changes_and_restarts_nothing(env: dict[str, str], state: Path) -> None:
    key = control_layout(state).api_key.read_text()
    before = pids(state)
    recap = playbook(env)
    assert recap["changed"] == 0 and recap["failed"] == 0, recap
    assert pids(state) == before
    assert control_layout(state).api_key.read_text() == key


def test_check_mode_finds_nothing_to_change(env: dict[str, str], state: Path) -> None:
    before = pids(state)
    recap = playbook(env, "--check", "--diff")
    assert recap["changed"] == 0 and recap["failed"] == 0, recap
    assert pids(state) == before


def test_secrets_are_private_and_services_run(host: Any, state: Path) -> None:
    plane, layer = control_layout(state), workspaces_layout(state)
    for directory in (plane.root, layer.objects, layer.blockd_state, layer.credentials.parent):
        assert host.file(str(directory)).mode == 0o700, directory
    for secret in (
        plane.api_key,
        plane.stamp_key,
        plane.kubeconfig,
        plane.root / "control.env",
        layer.credentials,
        layer.credentials.parent / "s3.json",
    ):
        found = host.file(str(secret))
        assert found.exists and found.user == "root" and found.mode == 0o600, secret
    for name in SERVICES:
        record = json.loads((state / "run" / f"{name}.json").read_text())
        assert host.process.get(pid=record["pid"]).user == USERS[name], name


def test_every_service_listens_on_loopback_only(host: Any, state: Path, settings: ClusterConfig) -> None:
    base = settings.workspaces.base_port
    wanted = [base, base + 3, settings.control_plane.edge_port, settings.control_plane.api_port]
    wanted.append(settings.database.port)
    for port in wanted:
        assert host.socket(f"tcp://127.0.0.1:{port}").is_listening, port
    # Every listener of every service (gRPC and admin ports included), found by its pid.
    ours = {int(json.loads((state / "run" / f"{name}.json").read_text())["pid"]): name for name in SERVICES}
    listeners = host.run("ss -Htlnp").stdout.splitlines()
    seen = 0
    for line in listeners:
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        owners = [ours[p] for p in pids if p in ours]
        if not owners:
            continue
        seen += 1
        address = line.split()[3].rsplit(":", 1)[0]
        assert address in {"127.0.0.1", "[::1]"}, f"{owners[0]} listens on {line.split()[3]}"
    assert seen >= len(wanted)


STORE_PROBE = """
import sys, boto3, botocore
from botocore.config import Config
endpoint, bucket, key, secret = sys.argv[1:5]
def attempt(**creds):
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds)
    try:
        s3.put_object(Bucket=bucket, Key="probe/attack", Body=b"x")
        s3.delete_object(Bucket=bucket, Key="probe/attack")
        return "accepted"
    except botocore.exceptions.ClientError as exc:
        return exc.response["Error"]["Code"]
print(attempt(aws_access_key_id=key, aws_secret_access_key=secret))
print(attempt(aws_access_key_id=key, aws_secret_access_key=secret + "x"))
print(attempt(aws_access_key_id="warren", aws_secret_access_key="warren-local-only"))
print(attempt(config=Config(signature_version=botocore.UNSIGNED)))
"""


def test_the_object_store_refuses_everyone_without_its_credentials(
    state: Path, settings: ClusterConfig
) -> None:
    creds = dict(
        line.split("=", 1)
        for line in workspaces_layout(state).credentials.read_text().splitlines()
        if "=" in line
    )
    endpoint = f"http://127.0.0.1:{settings.workspaces.s3_port}"
    done = subprocess.run(
        [
            str(blockd_env() / "bin" / "python"),
            "-c",
            STORE_PROBE,
            endpoint,
            settings.workspaces.bucket,
            creds["AWS_ACCESS_KEY_ID"],
            creds["AWS_SECRET_ACCESS_KEY"],
        ],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
    )
    right, forged, old_default, anonymous = done.stdout.split()
    assert right == "accepted"
    assert forged == "SignatureDoesNotMatch"
    assert old_default == "InvalidAccessKeyId"
    assert anonymous == "AccessDenied"


def test_the_records_are_in_postgresql(state: Path, settings: ClusterConfig) -> None:
    env_file = (control_layout(state).root / "control.env").read_text()
    assert f"@127.0.0.1:{settings.database.port}/" in env_file
    assert env_file.startswith("# Managed") and "WARREN_DATABASE_URL=postgresql+psycopg://" in env_file
    assert not (control_layout(state).root / "records.db").exists()
