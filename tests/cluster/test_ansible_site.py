"""The platform as Ansible deployed it (tests/cluster/run.sh ran playbooks/site.yml with the
local inventory once): a second run changes nothing and restarts nothing (no cluster process,
no pod of warren-system), a `--check --diff` run reports nothing to change, the credentials
on the host are private, the object store refuses anyone without its generated credentials,
and the control plane's records are in the embedded PostgreSQL."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import testinfra
from conftest import COMPONENTS

from warren.controlplane.local import layout as control_layout
from warren.workspaces.local import blockd_env

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SYSTEM = "warren-system"
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


def kubectl(state: Path, *args: str) -> str:
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(state / "admin.kubeconfig"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def processes(state: Path) -> dict[str, int]:
    """The cluster's own processes (supervised) by name, with their pids."""
    return {p.stem: int(json.loads(p.read_text())["pid"]) for p in (state / "run").glob("*.json")}


def pods(state: Path) -> dict[str, tuple[str, int]]:
    """warren-system's pods: name -> (uid, restarts of all its containers)."""
    found = json.loads(kubectl(state, "-n", SYSTEM, "get", "pods", "-o", "json"))["items"]
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(c.get("restartCount", 0) for c in p["status"].get("containerStatuses", [])),
        )
        for p in found
        if p["status"].get("phase") != "Succeeded"  # the install Job's finished pod
    }


def secret(state: Path, name: str) -> dict[str, str]:
    data = json.loads(kubectl(state, "-n", SYSTEM, "get", "secret", name, "-o", "json"))["data"]
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


@pytest.fixture(scope="module")
def host() -> Any:
    return testinfra.get_host("local://")


def test_a_second_run_changes_and_restarts_nothing(env: dict[str, str], state: Path) -> None:
    key = control_layout(state).api_key.read_text()
    before = (processes(state), pods(state))
    recap = playbook(env)
    assert recap["changed"] == 0 and recap["failed"] == 0, recap
    assert (processes(state), pods(state)) == before
    assert control_layout(state).api_key.read_text() == key


def test_check_mode_finds_nothing_to_change(env: dict[str, str], state: Path) -> None:
    before = (processes(state), pods(state))
    recap = playbook(env, "--check", "--diff")
    assert recap["changed"] == 0 and recap["failed"] == 0, recap
    assert (processes(state), pods(state)) == before


def test_the_host_keeps_only_the_cluster_and_private_records(host: Any, state: Path) -> None:
    """Warren's services are pods: the host supervises only the cluster's own processes, and
    keeps only where the API answers and its first key, readable by root alone."""
    assert set(processes(state)) == set(COMPONENTS)
    records = control_layout(state)
    assert host.file(str(records.root)).mode == 0o700
    for private in (records.api_key, records.url):
        found = host.file(str(private))
        assert found.exists and found.user == "root" and found.mode == 0o600, private
    assert secret(state, "warren-first-key")["key"] == records.api_key.read_text().strip()


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


def test_the_object_store_refuses_everyone_without_its_credentials(state: Path) -> None:
    """The embedded SeaweedFS, through its Service (what the workloads use), with the
    credentials the install Job generated, a forged signature, a guessable pair, none."""
    creds = secret(state, "warren-object-store")
    address = kubectl(
        state, "-n", SYSTEM, "get", "service", "warren-objects", "-o", "jsonpath={.spec.clusterIP}"
    )
    done = subprocess.run(
        [
            str(blockd_env() / "bin" / "python"),
            "-c",
            STORE_PROBE,
            f"http://{address}:8333",
            "warren-workspaces",
            creds["AWS_ACCESS_KEY_ID"],
            creds["AWS_SECRET_ACCESS_KEY"],
        ],
        capture_output=True,
        text=True,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
    )
    right, forged, guessed, anonymous = done.stdout.split()
    assert right == "accepted"
    assert forged == "SignatureDoesNotMatch"
    assert guessed == "InvalidAccessKeyId"
    assert anonymous == "AccessDenied"


COUNT_KEYS = (
    'PGPASSWORD="$(cat /etc/warren/postgres/password)" /usr/lib/postgresql/15/bin/psql'
    " -h /var/run/postgresql -U postgres -d postgres -Atc 'select count(*) from api_keys'"
)


def test_the_records_are_in_the_embedded_postgresql(state: Path) -> None:
    url = secret(state, "warren-database")["url"]
    assert url.startswith("postgresql+psycopg://") and f"@warren-postgres.{SYSTEM}.svc:5432/" in url
    counted = kubectl(
        state, "-n", SYSTEM, "exec", "statefulset/warren-postgres", "--", "sh", "-c", COUNT_KEYS
    )
    assert int(counted) >= 1
