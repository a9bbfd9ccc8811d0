"""Faults, tried for real: a daemon killed mid-replication, corrupt chunks in object storage,
two daemons on one lane, a node cut off while another takes its workspace over, and object
storage taken away and given back."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import boto3
import pytest
from conftest import Blockd, Weed, make_bucket
from warren_blockd import chunks, loopdev
from warren_blockd.client import ApiError
from warren_common.testing import wait_for

pytestmark = pytest.mark.integration
MIB = 1 << 20


def s3(endpoint: str) -> object:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
    )


WRITER = """
import os, sys
path, total, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "wb") as f:
    for done in range(0, total, step):
        f.write(os.urandom(step))
        f.flush()
        os.fsync(f.fileno())
"""


def writer(path: Path, total: int, step: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(total), str(step)], stderr=subprocess.DEVNULL
    )


def test_kill_9_mid_replication_loses_nothing_that_was_replicated(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    store = f"s3://{bucket}"
    a = blockd_factory(store, seaweedfs, name="a")
    a.client.create("ws", 512 * MIB)
    mnt = tmp_path / "a-mnt"
    a.client.action("ws", "mount", target=str(mnt))
    proven = {}
    for i in range(4):
        proven[f"proven-{i}"] = os.urandom(MIB + i * 4096)
        (mnt / f"proven-{i}").write_bytes(proven[f"proven-{i}"])
        assert a.client.action("ws", "flush", wait_replicated=60)["level"] == "replicated"
    busy = writer(mnt / "in-flight", 200 * MIB, MIB)
    wait_for(
        lambda: a.client.stats()["workspaces"]["ws"]["backlog_bytes"] > 0,
        60,
        "writes in flight",
        interval=0.1,
    )
    a.kill()  # kill -9: no flush, no unmount, uploads cut off mid-way
    busy.kill()
    busy.wait()
    # The node is gone with its disk: another node restores from storage alone.
    b = blockd_factory(store, seaweedfs, name="b")
    b.client.action("ws", "restore", target=str(tmp_path / "b-mnt"))
    for name, data in proven.items():
        assert (tmp_path / "b-mnt" / name).read_bytes() == data
    fsck_target = b.client.action("ws", "unmount", wait_replicated=60)
    assert fsck_target["level"] == "replicated"


def test_restart_after_kill_9_replays_the_spool_on_the_same_node(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    store = f"s3://{bucket}"
    a = blockd_factory(store, seaweedfs, name="a")
    a.client.create("ws", 256 * MIB)
    a.client.action("ws", "mount", target=str(tmp_path / "mnt"))
    data = os.urandom(4 * MIB)
    (tmp_path / "mnt" / "kept").write_bytes(data)
    a.client.action("ws", "flush")  # a `local` receipt: sealed on node disk
    a.kill()
    again = blockd_factory(store, seaweedfs, name="a")  # same state directory: stale mounts cleaned
    again.client.action("ws", "restore", target=str(tmp_path / "mnt2"))
    assert (tmp_path / "mnt2" / "kept").read_bytes() == data
    assert again.client.action("ws", "flush", wait_replicated=60)["level"] == "replicated"


def test_a_killed_daemons_loop_device_goes_with_its_mount(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    """The daemon dies and is not restarted (the node lives on): once its dead mount is
    unmounted (an operator, a pod's unpublish), nothing of it stays attached."""
    a = blockd_factory(f"s3://{bucket}", seaweedfs, name="a")
    a.client.create("ws", 64 * MIB)
    device = a.client.action("ws", "mount", target=str(tmp_path / "mnt"))["device"]
    backing = str(a.state / "node" / "fuse" / "ws")
    assert loopdev.backing_file(device) == backing
    a.kill()
    subprocess.run(["umount", "-l", str(tmp_path / "mnt")], check=True)
    wait_for(lambda: loopdev.backing_file(device) != backing, 10, f"{device} to be detached", interval=0.1)
    assert loopdev.backed_under(a.state) == []


def test_a_restarted_daemon_leaves_a_loop_device_that_took_its_recorded_number_alone(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    """mount.json outlives the loop device it names (a reboot, an operator's cleanup), and
    the number may be attached to another file when the daemon starts again."""
    a = blockd_factory(f"s3://{bucket}", seaweedfs, name="a")
    a.client.create("ws", 64 * MIB)
    device = a.client.action("ws", "mount", target=str(tmp_path / "mnt"))["device"]
    backing = str(a.state / "node" / "fuse" / "ws")
    a.kill()
    subprocess.run(["umount", "-l", str(tmp_path / "mnt")], check=True)
    if loopdev.backing_file(device) == backing:  # no autoclear: what the operator does
        subprocess.run(["losetup", "-d", device], check=True)
    # A lazily unmounted filesystem lets go of its device a moment later, and `losetup -d` on a
    # device still in use only marks it for release: wait for the number to be free.
    wait_for(lambda: loopdev.backing_file(device) != backing, 10, f"{device} to be detached", interval=0.1)
    assert '"loop"' in (a.state / "node" / "workspaces" / "ws" / "mount.json").read_text()
    foreign = tmp_path / "foreign.img"
    foreign.write_bytes(bytes(MIB))
    attached = subprocess.run(["losetup", device, str(foreign)], capture_output=True, text=True, check=False)
    # Another process on the machine (another test tier's node) may have taken the number first:
    # the same case, only its file is not ours to watch, since its owner may let it go.
    ours = attached.returncode == 0
    if not ours:
        taken_by = loopdev.backing_file(device)
        assert taken_by and taken_by != backing, f"{device}: {attached.stderr}"
    try:
        again = blockd_factory(f"s3://{bucket}", seaweedfs, name="a")  # cleans what `a` left
        if ours:
            assert loopdev.backing_file(device) == str(foreign), "the restart detached a device not its own"
        again.client.action("ws", "restore", target=str(tmp_path / "mnt2"))
        assert again.client.action("ws", "unmount", wait_replicated=60)["level"] == "replicated"
    finally:
        loopdev.detach_if_backed_by(device, foreign)


def test_corrupt_chunks_in_storage_never_reach_a_reader(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    store = f"s3://{bucket}"
    a = blockd_factory(store, seaweedfs, name="a")
    a.client.create("ws", 128 * MIB)
    a.client.action("ws", "mount", target=str(tmp_path / "a-mnt"))
    payload = os.urandom(4 * MIB)
    (tmp_path / "a-mnt" / "data.bin").write_bytes(payload)
    assert a.client.action("ws", "unmount", wait_replicated=60)["level"] == "replicated"
    client = s3(seaweedfs)
    ours = []  # chunks holding the file's bytes
    for item in client.list_objects_v2(Bucket=bucket, Prefix="chunks/").get("Contents", []):  # type: ignore[attr-defined]
        stored = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()  # type: ignore[attr-defined]
        raw = chunks.decode(item["Key"].rsplit("/", 1)[1], stored)
        if len(raw) >= 64 * 1024 and raw in payload:
            ours.append((item["Key"], stored))
    assert len(ours) >= 2, "the file's bytes should span several chunks"
    (flip_key, flip), (cut_key, cut) = ours[0], ours[1]
    flipped = bytearray(flip)
    flipped[len(flipped) // 2] ^= 0x10  # one bit
    client.put_object(Bucket=bucket, Key=flip_key, Body=bytes(flipped))  # type: ignore[attr-defined]
    client.put_object(Bucket=bucket, Key=cut_key, Body=cut[: len(cut) // 2])  # type: ignore[attr-defined]
    b = blockd_factory(store, seaweedfs, name="b")  # a cold node: every chunk comes from storage
    b.client.action("ws", "mount", target=str(tmp_path / "b-mnt"))
    failures, good = 0, 0
    fd = os.open(tmp_path / "b-mnt" / "data.bin", os.O_RDONLY)
    try:
        for offset in range(0, len(payload), 4096):
            try:
                got = os.pread(fd, 4096, offset)
            except OSError as exc:
                assert exc.errno == errno.EIO
                failures += 1
                continue
            assert got == payload[offset : offset + 4096], f"a wrong byte was served at {offset}"
            good += 1
    finally:
        os.close(fd)
    assert failures >= 2 and good > 0
    log = b.log()
    assert "content does not match its digest" in log or "does not decompress" in log
    assert "truncated" in log or "is not the recorded" in log or "does not decompress" in log
    assert 'blockd_corrupt_chunks_total{where="storage"}' in b.client.metrics()


def test_two_daemons_on_one_lane_one_wins_the_other_stops_as_split_brain(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    store = f"s3://{bucket}"
    nodes = {"a": blockd_factory(store, seaweedfs, name="a"), "b": blockd_factory(store, seaweedfs, name="b")}
    nodes["a"].client.create("ws", 128 * MIB)
    for name, node in nodes.items():  # the same workspace mounted read-write on two nodes
        node.client.action("ws", "mount", target=str(tmp_path / f"{name}-mnt"))
    outcome: dict[str, str] = {}
    for name, node in nodes.items():
        (tmp_path / f"{name}-mnt" / f"from-{name}").write_bytes(os.urandom(MIB))
        try:
            outcome[name] = node.client.action("ws", "flush", wait_replicated=60)["level"]
        except ApiError as exc:
            assert exc.code == "split_brain" and "published by another writer" in str(exc)
            outcome[name] = "split_brain"
    assert sorted(outcome.values()) == ["replicated", "split_brain"], outcome
    winner = next(n for n, level in outcome.items() if level == "replicated")
    loser = next(n for n, level in outcome.items() if level == "split_brain")
    assert "published by another writer" in nodes[loser].client.stats()["workspaces"]["ws"]["lane_error"]
    # The winner goes on; the loser's lane stays stopped (never retried into corruption).
    (tmp_path / f"{winner}-mnt" / "more").write_bytes(os.urandom(MIB))
    assert nodes[winner].client.action("ws", "flush", wait_replicated=60)["level"] == "replicated"
    assert nodes[winner].client.stats()["workspaces"]["ws"]["lane_error"] is None
    with pytest.raises(ApiError) as still:
        nodes[loser].client.action("ws", "flush", wait_replicated=5)
    assert still.value.code == "split_brain"


def test_a_second_node_waits_for_the_first_to_lapse_then_fences_off_its_stale_writer(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    """One writer per workspace across nodes: node b's attach is refused while node a holds
    the workspace (a renews its hold); a is cut off (frozen), its hold lapses and b takes
    over with every replicated byte; when a comes back and writes, it cannot publish, and
    storage has b's writes and none of a's later ones."""
    store, hold = f"s3://{bucket}", ("--hold-seconds", "3")
    a = blockd_factory(store, seaweedfs, "--node-id", "node-a", *hold, name="a")
    b = blockd_factory(store, seaweedfs, "--node-id", "node-b", *hold, name="b")
    a.client.create("ws", 128 * MIB)
    a.client.action("ws", "mount", target=str(tmp_path / "a-mnt"))
    proven = os.urandom(MIB)
    (tmp_path / "a-mnt" / "proven").write_bytes(proven)
    assert a.client.action("ws", "flush", wait_replicated=60)["level"] == "replicated"
    for _ in range(3):  # longer than the hold: a renews it
        with pytest.raises(ApiError) as held:
            b.client.action("ws", "mount", target=str(tmp_path / "b-mnt"))
        assert held.value.code == "held" and "attached on node node-a" in str(held.value), held.value
        time.sleep(1.5)

    os.kill(a.proc.pid, signal.SIGSTOP)  # cut off: a renews nothing, publishes nothing
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                b.client.action("ws", "mount", target=str(tmp_path / "b-mnt"))
                break
            except ApiError as exc:
                assert exc.code == "held" and time.monotonic() < deadline, exc
                time.sleep(0.5)
        assert (tmp_path / "b-mnt" / "proven").read_bytes() == proven
        (tmp_path / "b-mnt" / "from-b").write_bytes(b"b's\n")
        assert b.client.action("ws", "flush", wait_replicated=60)["level"] == "replicated"
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    assert "took over" in b.log()

    # a's writer comes back and writes on: none of it is ever published.
    (tmp_path / "a-mnt" / "stale").write_bytes(os.urandom(MIB))
    with pytest.raises(ApiError) as fenced:
        a.client.action("ws", "flush", wait_replicated=30)
    assert fenced.value.code == "split_brain", fenced.value
    b.client.action("ws", "unmount", wait_replicated=60)
    b.client.action("ws", "mount", target=str(tmp_path / "b-again"))
    assert (tmp_path / "b-again" / "from-b").read_bytes() == b"b's\n"
    assert (tmp_path / "b-again" / "proven").read_bytes() == proven
    assert not (tmp_path / "b-again" / "stale").exists()


def test_storage_outage_writes_go_on_to_the_bound_then_wait_then_resume(
    blockd_factory: Callable[..., Blockd], tmp_path: Path
) -> None:
    weed = Weed(tmp_path / "weed")
    (tmp_path / "weed").mkdir()
    weed.start()
    try:
        bucket = make_bucket(weed.endpoint)
        bound = 8 * MIB
        node = blockd_factory(f"s3://{bucket}", weed.endpoint, "--backlog-bound", "8M", "--batch-bytes", "1M")
        node.client.create("ws", 256 * MIB)
        mounted = node.client.action("ws", "mount", target=str(tmp_path / "mnt"))
        # Warm the node cache: during the outage only writes are under test, not cold reads.
        subprocess.run(
            ["dd", f"if={mounted['device']}", "of=/dev/null", "bs=1M"], check=True, capture_output=True
        )
        weed.stop()
        busy = writer(tmp_path / "mnt" / "during-outage", 48 * MIB, MIB)

        def stats() -> dict[str, int]:
            doc: dict[str, int] = node.client.stats()["workspaces"]["ws"]
            return doc

        wait_for(
            lambda: stats()["backpressure_waits"] > 0, 120, "writers to reach the backlog bound", interval=0.1
        )
        assert busy.poll() is None, "the writer finished although storage was down"
        assert bound <= stats()["backlog_bytes"] <= bound + 2 * MIB
        time.sleep(2)
        assert busy.poll() is None  # still waiting at the bound, not failing
        weed.start()
        assert busy.wait(timeout=180) == 0
        receipt = node.client.action("ws", "flush", wait_replicated=120)
        assert receipt["level"] == "replicated"
        expected = (tmp_path / "mnt" / "during-outage").read_bytes()
        assert len(expected) == 48 * MIB
        node.client.action("ws", "unmount", wait_replicated=60)
        other = blockd_factory(f"s3://{bucket}", weed.endpoint, name="other")
        other.client.action("ws", "restore", target=str(tmp_path / "restored"))
        assert (tmp_path / "restored" / "during-outage").read_bytes() == expected
    finally:
        weed.stop()
