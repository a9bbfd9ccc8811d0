"""The API against a real cluster: the SDK through the real edge creates sandboxes that the
controller (a subprocess, as its ServiceAccount) turns into real gVisor pods; exec streams
from them through the Kubernetes exec API, files go in and out byte for byte, stop and start
toggle the pod, forks run, deletes clean up, and nothing a client reads names a pod, a
namespace or an object.

Runs with tests/run-cluster.sh (or WARREN_KUBECONFIG and WARREN_TEST_IMAGE set); skipped
otherwise."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from api_stack import OrgHandle, Stack, StandIn, serve_stack, settings_for
from k8s_helpers import Controller, pods_of
from warren_common.testing import wait_for
from warren_control.api.cluster import ORG_LABEL, Cluster, org_hash
from warren_control.db import upgrade
from warren_control.kube import Kube
from warren_control.mirror import Mirror, MirrorOptions
from warren_control.models import utcnow
from warren_control.podspec import pod_name
from warren_control.reaper import Reaper
from warren_control.sdk import Sandbox, WarrenError

pytest_plugins = ["k8s_fixtures"]
pytestmark = pytest.mark.cluster

START_TIMEOUT = 180.0  # a cold gVisor start on a small, busy test machine
SLEEP = ["sleep", "86400"]


@pytest.fixture
def cluster_stack(kube: Kube, namespace: str, controller: Controller, tmp_path: Path) -> Iterator[Stack]:
    """The API answering from its records alone, kept current by a status mirror watching
    the real cluster (as `serve --role all` runs them)."""
    url = f"sqlite:///{tmp_path / 'records.db'}"
    upgrade(url)
    with serve_stack(
        url, StandIn(), kube=kube, namespace=namespace, workspaces=True, read_through=False
    ) as stack:
        stop = threading.Event()
        mirror = Mirror(stack.sessions, kube, namespace, MirrorOptions(resync_seconds=5))
        thread = threading.Thread(target=mirror.run, args=(stop,), daemon=True)
        thread.start()
        try:
            yield stack
        finally:
            stop.set()
            thread.join(timeout=30)


def progress_log(lines: list[str]) -> Callable[[Sandbox], None]:
    return lambda sandbox: lines.append(f"{time.monotonic():.1f} {sandbox.phase} {sandbox.reason}")


def running(org: OrgHandle, image: str) -> Sandbox:
    box = org.client.create(image, command=SLEEP, cpu_millis=50, memory_mib=128)
    seen: list[str] = []
    up = org.client.wait_until(box.id, "Running", timeout=START_TIMEOUT, progress=progress_log(seen))
    print("progress:", *seen, sep="\n  ")
    return up


def test_sandbox_lifecycle_on_the_cluster(  # noqa: PLR0915 (one sandbox's whole life)
    cluster_stack: Stack, kube: Kube, namespace: str, image: str
) -> None:
    stack = cluster_stack
    org = stack.org()
    started = time.monotonic()
    box = running(org, image)
    print(f"timing: API create to Running: {time.monotonic() - started:.2f} s")

    name = stack.object_name(box.id)
    obj = kube.read_sandbox(namespace, name)
    assert obj is not None
    assert obj["metadata"]["labels"][ORG_LABEL] == org_hash(org.id)
    uid = obj["metadata"]["uid"]
    pods = pods_of(kube, namespace, uid)
    assert [p["metadata"]["name"] for p in pods] == [pod_name(uid)]
    # What the client reads names nothing of the cluster's.
    for secret in (name, uid, pod_name(uid), namespace, pods[0]["spec"].get("nodeName") or name):
        # As a whole token: a short node name ("vm") may occur inside a random id by chance.
        assert not re.search(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", str(box.raw)), secret

    # Exec: output as it comes, stdout and stderr apart, then the exit code.
    result = org.client.run(box.id, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    stream = org.client.exec(box.id, ["sh", "-c", "echo first; sleep 3; echo second"])
    t0 = time.monotonic()
    first = next(stream)
    first_at = time.monotonic() - t0
    rest = []
    while True:
        try:
            rest.append(next(stream))
        except StopIteration as done:
            code = done.value
            break
    assert first.data == b"first\n"
    assert first_at < 2.5, f"the first line took {first_at:.1f} s: output is not streamed"
    assert b"".join(c.data for c in rest) == b"second\n"
    assert code == 0
    # Bytes that are not UTF-8 arrive intact.
    assert org.client.run(box.id, ["printf", "\\377\\376ok"]).stdout == b"\xff\xfeok"
    # A command that cannot run, and one that does not finish in time.
    try:
        code = org.client.run(box.id, ["/no/such/program"]).exit_code
    except WarrenError as missing:
        # The runtime says so on the error channel, in words that name no pod or container.
        assert missing.code == "exec_failed"
        assert pod_name(uid) not in missing.message
        assert name not in missing.message
    else:
        assert code in {126, 127}  # or it answers like a shell would
    with pytest.raises(WarrenError) as slow:
        org.client.run(box.id, ["sleep", "30"], timeout=2)
    assert slow.value.code == "timeout"

    # The sandbox's own name for itself is not the pod's.
    assert org.client.read_file(box.id, "/etc/hostname") == b"sandbox\n"
    assert org.client.run(box.id, ["sh", "-c", "echo $HOSTNAME"]).stdout == b"sandbox\n"

    # Files, byte for byte, binary included.
    blob = os.urandom(300_000) + b"\x00\xff" * 10
    assert org.client.write_file(box.id, "/tmp/blob.bin", blob) == len(blob)
    assert org.client.read_file(box.id, "/tmp/blob.bin") == blob
    assert org.client.write_file(box.id, "/tmp/empty", b"") == 0
    assert org.client.read_file(box.id, "/tmp/empty") == b""
    with pytest.raises(WarrenError) as absent:
        org.client.read_file(box.id, "/tmp/never-written")
    assert (absent.value.status, absent.value.code) == (404, "file_not_found")

    # Another organization reaches none of it.
    other = stack.org()
    for attempt in (
        lambda: other.client.run(box.id, ["true"]),
        lambda: other.client.read_file(box.id, "/tmp/blob.bin"),
        lambda: other.client.write_file(box.id, "/tmp/x", b"x"),
        lambda: other.client.stop(box.id),
        lambda: other.client.delete(box.id),
    ):
        with pytest.raises(WarrenError) as refused:
            attempt()
        assert refused.value.code == "not_found"

    # Stop ends the pod, start brings one back.
    org.client.stop(box.id)
    org.client.wait_until(box.id, "Stopped", timeout=START_TIMEOUT)
    wait_for(lambda: not pods_of(kube, namespace, uid), 60, "the pod to go")
    with pytest.raises(WarrenError) as stopped:
        org.client.run(box.id, ["true"])
    assert stopped.value.code == "not_running"
    org.client.start(box.id)
    org.client.wait_until(box.id, "Running", timeout=START_TIMEOUT)
    assert org.client.run(box.id, ["echo", "back"]).stdout == b"back\n"

    # Delete: the resource and its pod go, then the record.
    org.client.delete(box.id)
    org.client.wait_until(box.id, "Deleted", timeout=120)
    assert kube.read_sandbox(namespace, name) is None
    assert pods_of(kube, namespace, uid) == []


def test_fork_runs_each_child(cluster_stack: Stack, kube: Kube, namespace: str, image: str) -> None:
    org = cluster_stack.org()
    parent = running(org, image)
    results = org.client.fork(parent.id, 2)
    assert [r.ok for r in results] == [True, True]
    children = [r.sandbox for r in results if r.sandbox is not None]
    for child in children:
        # Long polls: each GET answers once the child's state changes (the status mirror
        # having written it), so a few reach Running where polling would take hundreds.
        asked, seen = 0, None
        while seen is None or seen.phase == "Pending":
            seen, asked = org.client.get(child.id, wait_s=60), asked + 1
        assert (seen.phase, asked <= 5) == ("Running", True), (seen.phase, seen.reason, asked)
        assert org.client.run(child.id, ["echo", "child"]).stdout == b"child\n"
    for sandbox_id in [parent.id, *(c.id for c in children)]:
        org.client.delete(sandbox_id)
    for sandbox_id in [parent.id, *(c.id for c in children)]:
        org.client.wait_until(sandbox_id, "Deleted", timeout=120)
    assert kube.list_sandboxes(namespace) == []


def test_what_the_cluster_shows_is_what_the_client_reads(
    cluster_stack: Stack, kube: Kube, namespace: str
) -> None:
    # An image no node has (pods here never pull): the sandbox stays Pending and says why,
    # in words that name no pod.
    org = cluster_stack.org()
    box = org.client.create("warren.invalid/no-such-image:0", command=SLEEP, cpu_millis=50, memory_mib=128)
    name = cluster_stack.object_name(box.id)

    def image_problem() -> Sandbox | None:
        seen = org.client.get(box.id)
        return seen if "Image" in seen.reason else None

    stuck = wait_for(image_problem, START_TIMEOUT, "the image problem to show")
    assert stuck.phase == "Pending"
    obj = kube.read_sandbox(namespace, name)
    assert obj is not None
    uid = obj["metadata"]["uid"]
    for secret in (pod_name(uid), uid, name, namespace):
        assert secret not in str(stuck.raw)
    org.client.delete(box.id)
    org.client.wait_until(box.id, "Deleted", timeout=120)
    assert kube.list_sandboxes(namespace) == []


def test_the_reaper_on_the_cluster(cluster_stack: Stack, kube: Kube, namespace: str, image: str) -> None:
    """Idle past the deadline: the plain sandbox is deleted (resource and pod gone), the
    persistent one stopped (pod gone, resource kept) and started again on request."""
    stack = cluster_stack
    plain_org = stack.org(may_persist=True)
    plain = running(plain_org, image)
    kept = plain_org.client.create(image, command=SLEEP, cpu_millis=50, memory_mib=128, persistent=True)
    plain_org.client.wait_until(kept.id, "Running", timeout=START_TIMEOUT)
    kept_name = stack.object_name(kept.id)
    kept_obj = kube.read_sandbox(namespace, kept_name)
    assert kept_obj is not None

    cluster = Cluster(settings_for(stack.url, StandIn(), kube=kube, namespace=namespace))
    reaper = Reaper(stack.sessions, cluster)
    reaper.sweep(utcnow() + timedelta(days=2))  # past both idle deadlines, within the lifetime
    plain_org.client.wait_until(plain.id, "Deleted", timeout=120)
    plain_org.client.wait_until(kept.id, "Stopped", timeout=START_TIMEOUT)
    wait_for(lambda: not pods_of(kube, namespace, kept_obj["metadata"]["uid"]), 60, "the pod to go")
    assert kube.read_sandbox(namespace, kept_name) is not None  # the sandbox itself stays
    plain_org.client.start(kept.id)
    plain_org.client.wait_until(kept.id, "Running", timeout=START_TIMEOUT)
    assert plain_org.client.run(kept.id, ["echo", "again"]).stdout == b"again\n"
    plain_org.client.delete(kept.id)
    plain_org.client.wait_until(kept.id, "Deleted", timeout=120)
