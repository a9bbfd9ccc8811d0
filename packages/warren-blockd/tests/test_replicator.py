"""Replication: receipts never claim more than is proven, the backlog bound slows writers
down, spooled batches survive a crash, and split brain stops the lane. The outage is a
wrapper driver that fails on demand (a real store cannot be taken down and back per test)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore, RetryPolicy
from warren_blockd.errors import FatalError, TransientError
from warren_blockd.replicator import Replicator
from warren_blockd.workspace import LogLane, SplitBrainError, Workspace
from warren_common.testing import wait_for

BLOCK = 4096


class Switchable(LocalDriver):
    """A local store that can be made unreachable (every call a transient error)."""

    up = True

    def _check(self, key: str) -> None:
        if not self.up:
            raise TransientError(key, "store unreachable (injected)")

    def get(self, key: str) -> bytes:
        self._check(key)
        return super().get(key)

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        self._check(key)
        super().put(key, data, create_only=create_only)

    def exists(self, key: str) -> bool:
        self._check(key)
        return super().exists(key)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Switchable, Workspace]:
    driver = Switchable(tmp_path / "store")
    store = PolicyStore(driver, RetryPolicy(attempts=2, base_delay=0.001), sleep=lambda _s: None)
    ws = Workspace(store, "ws")
    ws.create(1024)
    return driver, ws


def test_local_then_replicated(setup: tuple[Switchable, Workspace], tmp_path: Path) -> None:
    _, ws = setup
    rep = Replicator(ws, tmp_path / "spool", backlog_bound=1 << 20, next_seq=1)
    rep.write(0, b"a" * BLOCK)
    receipt = rep.flush()
    assert receipt.level == "local"
    assert rep.wait_replicated(receipt.seq, timeout=10).level == "replicated"
    assert ws.effective().lookup(0) is not None
    assert not list((tmp_path / "spool").glob("*.batch"))
    rep.close()


def test_receipt_stays_local_while_the_store_is_down(
    setup: tuple[Switchable, Workspace], tmp_path: Path
) -> None:
    driver, ws = setup
    driver.up = False
    rep = Replicator(ws, tmp_path / "spool", backlog_bound=1 << 20, next_seq=1)
    rep.write(0, b"b" * BLOCK)
    receipt = rep.flush()
    assert rep.wait_replicated(receipt.seq, timeout=0.3).level == "local"
    assert len(list((tmp_path / "spool").glob("*.batch"))) == 1  # kept on node disk
    driver.up = True
    assert rep.wait_replicated(receipt.seq, timeout=10).level == "replicated"
    rep.close()


def test_writers_wait_only_at_the_bound(setup: tuple[Switchable, Workspace], tmp_path: Path) -> None:
    driver, ws = setup
    driver.up = False
    rep = Replicator(ws, tmp_path / "spool", backlog_bound=2 * BLOCK, next_seq=1)
    # The spool holds stored (compressed) bytes: incompressible writes fill it as written.
    rep.write(0, os.urandom(BLOCK))
    rep.flush()  # backlog below the bound: returns at once
    assert rep.waits == 0
    rep.write(1, os.urandom(BLOCK))
    rep.flush()  # now the backlog is at the bound
    done = threading.Event()

    def third() -> None:
        rep.write(2, b"e" * BLOCK)
        rep.flush()
        done.set()

    thread = threading.Thread(target=third)
    thread.start()
    wait_for(lambda: rep.waits >= 1, 10, "the third writer to be held back", interval=0.01)
    assert not done.is_set()
    driver.up = True  # the uploader drains; the writer goes on
    assert done.wait(10)
    thread.join()
    assert rep.wait_replicated(3, timeout=10).level == "replicated"
    rep.close()


def test_spooled_batches_survive_a_crash(setup: tuple[Switchable, Workspace], tmp_path: Path) -> None:
    driver, ws = setup
    driver.up = False
    crashed = Replicator(ws, tmp_path / "spool", backlog_bound=1 << 20, next_seq=1)
    crashed.write(4, b"f" * BLOCK)
    crashed.flush()
    crashed.close(drain=False)  # gone before it could upload
    assert not crashed._thread.is_alive()
    driver.up = True
    resumed = Replicator(ws, tmp_path / "spool", backlog_bound=1 << 20, next_seq=1)
    assert resumed.wait_replicated(1, timeout=10).level == "replicated"
    assert ws.effective().lookup(4) is not None
    resumed.close()


def test_a_record_we_already_published_is_not_split_brain(
    setup: tuple[Switchable, Workspace], tmp_path: Path
) -> None:
    _, ws = setup
    rep = Replicator(ws, tmp_path / "spool", backlog_bound=1 << 20, next_seq=1)
    rep.write(0, b"g" * BLOCK)
    batch = rep.flush()
    saved = tmp_path / "saved.batch"
    shutil.copy(tmp_path / "spool" / f"{batch.seq:016d}.batch", saved)
    assert rep.wait_replicated(batch.seq, timeout=10).level == "replicated"
    rep.close()
    # A crash between publishing and deleting the spool file: the batch is still there.
    shutil.copy(saved, tmp_path / "spool" / f"{batch.seq:016d}.batch")
    again = Replicator(ws, tmp_path / "spool", backlog_bound=1 << 20, next_seq=1)
    assert again.wait_replicated(batch.seq, timeout=10).level == "replicated"
    assert again.error is None
    again.close()


def test_split_brain_stops_replication(setup: tuple[Switchable, Workspace], tmp_path: Path) -> None:
    _, ws = setup
    LogLane(ws, 1).publish([(0, b"x" * BLOCK)])  # another writer holds sequence 1
    rep = Replicator(ws, tmp_path / "spool", backlog_bound=1 << 20, next_seq=1)
    rep.write(0, b"y" * BLOCK)
    receipt = rep.flush()
    with pytest.raises(SplitBrainError):
        rep.wait_replicated(receipt.seq, timeout=10)
    with pytest.raises(SplitBrainError):
        rep.flush()
    rep.close()


def test_a_store_that_refuses_us_stops_replication_and_keeps_the_spool(
    setup: tuple[Switchable, Workspace], tmp_path: Path
) -> None:
    driver, ws = setup

    def refuse(key: str, data: bytes, *, create_only: bool = False) -> None:
        raise FatalError(key, "AccessDenied: check the bucket and credentials (injected)")

    driver.put = refuse  # type: ignore[method-assign]
    rep = Replicator(ws, tmp_path / "spool", backlog_bound=1 << 20, next_seq=1)
    rep.write(0, b"z" * BLOCK)
    receipt = rep.flush()
    with pytest.raises(FatalError):
        rep.wait_replicated(receipt.seq, timeout=10)
    assert len(list((tmp_path / "spool").glob("*.batch"))) == 1
    rep.close()


def test_a_batch_becomes_contiguous_runs_with_the_newest_write_winning() -> None:
    from warren_blockd.replicator import MAX_PAYLOAD_BLOCKS, _runs

    def blocks(fill: int, count: int) -> bytes:
        return bytes([fill]) * BLOCK * count

    # Streaming writes merge into full payloads; a gap starts a new run.
    long = [(i * 32, blocks(1, 32)) for i in range(MAX_PAYLOAD_BLOCKS // 16)] + [(10_000, blocks(2, 1))]
    runs = _runs(long)
    assert [(first, len(data) // BLOCK) for first, data in runs] == [
        (0, MAX_PAYLOAD_BLOCKS),
        (MAX_PAYLOAD_BLOCKS, MAX_PAYLOAD_BLOCKS),
        (10_000, 1),
    ]
    # Rewrites inside one batch: the later write wins block by block.
    runs = _runs([(0, blocks(1, 4)), (2, blocks(9, 4)), (1, blocks(5, 1))])
    assert runs == [(0, blocks(1, 1) + blocks(5, 1) + blocks(9, 4))]
