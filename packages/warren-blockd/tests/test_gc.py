"""Chunk collection: what nothing references goes once old enough, nothing a workspace or a
fork can still read goes, and a writer reusing a chunk never loses it to a gc in between.
Time is injected (the gc's `now`, file mtimes), never waited for."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from test_workspace import block, read_all
from warren_blockd import chunks
from warren_blockd.blobs import BlobDriver
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.gc import DEFAULT_GRACE, gc
from warren_blockd.manifest import Extent, Manifest
from warren_blockd.workspace import LogLane, Workspace

LATER = timedelta(hours=7)  # past the default grace


def later() -> datetime:
    return datetime.now(UTC) + LATER


def stored(store: PolicyStore) -> set[str]:
    return {key.rsplit("/", 1)[1] for key in store.list("chunks/")}


def age(local_root: Path, digest: str, hours: float) -> None:
    """Make a stored chunk look `hours` old (local files only)."""
    when = time.time() - hours * 3600
    os.utime(local_root / chunks.key_for(digest), (when, when))


def test_chunks_only_a_released_workspace_named_go_once_old_enough(store: PolicyStore) -> None:
    live, doomed = Workspace(store, "live"), Workspace(store, "doomed")
    live.create(16)
    doomed.create(16)
    LogLane(live, 1).publish([(0, block(1)), (1, block(9))])
    LogLane(doomed, 1).publish([(0, block(2)), (1, block(9))])  # block(9) is shared
    doomed.consolidate()
    theirs = stored(store) - live.effective().chunks()
    assert len(theirs) == 1
    doomed.release()

    young = gc(store)  # just released: too young to go
    assert (young.deleted, young.kept_young, young.referenced) == (0, 1, 2)
    assert stored(store) >= theirs
    dry = gc(store, now=later(), dry_run=True)
    assert dry.deleted == 1 and dry.dry_run and stored(store) >= theirs
    swept = gc(store, now=later())
    assert (swept.chunks_seen, swept.referenced, swept.deleted, swept.kept_young) == (3, 2, 1, 0)
    assert swept.bytes_freed > 0 and swept.missing == 0
    assert not stored(store) & theirs
    assert read_all(live)[: 2 * 4096] == block(1) + block(9)


def test_grace_zero_takes_every_unreferenced_chunk_at_once(store: PolicyStore) -> None:
    """What a store whose object times cannot be set (S3) can show without waiting."""
    kept = Workspace(store, "kept")
    kept.create(16)
    LogLane(kept, 1).publish([(0, block(3))])
    loose = store.put_chunk(block(4))  # uploaded, never named by any record
    assert gc(store, timedelta(hours=1)).kept_young == 1
    report = gc(store, timedelta(0))
    assert report.deleted == 1 and report.referenced == 1
    assert stored(store) == kept.effective().chunks() and loose not in stored(store)


def test_forks_keep_what_they_read_through_a_released_parent(store: PolicyStore) -> None:
    parent = Workspace(store, "parent")
    parent.create(64)
    lane = LogLane(parent, 1)
    lane.publish([(0, block(1, 4))])
    assert parent.fork(["kid"]) == {"kid": None}
    lane.publish([(1, block(2))])  # after the fork: only the parent ever named it
    parent.consolidate()
    kid = Workspace(store, "kid")
    before = read_all(kid)
    parent.release()

    report = gc(store, now=later())
    assert report.deleted == 1 and report.missing == 0
    assert read_all(kid) == before  # every byte, from chunks the parent wrote

    LogLane(kid, 1).publish([(3, block(3))])
    kid.consolidate()  # flat: the parent's generation is free to go, and the gc finishes it
    report = gc(store, now=later())
    assert report.releases_finished == 1 and report.deleted == 0
    assert store.list("workspaces/parent/") == ["workspaces/parent/released"]
    assert read_all(kid) == before[: 3 * 4096] + block(3) + before[4 * 4096 :]


def test_a_dry_run_counts_a_half_released_workspace_as_gone_and_a_run_finishes_it(
    store: PolicyStore,
) -> None:
    ws = Workspace(store, "half")
    ws.create(16)
    LogLane(ws, 1).publish([(0, block(2))])
    store.put("workspaces/half/released", b"")  # a release that died after its first step
    dry = gc(store, now=later(), dry_run=True)
    assert (dry.deleted, dry.releases_finished) == (1, 0)
    assert len(store.list("workspaces/half/")) == 3 and len(stored(store)) == 1
    report = gc(store, now=later())
    assert (report.deleted, report.releases_finished) == (1, 1)
    assert store.list("workspaces/half/") == ["workspaces/half/released"] and not stored(store)


def test_imported_chunks_named_only_by_a_generation_are_kept(store: PolicyStore) -> None:
    raw = block(5, 2)
    digest = store.put_chunk(raw)
    Workspace(store, "imported").create(8, Manifest(8, (Extent(0, 2, digest),)))
    assert gc(store, now=later()).deleted == 0 and digest in stored(store)


def test_a_workspace_consolidating_under_the_scan_is_read_again(local_root: Path) -> None:
    """The gc lists, then the workspace consolidates and drops the generation the gc was about
    to read: what that generation named is in the new one, and must be marked there."""
    armed = False

    class ConsolidatesMidScan(LocalDriver):
        def get(self, key: str) -> bytes:
            nonlocal armed
            if armed and "/manifests/" in key:
                armed = False
                busy.consolidate(keep=1)
                LogLane(busy, 2).publish([(2, block(8))])
                busy.consolidate(keep=1)  # the generation first listed goes here
            return super().get(key)

    store = PolicyStore(ConsolidatesMidScan(local_root))
    digest = store.put_chunk(block(6))  # an imported chunk: no log record names it
    busy = Workspace(store, "busy")
    busy.create(8, Manifest(8, (Extent(0, 1, digest),)))
    LogLane(busy, 1).publish([(1, block(7))])
    armed = True
    report = gc(store, now=later())
    assert not armed
    oldest = store.list("workspaces/busy/manifests/")[0]
    assert oldest.rsplit("/", 1)[1].startswith(f"{1:016d}-")  # generation 0 went under the scan
    assert report.deleted == 0 and digest in stored(store)
    assert read_all(busy)[:4096] == block(6)


def test_put_chunk_stores_an_old_chunk_again_and_reuses_a_young_one(
    store: PolicyStore, local_root: Path
) -> None:
    class Counting:
        def __init__(self, inner: BlobDriver) -> None:
            self.inner, self.puts = inner, 0

        def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
            self.puts += 1
            self.inner.put(key, data, create_only=create_only)

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

    counting = Counting(store.driver)
    assert store.grace == DEFAULT_GRACE  # writers and the gc agree by default
    writer = PolicyStore(counting)
    digest = writer.put_chunk(block(8))
    first = writer.stat(chunks.key_for(digest))
    assert counting.puts == 1 and first is not None
    writer.put_chunk(block(8))
    assert counting.puts == 1  # young: reused
    if isinstance(store.driver, LocalDriver):
        age(local_root, digest, 2)  # younger than grace/2 still: reused, its time untouched
        aged = writer.stat(chunks.key_for(digest))
        writer.put_chunk(block(8))
        assert counting.puts == 1 and writer.stat(chunks.key_for(digest)) == aged
        age(local_root, digest, 4)  # older than grace/2: stored again, its time renewed
        writer.put_chunk(block(8))
        renewed = writer.stat(chunks.key_for(digest))
        assert counting.puts == 2 and renewed is not None
        assert datetime.now(UTC) - renewed < timedelta(minutes=1)
    else:  # S3 object times cannot be set: a writer with no grace treats every chunk as old
        time.sleep(1.1)  # LastModified counts whole seconds
        eager = PolicyStore(counting, grace=timedelta(0))
        eager.put_chunk(block(8))
        renewed = writer.stat(chunks.key_for(digest))
        assert counting.puts == 2 and renewed is not None and renewed > first


def test_a_chunk_reused_by_a_writer_survives_a_gc_before_its_record(local_root: Path) -> None:
    """The race: a writer finds a chunk stored (its first workspace long released) and reuses
    it; a gc runs before the writer's record names it. Renewed at the check, it survives."""
    store = PolicyStore(LocalDriver(local_root))
    old = Workspace(store, "old")
    old.create(16)
    LogLane(old, 1).publish([(0, block(4))])
    old.release()
    [digest] = stored(store)
    age(local_root, digest, 5)  # between grace/2 and grace: not yet collectable

    new = Workspace(store, "new")
    new.create(16)
    assert store.put_chunk(block(4)) == digest  # the dedup check: stored again, not skipped
    report = gc(store, now=datetime.now(UTC) + timedelta(hours=1.5))  # 6.5 h after the first upload
    assert report.deleted == 0 and report.kept_young == 1
    LogLane(new, 1).record([(0, block(4))], [digest])
    assert read_all(new)[:4096] == block(4)
