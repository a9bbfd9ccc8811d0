"""The daemon end to end: real FUSE, loop devices, ext4 mounted nosuid,nodev, a real SeaweedFS."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import Blockd
from warren_blockd import loopdev
from warren_blockd.client import ApiError

pytestmark = pytest.mark.integration


@pytest.fixture
def node(blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str) -> Blockd:
    return blockd_factory(f"s3://{bucket}", seaweedfs, "--consolidate-records", "4")


def mount_options(target: Path) -> set[str]:
    out = subprocess.run(
        ["findmnt", "-n", "-o", "FSTYPE,OPTIONS", str(target)], capture_output=True, text=True, check=True
    )
    fstype, _, options = out.stdout.strip().partition(" ")
    assert fstype == "ext4", out
    return set(options.strip().split(","))


def metric(exposition: str, name: str) -> float:
    """One unlabelled sample of the daemon's /metrics."""
    for line in exposition.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} is not in the daemon's metrics")


def test_workspace_is_a_real_ext4_mounted_nosuid_nodev(node: Blockd, tmp_path: Path) -> None:
    node.client.create("ws", 256 << 20)
    target = tmp_path / "ws"
    mounted = node.client.action("ws", "mount", target=str(target))
    assert mounted["device"].startswith("/dev/loop")
    assert {"nosuid", "nodev", "rw"} <= mount_options(target)
    (target / "hello.txt").write_text("hello\n")
    receipt = node.client.action("ws", "flush", wait_replicated=60)
    assert receipt["level"] == "replicated"
    # A setuid binary on the workspace does not gain privileges: nosuid holds for real.
    probe = target / "id"
    probe.write_bytes(Path("/usr/bin/id").read_bytes())
    probe.chmod(0o4755)
    out = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(probe), "-u"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "65534"
    # Any user of the sandbox may write at the top of a new workspace (sticky, as /tmp is).
    assert stat.S_IMODE(target.stat().st_mode) == 0o1777


def test_new_workspaces_of_one_size_fork_one_stored_empty_file_system(
    node: Blockd, seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    """The first new workspace of a size makes its empty ext4 and keeps it; every new one of
    that size, however many at once, is a fork of it: its own file system, empty and
    writable by anyone, that diverges from the others."""
    from warren_blockd.blobs.policy import PolicyStore
    from warren_blockd.blobs.s3 import S3Driver

    names = [f"new-{index}" for index in range(6)]
    with ThreadPoolExecutor(len(names)) as pool:
        made = list(pool.map(lambda name: node.client.create(name, 64 << 20), names))
    blank = f"empty-ext4-{(64 << 20) // 4096}"
    assert all(m["from"] == f"empty ext4 (a fork of {blank})" for m in made), made
    store = PolicyStore(S3Driver(bucket, endpoint=seaweedfs, access_key="any", secret_key="any"))
    kept = {
        key.split("/")[1] for key in store.list("workspaces/") if key.startswith("workspaces/empty-ext4-")
    }
    # The blank, and the drafts of creators that lost the race to make it (released).
    drafts = {name for name in kept if name != blank}
    assert blank in kept and all(store.exists(f"workspaces/{d}/released") for d in drafts), kept
    for name in names[:2]:
        target = tmp_path / name
        node.client.action(name, "mount", target=str(target))
        assert {"nosuid", "nodev", "rw"} <= mount_options(target)
        assert stat.S_IMODE(target.stat().st_mode) == 0o1777
        assert sorted(p.name for p in target.iterdir()) == ["lost+found"]
        (target / "own.txt").write_text(name)
    assert (tmp_path / names[0] / "own.txt").read_text() == names[0]
    assert (tmp_path / names[1] / "own.txt").read_text() == names[1]
    with pytest.raises(ApiError) as err:
        node.client.create(names[0], 64 << 20)
    assert err.value.code == "exists"


def test_fork_children_see_the_source_and_diverge_on_their_own(node: Blockd, tmp_path: Path) -> None:
    node.client.create("src", 256 << 20)
    src = tmp_path / "src"
    node.client.action("src", "mount", target=str(src))
    payload = os.urandom(3 << 20)
    (src / "data.bin").write_bytes(payload)
    (src / "note.txt").write_text("original\n")
    # The source stays mounted: fork freezes it while its writes reach storage.
    result = node.client.action("src", "fork", children=["kid-1", "kid-2", "kid-3"])
    assert result["children"] == {"kid-1": None, "kid-2": None, "kid-3": None}
    again = node.client.action("src", "fork", children=["kid-1"])
    assert "already exists" in again["children"]["kid-1"]
    kids = {}
    for kid in ("kid-1", "kid-2", "kid-3"):
        kids[kid] = tmp_path / kid
        node.client.action(kid, "mount", target=str(kids[kid]))
        assert (kids[kid] / "data.bin").read_bytes() == payload
    (kids["kid-2"] / "note.txt").write_text("changed in kid-2\n")
    (src / "note.txt").write_text("changed in the source\n")
    assert (kids["kid-1"] / "note.txt").read_text() == "original\n"
    assert (kids["kid-3"] / "note.txt").read_text() == "original\n"
    assert (kids["kid-2"] / "note.txt").read_text() == "changed in kid-2\n"
    # Unmount and restore: each child's own writes came through storage.
    assert node.client.action("kid-2", "unmount", wait_replicated=60)["level"] == "replicated"
    node.client.action("kid-2", "restore", target=str(kids["kid-2"]))
    assert (kids["kid-2"] / "note.txt").read_text() == "changed in kid-2\n"


def test_forks_of_one_mounted_source_at_once_all_succeed(node: Blockd, tmp_path: Path) -> None:
    """A fork into eight children reaches the node as eight publishes at once, each a fork of
    the same mounted source: they take turns at its freeze rather than fail on it (EBUSY)."""
    node.client.create("busy", 64 << 20)
    src = tmp_path / "busy"
    node.client.action("busy", "mount", target=str(src))
    (src / "note.txt").write_text("before the forks\n")
    kids = [f"busy-kid-{index}" for index in range(8)]
    with ThreadPoolExecutor(len(kids)) as pool:
        results = list(pool.map(lambda kid: node.client.action("busy", "fork", children=[kid]), kids))
    assert [r["children"] for r in results] == [{kid: None} for kid in kids]
    # Served in batches: those that came while one fork held the freeze shared the next one.
    metrics = node.client.metrics()
    assert metric(metrics, "blockd_fork_children_total") == len(kids)
    assert metric(metrics, "blockd_fork_batches_total") < len(kids)
    (src / "note.txt").write_text("after the forks\n")  # the source is thawed
    target = tmp_path / kids[-1]
    node.client.action(kids[-1], "mount", target=str(target))
    assert (target / "note.txt").read_text() == "before the forks\n"


def test_forks_that_name_their_siblings_share_one_freeze(node: Blockd, tmp_path: Path) -> None:
    """A claim's binds of a fork into eight arrive over some hundreds of milliseconds; each
    names the fork's eight, and the first waits for the rest: one freeze serves them all."""
    node.client.create("many", 64 << 20)
    src = tmp_path / "many"
    node.client.action("many", "mount", target=str(src))
    (src / "note.txt").write_text("before the fork\n")
    kids = [f"many-kid-{index}" for index in range(8)]

    def fork(index: int) -> dict[str, object]:
        time.sleep(0.02 * index)  # as a controller's binds come, one after another
        return node.client.action("many", "fork", children=[kids[index]], siblings=len(kids))

    with ThreadPoolExecutor(len(kids)) as pool:
        results = list(pool.map(fork, range(len(kids))))
    assert [r["children"] for r in results] == [{kid: None} for kid in kids]
    metrics = node.client.metrics()
    assert metric(metrics, "blockd_fork_children_total") == len(kids)
    assert metric(metrics, "blockd_fork_batches_total") == 1
    with pytest.raises(ApiError, match="siblings"):
        node.client.action("many", "fork", children=["many-kid-x"], siblings=0)


def test_the_children_of_a_fork_mount_at_once_each_on_its_own_device(node: Blockd, tmp_path: Path) -> None:
    """A fork's eight children are mounted side by side, as a claim binds them: each gets a
    loop device of its own on its own file, though the daemon configures them all at once
    (and serves the FUSE reads and syncs that configuring them makes, meanwhile)."""
    node.client.create("par", 64 << 20)
    src = tmp_path / "par"
    node.client.action("par", "mount", target=str(src))
    (src / "note.txt").write_text("before the fork\n")
    kids = [f"par-kid-{index}" for index in range(8)]
    node.client.action("par", "fork", children=kids)

    def mount(kid: str) -> str:
        return str(node.client.action(kid, "mount", target=str(tmp_path / kid))["device"])

    with ThreadPoolExecutor(len(kids)) as pool:
        devices = list(pool.map(mount, kids))
    assert len(set(devices)) == len(kids), devices
    for kid, device in zip(kids, devices, strict=True):
        assert loopdev.backing_file(device) == str(node.state / "node" / "fuse" / kid)
        assert (tmp_path / kid / "note.txt").read_text() == "before the fork\n"
    for kid in kids:
        node.client.action(kid, "unmount", wait_replicated=60)


def test_consolidation_runs_and_restore_uses_it(
    node: Blockd, blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    import boto3

    node.client.create("hist", 64 << 20)
    target = tmp_path / "hist"
    node.client.action("hist", "mount", target=str(target))
    for i in range(12):
        (target / f"f{i}").write_text(f"version {i}\n")
        node.client.action("hist", "flush", wait_replicated=60)
    s3 = boto3.client(
        "s3",
        endpoint_url=seaweedfs,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
    )

    def generations() -> list[str]:
        listing = s3.list_objects_v2(Bucket=bucket, Prefix="workspaces/hist/manifests/")
        return [item["Key"] for item in listing.get("Contents", [])]

    deadline = time.monotonic() + 30
    while not any(not key.endswith("0000000000000000") for key in generations()):
        assert time.monotonic() < deadline, f"no consolidated manifest: {generations()}"
        time.sleep(0.5)
    node.client.action("hist", "unmount", wait_replicated=60)
    other = blockd_factory(f"s3://{bucket}", seaweedfs, name="other-node")  # empty node: restore from storage
    restored = other.client.action("hist", "restore", target=str(tmp_path / "restored"))
    assert restored["log_seq"] > 0
    assert [(tmp_path / "restored" / f"f{i}").read_text() for i in range(12)] == [
        f"version {i}\n" for i in range(12)
    ]


def test_api_errors_are_clear_and_metrics_and_logs_are_served(node: Blockd) -> None:
    with pytest.raises(ApiError) as bad_id:
        node.client.create("Not_Valid", 64 << 20)
    assert bad_id.value.status == 400 and "lowercase letters" in str(bad_id.value)
    # Every error names its fix beside the code and the message.
    assert set(bad_id.value.doc) == {"error", "message", "fix"} and "lowercase letters" in bad_id.value.fix
    with pytest.raises(ApiError) as bad_size:
        node.client.create("small", 4096)
    assert "at least 16 MiB" in str(bad_size.value)
    with pytest.raises(ApiError) as missing:
        node.client.action("nope", "mount", target="/tmp/never")
    assert missing.value.status == 404 and missing.value.fix
    node.client.create("exists-once", 64 << 20)
    with pytest.raises(ApiError) as twice:
        node.client.create("exists-once", 64 << 20)
    assert twice.value.status == 409
    text = node.client.metrics()
    assert "blockd_chunk_fetches_total" in text and "blockd_flushes_total" in text
    events = [json.loads(line) for line in node.log().splitlines() if line.startswith("{")]
    assert any(e["event"] == "created" and e["workspace"] == "exists-once" for e in events)
    assert any(e["event"] == "detached" and e["workspace"].startswith("empty-ext4-") for e in events)


def test_a_released_workspace_is_refused_by_the_daemon(
    node: Blockd, seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    from warren_blockd.blobs.policy import PolicyStore
    from warren_blockd.blobs.s3 import S3Driver
    from warren_blockd.workspace import Workspace

    node.client.create("deleted", 64 << 20)
    store = PolicyStore(S3Driver(bucket, endpoint=seaweedfs, access_key="any", secret_key="any"))
    assert Workspace(store, "deleted").release().found
    refusals = (
        lambda: node.client.action("deleted", "restore", target=str(tmp_path / "r")),
        lambda: node.client.action("deleted", "fork", children=["kid"]),
        lambda: node.client.create("kid", template="deleted"),
        lambda: node.client.create("deleted", 64 << 20),  # not brought back under the same id
    )
    for refused in refusals:
        with pytest.raises(ApiError) as err:
            refused()
        assert (err.value.status, err.value.code) == (410, "released")
        assert "deleted was released" in str(err.value)
    assert store.list("workspaces/deleted/") == ["workspaces/deleted/released"]
