"""site.yml with the sample inventory onto three hosts (lab.py) from the extracted bundle,
with no network: the hosts and the controller have no route but to each other and no apt
source but the bundle's, and pip installs with no index.

The existing cluster is a throw-away control plane on the control host (run_control_plane.py)
whose one node is kwok's, named like the node host: Warren's workloads are scheduled there
and roll out (their pods turn Ready, the install Job's pod succeeds), but nothing runs in
them, so no warren-first-key is made and no pod dials a store. That they run is the local
cluster tier's proof (tests/cluster, tests/workloads: the same objects on a real kubelet).
What this test proves is the sample path itself. The node host runs a real containerd (the
bundle's), the one its kubelet would use.

In order: a tampered bundle is refused on every host before any host changes; the first run
installs everything (log: test-results/hosts-site-first-run.log); a second run and a
--check --diff run change nothing. Then: the cluster holds exactly the objects `warren
render` makes of the sample configuration, pinned by the digests the bundle's manifest
records; the node's containerd holds those images by name and by digest (and not the
embedded stores'); the stores' Secrets hold the credentials generated on the store and
database hosts, and no run's log shows them; the edge's URL is recorded on the control host;
no Warren service but the stores runs on any host, and the credentials were copied nowhere;
the host stores listen where pods reach them and refuse anyone without credentials; rotated
database credentials update the Secret and restart its readers; warren-forkd on the node
boots, snapshots and branches a microVM whose kernel comes from the bundle's copy of Debian's
package.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from conftest import BUNDLE_ON_HOSTS, CONTAINERD_SOCKET, HOSTS, REPO, RESULTS, Site
from lab import Host, Lab

from warren.bundle.workloads import for_bundle
from warren.config import SYSTEM_NAMESPACE, load_config
from warren.render import render

pytestmark = pytest.mark.hosts

STORE_CREDENTIALS = "/etc/warren/object-store/credentials.env"
DATABASE_URL = "/etc/warren/postgres/url"
RECORD = "/etc/warren/control-plane"
KUBECTL = f"{BUNDLE_ON_HOSTS}/bin/cluster/kubectl"
CTR = f"{BUNDLE_ON_HOSTS}/bin/cluster/ctr"
ADMIN = "/etc/kubernetes/admin.conf"
PSQL = "/usr/lib/postgresql/15/bin/psql"
# The warren-blockd environment of this checkout: a boto3 to sign S3 requests with (the hosts
# have none: warren-blockd runs in its image, not on them).
BOTO_PYTHON = REPO / "packages" / "warren-blockd" / ".venv" / "bin" / "python"
HOST_SERVICES = ("warren-control", "warren-blockd")  # must not run on any host


def _tampered(extracted: Path, dest: Path) -> Path:
    """A copy of the bundle (hard links) with one file changed and one added."""
    shutil.copytree(extracted, dest, copy_function=os.link)
    pause = dest / "images" / "pause.tar"
    data = pause.read_bytes()
    pause.unlink()  # a new file: the hard-linked original stays intact
    pause.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    (dest / "wheels" / "extra.txt").write_text("not in the manifest\n")
    return dest


def _processes(host: Host) -> list[list[str]]:
    """The command line of every process in the host's network namespace."""
    pids = subprocess.run(
        ["ip", "netns", "pids", host.namespace], check=False, capture_output=True, text=True
    ).stdout.split()
    found = []
    for pid in pids:
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0"))
        except OSError:
            continue  # it exited meanwhile
    return found


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


def _kubectl(lab: Lab, *args: str) -> Any:
    """kubectl on the control host as the cluster's admin, its JSON output parsed."""
    done = lab.hosts["control"].run([KUBECTL, "--kubeconfig", ADMIN, *args, "-o", "json"], check=True)
    return json.loads(done.stdout)


def _secret(lab: Lab, name: str) -> dict[str, str]:
    data = _kubectl(lab, "-n", SYSTEM_NAMESPACE, "get", "secret", name)["data"]
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def _env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


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
    edge = _kubectl(site.lab, "-n", SYSTEM_NAMESPACE, "get", "service", "warren-control")["spec"]["clusterIP"]
    assert f"API endpoint: http://{edge}:8080" in run.output
    assert "API key:      none recorded" in run.output  # kwok ran no install Job


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


# -- the workloads ---------------------------------------------------------------------------


def _differences(rendered: Any, live: Any, where: str = "") -> list[str]:
    """Where `live` does not hold what `rendered` says (the server adds defaults; what was
    sent must be there as sent)."""
    if isinstance(rendered, dict):
        if not isinstance(live, dict):
            return [f"{where}: {live!r} is not a mapping"]
        found = []
        for key, value in rendered.items():
            if key not in live:
                if value not in ({}, [], None):  # the server omits an empty field
                    found.append(f"{where}.{key}: missing")
                continue
            found += _differences(value, live[key], f"{where}.{key}")
        return found
    if isinstance(rendered, list):
        if not isinstance(live, list) or len(live) != len(rendered):
            return [f"{where}: {live!r} is not {rendered!r}"]
        return [
            d
            for i, (r, v) in enumerate(zip(rendered, live, strict=True))
            for d in _differences(r, v, f"{where}[{i}]")
        ]
    # A quantity written as a number comes back as its string.
    return (
        [] if rendered == live or str(rendered) == str(live) else [f"{where}: {live!r} is not {rendered!r}"]
    )


def test_the_cluster_holds_what_warren_renders_for_the_sample_pinned_by_the_bundle(
    site: Site, extracted: Path, tmp_path: Path
) -> None:
    pins = json.loads((extracted / "manifest.json").read_text())["pins"]["images"]
    config = for_bundle(load_config(site.config), extracted)
    tag = config.services.image_tag
    assert config.services.image_digests == {
        service: pins[f"warren.dev/{service}:{tag}"]
        for service in ("warren-control", "warren-blockd", "agent", "base")
    }
    objects = render(config)
    assert {o["kind"] for o in objects} >= {"Deployment", "DaemonSet", "Job", "ValidatingAdmissionPolicy"}
    assert "Secret" not in {o["kind"] for o in objects}
    wanted = tmp_path / "rendered.yaml"  # /tmp: the control host sees it too
    wanted.write_text(yaml.safe_dump_all(objects))
    wanted.chmod(0o644)
    live = _kubectl(site.lab, "get", "-f", str(wanted))["items"]
    assert len(live) == len(objects)
    for rendered, found in zip(objects, live, strict=True):
        label = f"{rendered['kind']} {rendered['metadata']['name']}"
        assert _differences(rendered, found, label) == []
    containers = [
        container
        for found in live
        if found["kind"] in ("Deployment", "DaemonSet", "Job")
        for container in found["spec"]["template"]["spec"]["containers"]
    ]
    images = {c["image"] for c in containers}
    # And what the control plane delivers into sandboxes: the agent and the base template.
    for arg in (a for c in containers for a in c.get("args", [])):
        if arg.startswith("--agent-image="):
            images.add(arg.split("=", 1)[1])
        elif arg.startswith("--template="):
            images.add(arg.split("=", 2)[2])
    assert images == {
        f"warren.dev/{service}:{tag}@{digest}" for service, digest in config.services.image_digests.items()
    }


def test_the_nodes_containerd_holds_the_images_by_name_and_by_digest(lab: Lab, extracted: Path) -> None:
    """Both names pinned for the CRI: the kubelet's image garbage collection must never
    remove an image that no registry here could give back."""
    pins = json.loads((extracted / "manifest.json").read_text())["pins"]["images"]
    listed = lab.hosts["node"].run(
        [CTR, "--address", CONTAINERD_SOCKET, "-n", "k8s.io", "images", "ls"], check=True
    )
    # REF TYPE DIGEST SIZE (two words) PLATFORMS LABELS
    held = {
        cols[0]: (cols[2], cols[-1].split(","))
        for cols in (line.split() for line in listed.stdout.splitlines()[1:])
        if len(cols) > 3
    }
    # Warren's services, the agent every sandbox gets and the base template.
    for service in ("warren-control", "warren-blockd", "agent", "base"):
        name = next(n for n in pins if n.startswith(f"warren.dev/{service}:"))
        by_digest = f"{name.rsplit(':', 1)[0]}@{pins[name]}"
        for ref in (name, by_digest):
            assert ref in held, (ref, held)
            digest, labels = held[ref]
            assert digest == pins[name], ref
            assert "io.cri-containerd.pinned=pinned" in labels, (ref, labels)
    # The stores are the hosts' (stores: external): their images are not needed on the node.
    assert not [n for n in held if "seaweedfs" in n or "postgres" in n], held


def test_the_stores_secrets_hold_the_host_stores_credentials_and_no_log_shows_them(lab: Lab) -> None:
    control, store = lab.hosts["control"], lab.hosts["store"]
    url = control.run(["cat", DATABASE_URL], check=True).stdout.strip()
    assert _secret(lab, "warren-database") == {"url": url}
    assert urlsplit(url).hostname == control.address  # where pods reach it, not loopback
    credentials = _env(store.run(["cat", STORE_CREDENTIALS], check=True).stdout)
    assert _secret(lab, "warren-object-store") == {
        key: credentials[key] for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    values = [urlsplit(url).password or "", credentials["AWS_SECRET_ACCESS_KEY"]]
    logs = sorted(RESULTS.glob("hosts-site-*.log"))
    assert len(logs) >= 3  # the first and second runs and check mode at least
    for log in logs:
        text = log.read_text()
        assert not [value for value in values if value and value in text], log


def test_the_edge_is_recorded_on_the_control_host(lab: Lab) -> None:
    control = lab.hosts["control"]
    edge = _kubectl(lab, "-n", SYSTEM_NAMESPACE, "get", "service", "warren-control")["spec"]["clusterIP"]
    assert control.run(["cat", f"{RECORD}/url"], check=True).stdout == f"http://{edge}:8080\n"
    assert control.run(["stat", "-c", "%a", RECORD], check=True).stdout.strip() == "700"
    # No install Job ran (kwok's pods run nothing), so there is no first key to record.
    assert control.run(["test", "-e", f"{RECORD}/api-key"]).returncode != 0


def test_no_warren_service_but_the_stores_runs_on_any_host(lab: Lab) -> None:
    for name, host in lab.hosts.items():
        running = [
            argv for argv in _processes(host) if any(Path(arg).name in HOST_SERVICES for arg in argv[:2])
        ]
        assert running == [], name
        units = host.shell("ls /etc/systemd/system; ls /opt/warren").stdout.split()
        assert not [u for u in units if u.startswith(HOST_SERVICES) or u in ("control", "blockd")], (
            name,
            units,
        )
    # The stores' credentials stay on their hosts: the cluster has them as Secrets.
    for name in ("control", "node"):
        assert lab.hosts[name].run(["test", "-e", STORE_CREDENTIALS]).returncode != 0, name
    store = lab.hosts["store"]
    assert store.run(["stat", "-c", "%a %U", STORE_CREDENTIALS], check=True).stdout.split() == ["600", "root"]


def _listening(host_ss: str) -> set[str]:
    """The local address:port of every listening TCP socket (`ss -Hltn`)."""
    return {line.split()[3] for line in host_ss.splitlines() if line.strip()}


def _psql(host: Host, url: str) -> subprocess.CompletedProcess[str]:
    """`select 1` as the URL's user, with its password if it has one, never prompting."""
    parts = urlsplit(url)
    password = f"PGPASSWORD='{unquote(parts.password)}' " if parts.password else ""
    return host.shell(
        f"{password}PGCONNECT_TIMEOUT=10 {PSQL} -X -w -At -h {parts.hostname} -p {parts.port}"
        f" -U {parts.username} -d {parts.path.strip('/')} -c 'select 1'"
    )


# From the node, with the Secret's keys (as warren-blockd's pods sign), a forged signature, none.
STORE_PROBE = """
import sys, boto3, botocore
from botocore.config import Config
endpoint, key, secret = sys.argv[1:4]
def attempt(**creds):
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds)
    try:
        s3.put_object(Bucket="warren-workspaces", Key="probe/lab", Body=b"x")
        s3.delete_object(Bucket="warren-workspaces", Key="probe/lab")
        return "accepted"
    except botocore.exceptions.ClientError as exc:
        return exc.response["Error"]["Code"]
print(attempt(aws_access_key_id=key, aws_secret_access_key=secret))
print(attempt(aws_access_key_id=key, aws_secret_access_key=secret + "x"))
print(attempt(config=Config(signature_version=botocore.UNSIGNED)))
"""


def test_the_host_stores_listen_where_pods_reach_them_and_refuse_strangers(lab: Lab) -> None:
    store, control, node = lab.hosts["store"], lab.hosts["control"], lab.hosts["node"]
    for host in lab.hosts.values():
        local = _listening(host.run(["ss", "-Hltn"], check=True).stdout)
        wildcard = {a for a in local if a.startswith(("0.0.0.0:", "*:", "[::]:"))}
        assert not wildcard, (host.name, sorted(local))
    assert f"{store.address}:19003" in _listening(store.run(["ss", "-Hltn"], check=True).stdout)
    assert {"127.0.0.1:5432", f"{control.address}:5432"} <= _listening(
        control.run(["ss", "-Hltn"], check=True).stdout
    )

    url = _secret(lab, "warren-database")["url"]
    answered = _psql(node, url)  # from the node's address, as a masqueraded pod's connection
    assert answered.returncode == 0 and answered.stdout.strip() == "1", answered.stderr
    parts = urlsplit(url)
    no_password = url.replace(f":{parts.password}@", "@")
    assert "no password supplied" in _psql(node, no_password).stderr
    wrong = url.replace(f":{parts.password}@", ":not-the-password@")
    assert "password authentication failed" in _psql(node, wrong).stderr
    assert "no pg_hba.conf entry" in _psql(store, url).stderr  # an address not allowed

    keys = _secret(lab, "warren-object-store")
    probe = node.run(
        [
            BOTO_PYTHON,
            "-c",
            STORE_PROBE,
            f"http://{store.address}:19003",
            keys["AWS_ACCESS_KEY_ID"],
            keys["AWS_SECRET_ACCESS_KEY"],
        ]
    )
    assert probe.stdout.split() == ["accepted", "SignatureDoesNotMatch", "AccessDenied"], probe.stderr


def test_rotated_database_credentials_update_the_secret_and_restart_its_readers(site: Site) -> None:
    lab = site.lab
    control = lab.hosts["control"]
    before = control.run(["cat", DATABASE_URL], check=True).stdout.strip()
    # The postgres role's way to rotate: delete the password file and run again.
    control.run(["rm", "/etc/warren/postgres/password"], check=True)
    run = site.run(log="hosts-site-rotated.log")
    assert run.returncode == 0, run.output[-6000:]
    after = control.run(["cat", DATABASE_URL], check=True).stdout.strip()
    assert after != before
    assert _secret(lab, "warren-database") == {"url": after}
    assert urlsplit(before).password not in run.output and urlsplit(after).password not in run.output
    for kind, name in (("deployment", "warren-control"), ("daemonset", "warren-blockd")):
        template = _kubectl(lab, "-n", SYSTEM_NAMESPACE, "get", kind, name)["spec"]["template"]
        assert "kubectl.kubernetes.io/restartedAt" in template["metadata"].get("annotations", {}), name
    # Only the database's host and the control host changed; the next run changes nothing.
    assert run.recap()["node"]["changed"] == 0 and run.recap()["store"]["changed"] == 0
    again = site.run(log="hosts-site-after-rotation.log")
    assert {host: counts["changed"] for host, counts in again.recap().items()} == dict.fromkeys(HOSTS, 0)


def test_every_unit_site_wrote_passes_systemds_verifier(lab: Lab) -> None:
    """The sample's hosts run Warren's host services under systemd (the lab, with no init,
    runs the same units under Warren's supervisor): each unit site.yml wrote passes systemd's
    own verifier on its host, where its commands, users and directories must exist."""
    verified = []
    for name, host in lab.hosts.items():
        for unit in host.shell("ls /etc/systemd/system/warren-*.service").stdout.split():
            done = host.run(["systemd-analyze", "verify", unit])
            assert done.returncode == 0 and not done.stderr.strip(), (name, unit, done.stderr)
            verified.append(Path(unit).name)
    # The stores on their hosts and warren-forkd on the KVM host; nothing else is a host service.
    assert sorted(verified) == ["warren-forkd.service", "warren-objects.service", "warren-postgres.service"]


# -- warren-forkd ----------------------------------------------------------------------------


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
