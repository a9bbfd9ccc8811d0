"""The handoff for real: daemon processes on one state directory, a writer doing write+fsync
in a mounted workspace throughout, a real SeaweedFS. A new daemon takes over and the old one
exits: the writer sees no error, every write with a `replicated` receipt is in object storage
(restored on an empty node after the new daemon is killed without a flush) and the file
system checks clean. A new daemon killed during the handoff leaves the old one serving. A
workspace published by the CSI plugin before a handoff unpublishes after it, and a new
plugin on the same sockets keeps them when the old one stops."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from conftest import Blockd
from test_csi import pod_context, start_plugin, stop_plugin
from warren_blockd.csi.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from warren_blockd.handoff import HOLD_ENV
from warren_blockd.testing import BlockdProcess, CsiPluginProcess
from warren_common.testing import wait_for

pytestmark = pytest.mark.integration

# Writes files of random bytes with write+fsync until told to stop; after each fsync it
# appends "<index> <sha256>" to its journal (outside the workspace), and every I/O error
# to its error file. The journal is what was acknowledged by the file system.
WRITER = """
import hashlib, os, sys
root, journal, errors, stop = sys.argv[1:5]
index = 0
with open(journal, "a") as done, open(errors, "a") as failed:
    while not os.path.exists(stop):
        data = os.urandom(96 * 1024)
        try:
            with open(os.path.join(root, f"f{index:05d}"), "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            failed.write(f"{index} {exc}\\n")
            failed.flush()
        else:
            done.write(f"{index} {hashlib.sha256(data).hexdigest()}\\n")
            done.flush()
        index += 1
"""


class Writer:
    def __init__(self, root: Path, work: Path) -> None:
        self.journal = work / "journal"
        self.errors = work / "errors"
        self.stop_file = work / "stop"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(root),
                str(self.journal),
                str(self.errors),
                str(self.stop_file),
            ]
        )

    def done(self) -> dict[int, str]:
        if not self.journal.exists():
            return {}
        lines = self.journal.read_text().splitlines()
        return {int(i): digest for i, digest in (line.split() for line in lines if line.count(" ") == 1)}

    def wait_for(self, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while len(self.done()) < count:
            assert self.proc.poll() is None, "the writer died"
            assert time.monotonic() < deadline, f"the writer made fewer than {count} writes"
            time.sleep(0.05)

    def stop(self) -> None:
        self.stop_file.touch()
        self.proc.wait(timeout=120)

    def error_lines(self) -> list[str]:
        return self.errors.read_text().splitlines() if self.errors.exists() else []


def events(daemon: BlockdProcess, name: str) -> list[dict[str, object]]:
    return [
        doc
        for doc in (json.loads(line) for line in daemon.log().splitlines() if line.startswith("{"))
        if doc.get("event") == name
    ]


def fsck_clean(daemon: BlockdProcess, workspace: str, target: Path, copy: Path) -> None:
    """e2fsck -fn of the workspace as the kernel left it: frozen, copied from the FUSE file."""
    subprocess.run(["fsfreeze", "--freeze", str(target)], check=True)
    try:
        subprocess.run(
            ["cp", "--sparse=always", str(daemon.state / "node" / "fuse" / workspace), str(copy)], check=True
        )
    finally:
        subprocess.run(["fsfreeze", "--unfreeze", str(target)], check=True)
    check = subprocess.run(["e2fsck", "-fn", str(copy)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr


def writing(old: Blockd, tmp_path: Path) -> tuple[Blockd, Path, Writer]:
    """A workspace made and mounted by `old`, and a writer at work in it."""
    old.client.create("ws", 256 << 20)
    target = tmp_path / "mnt"
    old.client.action("ws", "mount", target=str(target))
    return old, target, Writer(target, tmp_path)


def test_a_new_daemon_takes_over_under_a_writer_without_an_error(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    store = f"s3://{bucket}"
    # A small backlog bound keeps the writer at most that far ahead of the uploader, so the
    # flush's batch is replicated within the wait even on a machine busy with other work.
    bound = ("--backlog-bound", "16M")
    old, target, writer = writing(blockd_factory(store, seaweedfs, *bound), tmp_path)
    try:
        writer.wait_for(40)
        # The same node state: it takes over from the old one.
        new = blockd_factory(store, seaweedfs, *bound, name="node", log_name="daemon-new.log")
        old.proc.wait(timeout=60)
        assert old.proc.returncode == 0, old.log()
        assert events(new, "took over") and events(old, "handoff acknowledged")
        before = len(writer.done())
        writer.wait_for(before + 40)  # served by the new daemon now
        stats = new.client.stats()["workspaces"]["ws"]
        assert stats["target"] == str(target) and stats["lane_error"] is None
        # Read before the flush is asked for: a file acknowledged (fsync'd) by then has its
        # blocks on the device, so the receipt covers it; one acknowledged while the flush
        # runs may have missed the batch it seals.
        proven = writer.done()
        receipt = new.client.action("ws", "flush", wait_replicated=60)
        assert receipt["level"] == "replicated"
        writer.wait_for(len(proven) + 10)
    finally:
        writer.stop()
    assert writer.error_lines() == []
    fsck_clean(new, "ws", target, tmp_path / "copy.img")

    # The new daemon dies without a flush: whatever had a `replicated` receipt is in storage.
    new.kill()
    subprocess.run(["umount", "-l", str(target)], check=False)
    empty = blockd_factory(store, seaweedfs, name="empty-node")
    restored = tmp_path / "restored"
    empty.client.action("ws", "restore", target=str(restored))
    for index, digest in proven.items():
        data = (restored / f"f{index:05d}").read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, f"f{index:05d} differs after the restore"
    fsck_clean(empty, "ws", restored, tmp_path / "restored.img")


def test_a_new_daemon_killed_during_the_handoff_leaves_the_old_one_serving(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    store = f"s3://{bucket}"
    old, _, writer = writing(blockd_factory(store, seaweedfs), tmp_path)
    try:
        writer.wait_for(20)
        # It adopts everything, then holds before its acknowledgement: killed there.
        doomed = BlockdProcess(
            old.state, store, seaweedfs, log_name="daemon-doomed.log", env={HOLD_ENV: "600"}, wait=False
        )
        wait_for(
            lambda: bool(events(doomed, "adopted; acknowledging")),
            60,
            "the new daemon to adopt",
            interval=0.05,
        )
        doomed.kill()
        wait_for(
            lambda: bool(events(old, "handoff failed; serving on")),
            60,
            "the old daemon to resume",
            interval=0.05,
        )
        assert old.proc.poll() is None and old.serving()
        before = len(writer.done())
        writer.wait_for(before + 20)  # the old daemon serves the writer again
        assert old.client.action("ws", "flush", wait_replicated=60)["level"] == "replicated"
        assert events(old, "resumed after a failed handoff")
    finally:
        writer.stop()
    assert writer.error_lines() == []
    assert old.client.action("ws", "unmount", wait_replicated=60)["level"] == "replicated"


def test_a_workspace_published_before_the_handoff_unpublishes_after_it(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    store = f"s3://{bucket}"
    old = blockd_factory(store, seaweedfs)
    csi, channels = start_plugin(tmp_path / "csi", old)
    try:
        target = csi.publish("vol-1", pod_context(workspace="ws-pub", size="64Mi"))
        (target / "note.txt").write_text("before the handoff\n")
        new = blockd_factory(store, seaweedfs, name="node", log_name="daemon-new.log")
        old.proc.wait(timeout=60)
        (target / "note.txt").write_text("after the handoff\n")
        csi.unpublish("vol-1")  # flush, unbind, unmount and detach, all by the new daemon
        assert "ws-pub" not in new.client.stats()["workspaces"]
        unpublished = [e for e in csi.plugin.log().splitlines() if '"unpublished"' in e]
        assert unpublished and json.loads(unpublished[-1])["receipt"] == "replicated"
        again = csi.publish("vol-2", pod_context(pod="pod-2", workspace="ws-pub"))
        assert (again / "note.txt").read_text() == "after the handoff\n"
        csi.unpublish("vol-2")
    finally:
        stop_plugin(csi, channels)


def test_a_new_plugin_on_the_same_sockets_keeps_them_when_the_old_one_stops(
    blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str, tmp_path: Path
) -> None:
    daemon = blockd_factory(f"s3://{bucket}", seaweedfs)
    csi, channels = start_plugin(tmp_path / "csi", daemon)
    old_ids = {p: p.stat().st_ino for p in (csi.plugin.endpoint, csi.plugin.registration_socket)}
    new = CsiPluginProcess(
        tmp_path / "csi-new", daemon.socket, "test-node", sockets=csi.plugin.sockets, log_name="csi-new.log"
    )
    csi.plugin.owns_sockets, new.owns_sockets = False, True  # the directory outlives the old plugin
    try:
        # Replaced in one rename each: the paths never went missing, and are the new plugin's.
        assert all(path.stat().st_ino != ino for path, ino in old_ids.items())
        stop_plugin(csi, channels)
        assert "another plugin serves it now" in csi.plugin.log()
        assert new.endpoint.exists() and new.registration_socket.exists()
        with grpc.insecure_channel(f"unix:{new.registration_socket}") as channel:
            info = pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                pluginregistration_pb2.InfoRequest(), timeout=10
            )
            assert info.endpoint == str(new.endpoint)
        with grpc.insecure_channel(f"unix:{new.endpoint}") as channel:
            probe = csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=10)
            assert probe.ready.value is True
    finally:
        new.stop()
    assert not new.endpoint.exists() and not new.registration_socket.exists()
