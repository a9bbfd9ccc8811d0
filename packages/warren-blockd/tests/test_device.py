"""The device layer without FUSE: reads from chunks, holes and the copy-on-write layer,
partial-block writes, verification before serving, and a restart that replays the spool."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from warren_blockd import chunks
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.cache import ChunkCache
from warren_blockd.device import Device
from warren_blockd.errors import CorruptError
from warren_blockd.replicator import Replicator
from warren_blockd.workspace import LogLane, Workspace

BLOCK = 4096


def open_device(store: PolicyStore, node: Path, workspace_id: str = "ws") -> Device:
    ws = Workspace(store, workspace_id)
    manifest = ws.effective()
    replicator = Replicator(ws, node / "spool", 1 << 30, manifest.log_seq + 1, start=False)
    device = Device(manifest, ChunkCache(node / "cache", store), replicator, node / "dirty.img")
    replicator.start()
    return device


@pytest.fixture
def store(tmp_path: Path) -> PolicyStore:
    store = PolicyStore(LocalDriver(tmp_path / "store"))
    ws = Workspace(store, "ws")
    ws.create(64)
    LogLane(ws, 1).publish([(2, bytes([7]) * BLOCK * 2)])  # blocks 2-3 stored, the rest holes
    return store


def test_reads_come_from_chunks_holes_and_local_writes(store: PolicyStore, tmp_path: Path) -> None:
    device = open_device(store, tmp_path / "node")
    assert device.read(0, 2 * BLOCK) == bytes(2 * BLOCK)
    assert device.read(2 * BLOCK + 100, 10) == bytes([7]) * 10
    device.write(3 * BLOCK + 10, b"abc")  # inside a stored block: merged with its bytes
    got = device.read(3 * BLOCK, BLOCK)
    assert got[:10] == bytes([7]) * 10 and got[10:13] == b"abc" and got[13:] == bytes([7]) * (BLOCK - 13)
    device.write(BLOCK - 2, b"xyzw")  # across two hole blocks
    assert device.read(BLOCK - 4, 8) == b"\0\0xyzw\0\0"
    assert device.dirty_blocks() == 3  # blocks 0, 1 and 3
    assert device.read(64 * BLOCK - 2, 100) == b"\0\0"  # clamped at the end
    with pytest.raises(ValueError, match="passes the end"):
        device.write(64 * BLOCK - 1, b"ab")
    receipt = device.flush()
    assert device.replicator.wait_replicated(receipt.seq, 10).level == "replicated"
    device.replicator.close()
    again = open_device(store, tmp_path / "other-node")  # everything came through storage
    assert again.read(3 * BLOCK + 10, 3) == b"abc" and again.read(BLOCK - 2, 4) == b"xyzw"
    again.replicator.close()


def test_a_corrupt_chunk_is_never_served(store: PolicyStore, tmp_path: Path) -> None:
    [key] = store.list("chunks/")
    path = tmp_path / "store" / key
    stored = bytearray(path.read_bytes())
    stored[len(stored) // 2] ^= 0x01
    path.write_bytes(bytes(stored))
    device = open_device(store, tmp_path / "node")
    with pytest.raises(CorruptError, match="chunks/"):
        device.read(2 * BLOCK, BLOCK)
    assert device.read(0, BLOCK) == bytes(BLOCK)  # holes and other blocks still serve
    device.replicator.close()


def test_a_bad_copy_on_node_disk_is_fetched_again(store: PolicyStore, tmp_path: Path) -> None:
    device = open_device(store, tmp_path / "node")
    assert device.read(2 * BLOCK, 4) == bytes([7]) * 4
    device.replicator.close()
    [cached] = [p for p in (tmp_path / "node" / "cache").rglob("*") if p.is_file()]
    cached.write_bytes(os.urandom(len(cached.read_bytes())))  # the node's copy rots
    fresh = open_device(store, tmp_path / "node")  # new process: nothing in memory
    assert fresh.read(2 * BLOCK, 4) == bytes([7]) * 4
    assert chunks.digest_of(cached.read_bytes()) == cached.name  # replaced by a verified copy
    fresh.replicator.close()


def test_a_restart_serves_spooled_writes_before_they_are_replicated(
    store: PolicyStore, tmp_path: Path
) -> None:
    node = tmp_path / "node"
    ws = Workspace(store, "ws")
    replicator = Replicator(ws, node / "spool", 1 << 30, 2, start=False)  # never uploads: storage "down"
    device = Device(ws.effective(), ChunkCache(node / "cache", store), replicator, node / "dirty.img")
    device.write(10 * BLOCK, b"q" * BLOCK)
    assert device.flush().level == "local"
    device.close()
    restarted = open_device(store, node)  # the spool is replayed into the new write layer
    assert restarted.read(10 * BLOCK, 4) == b"qqqq"
    receipt = restarted.flush()
    assert restarted.replicator.wait_replicated(receipt.seq, 10).level == "replicated"
    restarted.replicator.close()
