"""Workspaces over a real store: restore, consolidation, forks that copy no data, and the
log lane's create-only publishing that stops on split brain."""

from __future__ import annotations

from pathlib import Path

import pytest
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.workspace import LogLane, SplitBrainError, Workspace

BLOCK = 4096


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest, local_root: Path) -> PolicyStore:
    if request.param == "local":
        return PolicyStore(LocalDriver(local_root))
    from warren_blockd.blobs.s3 import S3Driver

    endpoint = request.getfixturevalue("seaweedfs")
    bucket = request.getfixturevalue("bucket")
    return PolicyStore(S3Driver(bucket, endpoint=endpoint, access_key="any", secret_key="any", timeout=30))


def block(fill: int, count: int = 1) -> bytes:
    return bytes([fill]) * BLOCK * count


def test_restore_is_manifest_plus_log_tail(store: PolicyStore) -> None:
    ws = Workspace(store, "w1")
    ws.create(1024)
    lane = LogLane(ws, next_seq=1)
    lane.publish([(0, block(1, 2))])
    lane.publish([(1, block(2))])
    m = ws.effective()
    assert m.log_seq == 2
    first, second = m.lookup(0), m.lookup(1)
    assert first is not None and second is not None and first[0] != second[0]
    ws.consolidate()
    lane.publish([(5, block(3))])
    restored = Workspace(store, "w1").effective()
    assert restored.log_seq == 3 and restored.lookup(5) is not None and restored.lookup(1) == second


def test_fork_copies_no_data_and_children_diverge(store: PolicyStore) -> None:
    src = Workspace(store, "src")
    src.create(1024)
    LogLane(src, 1).publish([(0, block(7, 8))])
    chunks_before = store.list("chunks/")
    children = [f"child-{i}" for i in range(8)]
    assert src.fork(children) == dict.fromkeys(children)
    assert store.list("chunks/") == chunks_before  # nothing copied
    for child in children:
        assert Workspace(store, child).effective().lookup(3) == src.effective().lookup(3)
    LogLane(Workspace(store, "child-0"), 1).publish([(3, block(9))])
    assert Workspace(store, "child-0").effective().lookup(3) != src.effective().lookup(3)
    assert Workspace(store, "child-1").effective().lookup(3) == src.effective().lookup(3)


def test_a_fork_writes_the_same_few_bytes_whatever_the_source_size(store: PolicyStore) -> None:
    from warren_blockd.manifest import Extent, Manifest

    sizes = {}
    for name, extents in (("small", 10), ("large", 5000)):
        manifest = Manifest(extents * 2, tuple(Extent(i * 2, 1, f"{i:064x}") for i in range(extents)))
        Workspace(store, name).create(manifest.size_blocks, manifest)
        assert Workspace(store, name).fork([f"{name}-kid"]) == {f"{name}-kid": None}
        [key] = store.list(f"workspaces/{name}-kid/manifests/")
        sizes[name] = len(store.get(key))
        assert Workspace(store, f"{name}-kid").effective().extents == manifest.extents
    assert sizes["small"] == sizes["large"] < 200


def test_generations_under_a_fork_are_kept_until_the_fork_flattens(store: PolicyStore) -> None:
    src = Workspace(store, "base")
    src.create(64)
    lane = LogLane(src, 1)
    lane.publish([(0, block(1))])
    assert src.fork(["leaf"]) == {"leaf": None}  # consolidates the tail first, then stands on it
    for i in range(6):  # many consolidations later the fork's base is still there
        lane.publish([(1, block(10 + i))])
        src.consolidate(keep=1)
    leaf = Workspace(store, "leaf")
    assert leaf.effective().lookup(0) == Workspace(store, "base").effective().lookup(0)
    assert leaf.effective().lookup(1) is None
    LogLane(leaf, 1).publish([(2, block(3))])
    leaf.consolidate()  # flattened: the source's old generation is free to go
    assert store.list("workspaces/base/refs/") == []
    src.consolidate(keep=1)
    lane.publish([(1, block(99))])
    src.consolidate(keep=1)
    assert len(store.list("workspaces/base/manifests/")) <= 2
    assert leaf.effective().lookup(2) is not None and leaf.effective().lookup(0) is not None


def test_fork_into_an_existing_id_fails_alone(store: PolicyStore) -> None:
    src = Workspace(store, "src2")
    src.create(16)
    Workspace(store, "taken").create(16)
    result = src.fork(["fresh", "taken"])
    assert result["fresh"] is None and "already exists" in str(result["taken"])


def test_split_brain_stops_the_lane(store: PolicyStore) -> None:
    ws = Workspace(store, "contested")
    ws.create(64)
    mine, theirs = LogLane(ws, 1), LogLane(ws, 1)
    theirs.publish([(0, block(1))])
    with pytest.raises(SplitBrainError):
        mine.publish([(0, block(2))])
    with pytest.raises(SplitBrainError):  # stopped for good, even for a fresh sequence number
        mine.publish([(1, block(3))])
    assert ws.effective().log_seq == 1


def test_partial_blocks_refused(store: PolicyStore) -> None:
    ws = Workspace(store, "w3")
    ws.create(8)
    with pytest.raises(ValueError, match="whole 4 KiB blocks"):
        LogLane(ws, 1).publish([(0, b"short")])
