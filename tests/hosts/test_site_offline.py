"""site.yml with the sample inventory onto three hosts (lab.py) from the extracted bundle,
with no network: the hosts and the controller have no route but to each other and no apt
source but the bundle's, and pip installs with no index.

In order: a tampered bundle is refused on every host before any host changes; the first run
installs everything (log: test-results/hosts-site-first-run.log); a second run and a
--check --diff run change nothing; then what the deployment must be across hosts: the object
store's credentials made on its host and copied to the others, listeners on the hosts'
addresses, the workspace daemon on the node storing into the store host's SeaweedFS, the
control plane answering the node over the LAN with its records in PostgreSQL, and
warren-forkd on the node booting, snapshotting and branching a microVM whose kernel comes from
the bundle's copy of Debian's package.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import BUNDLE_ON_HOSTS, HOSTS, Site
from lab import Host, Lab

pytestmark = pytest.mark.hosts

STORE_CREDENTIALS = "/etc/warren/object-store/credentials.env"
CONTROL_STATE = "/var/lib/warren/control-plane"


def _tampered(extracted: Path, dest: Path) -> Path:
    """A copy of the bundle (hard links) with one file changed and one added."""
    shutil.copytree(extracted, dest, copy_function=os.link)
    pause = dest / "images" / "pause.tar"
    data = pause.read_bytes()
    pause.unlink()  # a new file: the hard-linked original stays intact
    pause.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    (dest / "wheels" / "extra.txt").write_text("not in the manifest\n")
    return dest


def _changes(lab: Lab) -> dict[str, list[str]]:
    """What each host has under Warren's paths besides the bundle, and Warren's processes."""
    found = {}
    for name, host in lab.hosts.items():
        files = host.shell(
            "ls -A /etc/warren /var/lib/warren /etc/apt/sources.list.d /etc/systemd/system;"
            " ls -A /opt/warren | grep -vx bundle"
        ).stdout.split()
        pids = subprocess.run(
            ["ip", "netns", "pids", host.namespace], check=False, capture_output=True, text=True
        ).stdout.split()
        names = [
            Path(f"/proc/{pid}/comm").read_text().strip() for pid in pids if Path(f"/proc/{pid}").exists()
        ]
        found[name] = [f for f in files if not f.endswith(":")] + [
            n for n in names if any(w in n for w in ("weed", "postgres", "warren"))
        ]
    return found


def test_a_tampered_bundle_is_refused_before_any_host_changes(
    site: Site, extracted: Path, tmp_path: Path
) -> None:
    tampered = _tampered(extracted, tmp_path / "tampered")
    run = site.run("-e", f"preflight_bundle={tampered}", log="hosts-site-tampered.log")
    assert run.returncode != 0, run.output[-3000:]
    assert "does not match its manifest" in run.output
    assert "changed  images/pause.tar" in run.output and "extra    wheels/extra.txt" in run.output
    assert "Warren | The bundle's packages" not in run.output, "a play after preflight ran"
    assert _changes(site.lab) == {name: [] for name in HOSTS}


def test_the_first_run_installs_everything_from_the_bundle(site: Site) -> None:
    run = site.run(log="hosts-site-first-run.log")
    assert run.returncode == 0, run.output[-6000:]
    recap = run.recap()
    assert set(recap) == set(HOSTS)
    for host, counts in recap.items():
        assert counts["failed"] == 0 and counts["unreachable"] == 0, (host, counts)
        assert counts["changed"] > 0, (host, counts)
    assert f"API endpoint: http://{site.lab.hosts['control'].address}:8080" in run.output


def test_a_second_run_changes_nothing(site: Site) -> None:
    run = site.run(log="hosts-site-second-run.log")
    assert run.returncode == 0, run.output[-6000:]
    assert {host: counts["changed"] for host, counts in run.recap().items()} == dict.fromkeys(HOSTS, 0)


def test_check_mode_finds_nothing_to_change(site: Site) -> None:
    run = site.run("--check", "--diff", log="hosts-site-check.log")
    assert run.returncode == 0, run.output[-6000:]
    assert {host: counts["changed"] for host, counts in run.recap().items()} == dict.fromkeys(HOSTS, 0)


def test_no_host_has_a_route_out_or_a_source_but_the_bundle(lab: Lab) -> None:
    for name, host in lab.hosts.items():
        assert host.run(["ip", "route", "get", "1.1.1.1"]).returncode != 0, name
        sources = host.shell("cat /etc/apt/sources.list.d/*; apt-get indextargets --format '$(SITE)'").stdout
        sites = {
            line for line in sources.splitlines() if line and not line.startswith("#") and "deb " not in line
        }
        assert sites == {f"file:{BUNDLE_ON_HOSTS}/debs"}, (name, sources)
        assert f"deb [trusted=yes] file:{BUNDLE_ON_HOSTS}/debs ./" in sources, name
    assert lab.controller(["ip", "route", "get", "1.1.1.1"]).returncode != 0


def test_the_store_credentials_are_made_on_its_host_and_copied_private(lab: Lab) -> None:
    made = lab.hosts["store"].run(["cat", STORE_CREDENTIALS], check=True).stdout
    assert "AWS_ACCESS_KEY_ID=" in made and "AWS_SECRET_ACCESS_KEY=" in made
    for name in ("control", "node"):
        host = lab.hosts[name]
        assert host.run(["cat", STORE_CREDENTIALS], check=True).stdout == made, name
        assert host.run(["stat", "-c", "%a %U", STORE_CREDENTIALS], check=True).stdout.split() == [
            "600",
            "root",
        ]


def _listening(host_ss: str) -> set[str]:
    """The local address:port of every listening TCP socket (`ss -Hltn`)."""
    return {line.split()[3] for line in host_ss.splitlines() if line.strip()}


def test_services_listen_on_their_hosts_addresses(lab: Lab) -> None:
    store, control = lab.hosts["store"], lab.hosts["control"]
    for host in lab.hosts.values():
        local = _listening(host.run(["ss", "-Hltn"], check=True).stdout)
        wildcard = {a for a in local if a.startswith(("0.0.0.0:", "*:", "[::]:"))}
        assert not wildcard, (host.name, sorted(local))
    assert f"{store.address}:19003" in _listening(store.run(["ss", "-Hltn"], check=True).stdout)
    local = _listening(control.run(["ss", "-Hltn"], check=True).stdout)
    assert f"{control.address}:8080" in local
    assert "127.0.0.1:5432" in local  # PostgreSQL, for the control plane on the same host only
    assert f"{control.address}:5432" not in local


def test_the_node_daemon_reaches_the_store_host_with_the_copied_credentials(lab: Lab) -> None:
    node, store = lab.hosts["node"], lab.hosts["store"]
    stats = node.run(["/opt/warren/blockd/bin/warren-blockd", "--socket=/run/warren/blockd.sock", "stats"])
    assert stats.returncode == 0, stats.stderr
    # With the node's copy of the credentials and its environment's boto3, over the LAN.
    listed = node.shell(
        f"set -a; . {STORE_CREDENTIALS}; /opt/warren/blockd/bin/python -c '"
        'import boto3, sys; s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1");'
        ' print(s3.head_bucket(Bucket="warren-workspaces")["ResponseMetadata"]["HTTPStatusCode"])\''
        f" http://{store.address}:19003"
    )
    assert listed.returncode == 0 and listed.stdout.strip() == "200", (listed.stdout, listed.stderr)


def test_the_control_plane_answers_the_node_with_records_in_postgresql(lab: Lab) -> None:
    control, node = lab.hosts["control"], lab.hosts["node"]
    key = control.run(["cat", f"{CONTROL_STATE}/api-key"], check=True).stdout.strip()
    url = f"http://{control.address}:8080/v1/sandboxes"
    answered = node.run(["curl", "-fsS", "-H", f"Authorization: Bearer {key}", url])
    assert answered.returncode == 0 and '"items"' in answered.stdout, answered.stderr
    refused = node.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url])
    assert refused.stdout == "401"
    env_file = control.run(["cat", f"{CONTROL_STATE}/control.env"], check=True).stdout
    assert "WARREN_DATABASE_URL=postgresql+psycopg://" in env_file and "@127.0.0.1:5432/" in env_file
    keys = control.run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            "psql",
            "-h",
            "/var/lib/warren/postgres-socket",
            "-d",
            "warren",
            "-Atc",
            "select count(*) from api_keys",
        ]
    )
    assert keys.returncode == 0 and int(keys.stdout) >= 1, keys.stderr


def _forkd(host: Host, method: str, path: str, body: dict[str, object] | None = None) -> dict[str, Any]:
    argv = ["curl", "-sS", "--max-time", "600", "--unix-socket", "/run/warren/forkd/api.sock", "-X", method]
    if body is not None:
        argv += ["-H", "Content-Type: application/json", "--data", json.dumps(body)]
    done = host.run([*argv, f"http://forkd{path}"], timeout=660)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_the_microvm_daemon_branches_guests_from_the_bundle_kernel(lab: Lab) -> None:
    node = lab.hosts["node"]
    assert _forkd(node, "GET", "/healthz") is not None
    # Built on the node with no network: the guest kernel comes from the bundle's debs/.
    template = _forkd(node, "POST", "/v1/templates", {"name": "lab", "mem_mib": 128})
    assert template.get("name") == "lab", template
    vm = _forkd(node, "POST", "/v1/vms", {"template": "lab", "id": "parent"})
    assert vm.get("id") == "parent", vm
    snap = _forkd(node, "POST", "/v1/vms/parent/snapshot", {"id": "snap"})
    assert snap.get("disk_generation"), snap
    branched = _forkd(node, "POST", "/v1/snapshots/snap/branch", {"count": 2, "ids": ["a", "b"]})
    assert [c["ok"] for c in branched["children"]] == [True, True], branched
    try:
        randoms = []
        for child in ("a", "b"):
            ran = _forkd(
                node, "POST", f"/v1/vms/{child}/exec", {"command": "head -c 16 /dev/urandom | od -An -tx1"}
            )
            assert ran["rc"] == 0, ran
            randoms.append(ran["output"])
        assert randoms[0] != randoms[1]
    finally:
        for vm_id in ("a", "b", "parent"):
            _forkd(node, "POST", f"/v1/vms/{vm_id}/stop")
    cached = node.shell("ls /var/cache/warren/forkd/kernels").stdout.split()
    assert len(cached) == 1 and cached[0].endswith("-amd64"), cached
