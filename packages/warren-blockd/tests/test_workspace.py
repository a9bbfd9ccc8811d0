"""Workspaces over a real store: restore, consolidation, forks that copy no data, and the
log lane's create-only publishing that stops on split brain, and release."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.workspace import LogLane, Released, SplitBrainError, Workspace, WorkspaceReleasedError

BLOCK = 4096


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


def test_a_torn_newest_generation_restores_from_the_one_before(store: PolicyStore) -> None:
    """A consolidation cut off mid-upload (its daemon killed) may leave a torn object where
    the newest generation would be: restore reads the one before and the log after it, and
    the next consolidation publishes the state whole after the torn one."""
    ws = Workspace(store, "w1")
    ws.create(1024)
    lane = LogLane(ws, next_seq=1)
    lane.publish([(0, block(1))])
    ws.consolidate()
    lane.publish([(1, block(2))])
    whole = ws.effective()
    store.put(ws._manifest_key(2, 2), b'{"size_blocks": 10')  # torn mid-upload
    restored = Workspace(store, "w1").effective()
    assert (
        restored.log_seq == 2
        and restored.lookup(1) == whole.lookup(1)
        and restored.lookup(0) == whole.lookup(0)
    )
    again = Workspace(store, "w1").consolidate()
    assert again.lookup(1) == whole.lookup(1)
    assert ws._generations()[-1][0] == 3  # after the torn one, which stays until it is old
    store.put(ws._manifest_key(4, 2), b"")  # torn with nothing new after it: published whole again
    assert Workspace(store, "w1").consolidate().lookup(1) == whole.lookup(1)
    assert ws._generations()[-1][0] == 5


def test_a_torn_last_record_names_nothing_and_a_torn_one_in_the_middle_is_refused(store: PolicyStore) -> None:
    ws = Workspace(store, "w1")
    ws.create(1024)
    lane = LogLane(ws, next_seq=1)
    lane.publish([(0, block(1))])
    store.put(f"{ws.prefix}log/{2:016d}", b'{"seq": 2, "ext')  # its writer killed mid-upload
    restored = ws.effective()
    assert restored.log_seq == 2 and restored.lookup(0) is not None and restored.lookup(1) is None
    fence = {"seq": 3, "extents": [], "fence": {"node": "b", "from": "a"}}
    store.put(f"{ws.prefix}log/{3:016d}", json.dumps(fence).encode())  # the takeover's fence
    store.put(f"{ws.prefix}log/{4:016d}", json.dumps({"seq": 4, "extents": []}).encode())
    assert ws.effective().log_seq == 4  # the new writer's own records after its fence
    other = Workspace(store, "w2")
    other.create(1024)
    store.put(f"{other.prefix}log/{1:016d}", b"")
    store.put(f"{other.prefix}log/{2:016d}", json.dumps({"seq": 2, "extents": []}).encode())
    with pytest.raises(RuntimeError, match="is torn and its writer went on"):
        other.effective()


def test_replicated_seq_is_the_newest_record_in_storage(store: PolicyStore) -> None:
    ws = Workspace(store, "w2")
    ws.create(1024)
    assert ws.replicated_seq() == 0
    lane = LogLane(ws, next_seq=1)
    lane.publish([(0, block(1))])
    lane.publish([(1, block(2))])
    assert ws.replicated_seq() == 2
    ws.consolidate()  # the tail is folded into a generation: the number stays
    assert ws.replicated_seq() == 2
    lane.publish([(2, block(3))])
    assert Workspace(store, "w2").replicated_seq() == 3
    ws.fork(["w2-child"])
    assert Workspace(store, "w2-child").replicated_seq() == 0  # its own writes count from the fork


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


def test_a_failed_fork_leaves_no_reference_behind(store: PolicyStore) -> None:
    src = Workspace(store, "src3")
    src.create(16)
    Workspace(store, "taken").create(16)
    assert src.fork(["fresh"]) == {"fresh": None}
    result = src.fork(["fresh", "taken"])  # fresh: a retry of the fork that made it
    assert "already exists" in str(result["fresh"]) and "already exists" in str(result["taken"])
    assert store.list("workspaces/src3/refs/") == ["workspaces/src3/refs/0000000000000000/fresh"]
    assert src.release().kept_for_forks == [0]  # only the fork that stands on it holds it


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


def read_all(ws: Workspace) -> bytes:
    """Every byte of a workspace as a restore serves it: chunks fetched and verified."""
    manifest = ws.effective()
    out = bytearray(manifest.size_blocks * BLOCK)
    for e in manifest.extents:
        data = ws.store.get_chunk(e.chunk)[e.chunk_offset * BLOCK : (e.chunk_offset + e.count) * BLOCK]
        out[e.first_block * BLOCK : e.end * BLOCK] = data
    return bytes(out)


def test_release_removes_records_and_generations_but_no_chunk(store: PolicyStore) -> None:
    ws = Workspace(store, "gone")
    ws.create(64)
    lane = LogLane(ws, 1)
    for i in range(3):
        lane.publish([(i, block(i + 1))])
        ws.consolidate()
    lane.publish([(9, block(9))])
    chunks_before = store.list("chunks/")
    done = ws.release()
    assert done == Released("gone", found=True, records_deleted=4, generations_deleted=4)
    assert store.list("workspaces/gone/") == ["workspaces/gone/released"]
    assert store.list("chunks/") == chunks_before  # shared: they are the gc's to collect
    again = Workspace(store, "gone").release()  # idempotent
    assert again == Released("gone", found=True)


def test_release_of_an_unknown_workspace_is_nothing_to_do(store: PolicyStore) -> None:
    assert Workspace(store, "never").release() == Released("never", found=False)
    assert store.list("workspaces/") == []  # no marker for an id nobody used


def test_a_released_id_is_refused_and_not_resurrected(store: PolicyStore) -> None:
    ws = Workspace(store, "done")
    ws.create(16)
    LogLane(ws, 1).publish([(0, block(1))])
    Workspace(store, "other").create(16)
    ws.release()
    for call in (ws.effective, ws.replicated_seq, lambda: ws.fork(["kid"]), lambda: ws.create(16)):
        with pytest.raises(WorkspaceReleasedError, match="done was released"):
            call()
    assert "was released" in str(Workspace(store, "other").fork(["done"])["done"])
    assert store.list("workspaces/done/") == ["workspaces/done/released"]


def test_a_release_cut_short_is_finished_by_the_next_call(store: PolicyStore) -> None:
    ws = Workspace(store, "half")
    ws.create(16)
    LogLane(ws, 1).publish([(0, block(1)), (1, block(2))])
    store.put("workspaces/half/released", b"")  # the first step of a release that then died
    with pytest.raises(WorkspaceReleasedError):
        ws.effective()
    assert ws.release() == Released("half", found=True, records_deleted=1, generations_deleted=1)
    assert store.list("workspaces/half/") == ["workspaces/half/released"]


def test_a_fork_outlives_its_released_parent(store: PolicyStore) -> None:
    parent = Workspace(store, "parent")
    parent.create(64)
    lane = LogLane(parent, 1)
    lane.publish([(0, block(1, 4))])
    lane.publish([(2, block(2))])
    assert parent.fork(["kid"]) == {"kid": None}
    lane.publish([(3, block(3))])  # the parent goes on after the fork
    parent.consolidate()
    kid = Workspace(store, "kid")
    before = read_all(kid)
    assert before[: 4 * BLOCK] == block(1, 2) + block(2) + block(1)

    done = parent.release()
    assert done.kept_for_forks == [1] and done.records_deleted == 3  # the generation under kid
    assert read_all(kid) == before  # every byte still restores
    assert parent.release().kept_for_forks == [1]  # and stays while kid stands on it

    LogLane(kid, 1).publish([(5, block(5))])
    kid.consolidate()  # flattened: kid no longer stands on the parent
    assert parent.release() == Released("parent", found=True, generations_deleted=1)
    assert store.list("workspaces/parent/") == ["workspaces/parent/released"]
    assert read_all(kid) == before[: 5 * BLOCK] + block(5) + before[6 * BLOCK :]


def test_a_kept_generation_keeps_its_own_base(store: PolicyStore) -> None:
    """grand stands on mid's first generation, which names root's: releasing mid and then
    root must leave the whole chain that grand reads through."""
    root = Workspace(store, "root")
    root.create(16)
    LogLane(root, 1).publish([(0, block(7, 2))])
    root.fork(["mid"])
    Workspace(store, "mid").fork(["grand"])
    grand = Workspace(store, "grand")
    before = read_all(grand)
    assert Workspace(store, "mid").release().kept_for_forks == [0]
    assert root.release().kept_for_forks == [1]  # mid's kept generation still stands on it
    assert read_all(grand) == before


def test_a_flattened_fork_keeps_its_base_while_its_own_fork_reads_through_it(store: PolicyStore) -> None:
    src = Workspace(store, "s")
    src.create(16)
    lane = LogLane(src, 1)
    lane.publish([(0, block(1))])
    src.fork(["c"])
    c = Workspace(store, "c")
    c.fork(["d"])  # d stands on c's first generation, which names src's
    LogLane(c, 1).publish([(1, block(2))])
    c.consolidate()  # c is flat now, d still is not
    for i in range(4):
        lane.publish([(2, block(3 + i))])
        src.consolidate(keep=1)
    assert read_all(Workspace(store, "d"))[:BLOCK] == block(1)


def test_a_fork_racing_a_release_leaves_no_child_on_a_dropped_generation(local_root: Path) -> None:
    """A release that writes its marker just after a fork put its reference: the fork sees
    the marker and backs out (else the release would not see the reference)."""

    class ReleaseAfterRef(LocalDriver):
        def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
            super().put(key, data, create_only=create_only)
            if "/refs/" in key:
                super().put("workspaces/racing/released", b"")

    store = PolicyStore(ReleaseAfterRef(local_root))
    src = Workspace(store, "racing")
    src.create(16)
    assert "was released" in str(src.fork(["late"])["late"])
    assert store.list("workspaces/racing/refs/") == []
    assert store.list("workspaces/late/") == []
    assert src.release().generations_deleted == 1


def test_a_consolidation_that_loses_to_another_of_the_same_state_is_not_an_error(local_root: Path) -> None:
    """The daemon's background consolidation and a fork's (or both daemons of a handoff)
    may publish the same generation at once: the one that comes second uses the first's."""

    class ConsolidatedMeanwhile(LocalDriver):
        raced = False

        def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
            if "/manifests/" in key and not key.endswith(("-0000000000000000",)) and not self.raced:
                self.raced = True
                super().put(key, data, create_only=True)  # the other consolidation, first
            super().put(key, data, create_only=create_only)

    driver = ConsolidatedMeanwhile(local_root)
    store = PolicyStore(driver)
    src = Workspace(store, "busy")
    src.create(1024)
    LogLane(src, 1).publish([(0, block(4, 2))])
    assert src.fork(["kid"]) == {"kid": None}  # it consolidates first, and loses that race
    assert driver.raced
    assert len(store.list("workspaces/busy/manifests/")) == 2  # generation 0 and the one published
    assert Workspace(store, "kid").effective().lookup(1) == src.effective().lookup(1)
