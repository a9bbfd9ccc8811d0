"""Continuous replication of one workspace's writes, with receipts and bounded backpressure.

Writes gather into a batch; `flush` seals the batch into a spool file on node disk
(fsync'd: that is the `local` receipt) and queues it. One uploader publishes spooled
batches in strict sequence order through the log lane, chunks first, record last; once the
record is confirmed the batch is `replicated` and its spool file goes. The spool's size is
bounded: below the bound writers never wait; at it, they wait for the uploader.

After a crash, a new replicator finds the spooled batches and publishes them again. A
record that already exists with exactly our content was ours (published just before the
crash) and counts as done; any other content at that sequence number is split brain.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from warren_blockd.errors import BlobError, FatalError
from warren_blockd.workspace import LogLane, SplitBrainError, Workspace

BLOCK = 4096
MAX_PAYLOAD_BLOCKS = 64  # a write payload becomes one chunk of at most 256 KiB


@dataclass(frozen=True)
class Receipt:
    workspace: str
    seq: int
    level: Literal["local", "replicated"]


class Replicator:
    def __init__(
        self, workspace: Workspace, spool: Path, backlog_bound: int, next_seq: int, *, start: bool = True
    ) -> None:
        self.workspace = workspace
        self.spool = spool
        self.bound = backlog_bound
        spool.mkdir(parents=True, exist_ok=True)
        self.lane = LogLane(workspace, next_seq)
        self._batch: dict[int, bytes] = {}  # block -> newest data: rewrites in a batch coalesce
        self._cond = threading.Condition()
        self._queue: list[int] = sorted(int(p.stem) for p in spool.glob("*.batch"))
        self._backlog = sum(p.stat().st_size for p in spool.glob("*.batch"))
        self._next_spool_seq = max(self._queue, default=next_seq - 1) + 1
        self.lane.next_seq = min(self._queue, default=next_seq)
        self.replicated_seq = self.lane.next_seq - 1
        # Split brain or a store that refuses us for good: the uploader stops, the spool stays.
        self.error: SplitBrainError | FatalError | None = None
        self._closing = False
        self._abandon = False
        self.waits = 0  # times a writer waited at the bound (a metric)
        self._thread = threading.Thread(
            target=self._upload_loop, name=f"replicate-{workspace.workspace_id}", daemon=True
        )
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start uploading (a caller that must read the spool first creates us with start=False)."""
        self._thread.start()

    # -- writers ---------------------------------------------------------------------

    def write(self, first_block: int, data: bytes) -> None:
        if not data or len(data) % BLOCK:
            raise ValueError(f"a write is whole 4 KiB blocks; got {len(data)} bytes")
        with self._cond:
            for i in range(len(data) // BLOCK):
                self._batch[first_block + i] = data[i * BLOCK : (i + 1) * BLOCK]

    @property
    def pending_blocks(self) -> int:
        """Blocks written since the last flush (not yet on node disk as a batch)."""
        with self._cond:
            return len(self._batch)

    @property
    def backlog_bytes(self) -> int:
        with self._cond:
            return self._backlog

    def flush(self) -> Receipt:
        """Seal the current batch on node disk; returns a `local` receipt for it."""
        with self._cond:
            if self.error:
                raise self.error
            if not self._batch:  # nothing new: the receipt is for the last sealed batch
                last = self._next_spool_seq - 1
                level: Literal["local", "replicated"] = (
                    "replicated" if self.replicated_seq >= last else "local"
                )
                return Receipt(self.workspace.workspace_id, last, level)
            while self._backlog >= self.bound and not self.error:
                self.waits += 1
                self._cond.wait()  # at the bound: slow down until the uploader drains
            if self.error:
                raise self.error
            seq = self._next_spool_seq
            self._next_spool_seq += 1
            blocks, self._batch = self._batch, {}
        path = self._write_spool(seq, _runs(blocks))
        with self._cond:
            self._backlog += path.stat().st_size
            self._queue.append(seq)
            self._cond.notify_all()
        return Receipt(self.workspace.workspace_id, seq, "local")

    def wait_replicated(self, seq: int, timeout: float) -> Receipt:
        """`replicated` once the record for `seq` is confirmed in storage; after `timeout`
        the receipt stays `local`: never more than is proven."""
        with self._cond:
            self._cond.wait_for(lambda: self.replicated_seq >= seq or self.error is not None, timeout)
            if self.replicated_seq >= seq:
                return Receipt(self.workspace.workspace_id, seq, "replicated")
            if self.error:
                raise self.error
            return Receipt(self.workspace.workspace_id, seq, "local")

    def close(self, timeout: float = 10, drain: bool = True) -> None:
        """Stop the uploader: after the spool is drained, or at once with drain=False
        (what a crash amounts to: spooled batches stay for the next replicator)."""
        with self._cond:
            self._closing = True
            self._abandon = not drain
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.lane.close()

    # -- spool -----------------------------------------------------------------------

    def spooled(self) -> list[tuple[int, bytes]]:
        """Every write still waiting in the spool, oldest first (a restart serves them from
        node disk until they are replicated)."""
        with self._cond:
            queue = list(self._queue)
        return [run for seq in queue for run in self._read_spool(seq)]

    def _spool_path(self, seq: int) -> Path:
        return self.spool / f"{seq:016d}.batch"

    def _write_spool(self, seq: int, batch: list[tuple[int, bytes]]) -> Path:
        header = json.dumps([[first, len(data)] for first, data in batch]).encode() + b"\n"
        path = self._spool_path(seq)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as handle:
            handle.write(header)
            for _, data in batch:
                handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
        return path

    def _read_spool(self, seq: int) -> list[tuple[int, bytes]]:
        raw = self._spool_path(seq).read_bytes()
        header, _, body = raw.partition(b"\n")
        batch, offset = [], 0
        for first, length in json.loads(header):
            batch.append((first, body[offset : offset + length]))
            offset += length
        return batch

    # -- uploader --------------------------------------------------------------------

    def _upload_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if self._closing and (self._abandon or not self._queue):
                    return
                seq = self._queue[0]
            batch = self._read_spool(seq)
            try:
                self._publish(seq, batch)
            except (SplitBrainError, FatalError) as exc:
                with self._cond:
                    self.error = exc
                    self._cond.notify_all()
                return
            except (BlobError, OSError):  # unreachable for now: keep the spool, try again
                with self._cond:
                    self._cond.wait(0.5)
                continue
            size = self._spool_path(seq).stat().st_size
            self._spool_path(seq).unlink()
            with self._cond:
                self._queue.pop(0)
                self._backlog -= size
                self.replicated_seq = seq
                self._cond.notify_all()

    def _publish(self, seq: int, batch: list[tuple[int, bytes]]) -> None:
        self.lane.next_seq = seq
        try:
            self.lane.publish(batch)
        except SplitBrainError:
            if self._already_ours(seq, batch):
                self.lane.stopped = None
                self.lane.next_seq = seq + 1
                return
            raise

    def _already_ours(self, seq: int, batch: list[tuple[int, bytes]]) -> bool:
        """Whether the record at `seq` is exactly the one this batch makes (published by us
        just before a crash, so resuming must not call it split brain)."""
        from warren_blockd import chunks

        key = f"{self.workspace.prefix}log/{seq:016d}"
        record = json.loads(self.workspace.store.get(key))
        ours = [[first, len(data) // BLOCK, chunks.digest_of(data), 0] for first, data in batch]
        return bool(record.get("extents") == ours)


def _runs(blocks: dict[int, bytes]) -> list[tuple[int, bytes]]:
    """Contiguous runs of blocks, each at most one payload long."""
    runs: list[tuple[int, bytes]] = []
    start, parts = -1, list[bytes]()
    for block in sorted(blocks):
        if parts and (block != start + len(parts) or len(parts) == MAX_PAYLOAD_BLOCKS):
            runs.append((start, b"".join(parts)))
            parts = []
        if not parts:
            start = block
        parts.append(blocks[block])
    if parts:
        runs.append((start, b"".join(parts)))
    return runs
