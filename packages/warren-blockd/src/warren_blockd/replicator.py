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
from concurrent.futures import Future
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal

from warren_blockd import chunks
from warren_blockd.errors import BlobError, FatalError
from warren_blockd.workspace import LogLane, SplitBrainError, Workspace

BLOCK = 4096
PIPELINE_BYTES = 96 << 20  # spooled bytes whose chunks may be uploading at once
MAX_PAYLOAD_BLOCKS = 256  # a write payload becomes one chunk of at most 1 MiB: fewer, larger PUTs


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
        self._batch: list[tuple[int, bytes]] = []  # writes since the last seal, in arrival order
        self._pending = 0  # blocks in them
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
        self._paused = False  # a handoff: stop at a batch boundary, keep everything
        self.waits = 0  # times a writer waited at the bound (a metric)
        self._thread = threading.Thread(
            target=self._upload_loop, name=f"replicate-{workspace.workspace_id}", daemon=True
        )
        if start:
            self._thread.start()

    def start(self) -> None:
        """Start uploading (a caller that must read the spool first creates us with start=False)."""
        self._thread.start()

    def stop(self, error: SplitBrainError) -> None:
        """Publish nothing more (another node took the workspace over): what is sealed stays
        in the spool, and flushes answer `error`."""
        with self._cond:
            self.lane.stopped = str(error)
            self.error = error
            self._cond.notify_all()

    def pause(self, timeout: float) -> bool:
        """Stop uploading between two records and wait for the uploader to end (a handoff:
        two uploaders on one lane would be split brain). The spool and the queue stay as
        they are. False if the uploader is still at work after `timeout`."""
        with self._cond:
            self._paused = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def resume(self) -> None:
        """Upload again after a `pause` (the handoff failed: this process goes on)."""
        with self._cond:
            self._paused = False
            if self._thread.is_alive() or self.error is not None:
                return
            self._thread = threading.Thread(
                target=self._upload_loop, name=f"replicate-{self.workspace.workspace_id}", daemon=True
            )
        self._thread.start()

    @property
    def next_spool_seq(self) -> int:
        """The sequence number the next sealed batch gets."""
        with self._cond:
            return self._next_spool_seq

    # -- writers ---------------------------------------------------------------------

    def write(self, first_block: int, data: bytes) -> None:
        if not data or len(data) % BLOCK:
            raise ValueError(f"a write is whole 4 KiB blocks; got {len(data)} bytes")
        with self._cond:
            self._batch.append((first_block, data))
            self._pending += len(data) // BLOCK

    @property
    def pending_blocks(self) -> int:
        """Blocks written since the last flush (not yet on node disk as a batch)."""
        with self._cond:
            return self._pending

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
            # At the bound: slow down until the uploader drains. Not while a handoff holds the
            # uploader: the batch goes past the bound for that moment, to the new uploader.
            while self._backlog >= self.bound and not self.error and not self._paused:
                self.waits += 1
                self._cond.wait()
            if self.error:
                raise self.error
            seq = self._next_spool_seq
            self._next_spool_seq += 1
            writes, self._batch, self._pending = self._batch, [], 0
        path = self._write_spool(seq, _runs(writes))
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

    def uploading(self) -> bool:
        return self._thread.is_alive()

    # -- spool -----------------------------------------------------------------------

    def spooled(self) -> list[tuple[int, bytes]]:
        """Every write still waiting in the spool, oldest first (a restart serves them from
        node disk until they are replicated). Each is verified as it is decoded."""
        with self._cond:
            queue = list(self._queue)
        return [
            (run.first, chunks.decode(run.digest, run.stored))
            for seq in queue
            for run in self._read_spool(seq)
        ]

    def _spool_path(self, seq: int) -> Path:
        return self.spool / f"{seq:016d}.batch"

    def _write_spool(self, seq: int, batch: list[tuple[int, bytes]]) -> Path:
        # Chunks are encoded (hashed, compressed) as they are sealed: the spool holds exactly
        # the bytes that go to storage, so the backlog bound counts stored bytes and the
        # uploader only moves them.
        sealed = [(first, len(data) // BLOCK, *chunks.encode(data)) for first, data in batch]
        header = json.dumps([[first, count, digest, len(stored)] for first, count, digest, stored in sealed])
        path = self._spool_path(seq)
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as handle:
            handle.write(header.encode() + b"\n")
            for *_, stored in sealed:
                handle.write(stored)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(path)
        return path

    def _read_spool(self, seq: int) -> list[SealedRun]:
        # One read per chunk: no copy of the whole batch, and the GIL is free while reading.
        with self._spool_path(seq).open("rb") as handle:
            return [
                SealedRun(first, count, digest, handle.read(length))
                for first, count, digest, length in json.loads(handle.readline())
            ]

    # -- uploader --------------------------------------------------------------------

    def _upload_loop(self) -> None:
        # Chunks of the next few batches go up while earlier records are still being
        # published; records themselves are published strictly in order, each only after
        # all of its chunks are confirmed.
        inflight: dict[int, tuple[list[SealedRun], list[Future[str]]]] = {}
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing or self._paused)
                if self._paused or (self._closing and (self._abandon or not self._queue)):
                    return
                window = self._window()
            for seq in window:
                if seq not in inflight:
                    batch = self._read_spool(seq)
                    inflight[seq] = (batch, self.lane.upload_encoded([(r.digest, r.stored) for r in batch]))
            seq = window[0]
            batch, futures = inflight[seq]
            try:
                for future in futures:
                    future.result()  # every chunk confirmed before its record
                self._publish(seq, batch)
            except (SplitBrainError, FatalError) as exc:
                with self._cond:
                    self.error = exc
                    self._cond.notify_all()
                return
            except (BlobError, OSError):  # unreachable for now: keep the spool, try again
                inflight.clear()
                with self._cond:
                    self._cond.wait(0.5)
                continue
            del inflight[seq]
            size = self._spool_path(seq).stat().st_size
            self._spool_path(seq).unlink()
            with self._cond:
                self._queue.pop(0)
                self._backlog -= size
                self.replicated_seq = seq
                self._cond.notify_all()

    def _window(self) -> list[int]:
        """The queued batches whose chunks may be in flight: up to PIPELINE_BYTES of spool."""
        window: list[int] = []
        held = 0
        for seq in self._queue:
            size = self._spool_path(seq).stat().st_size
            if window and held + size > PIPELINE_BYTES:
                break
            window.append(seq)
            held += size
        return window

    def _publish(self, seq: int, batch: list[SealedRun]) -> None:
        self.lane.next_seq = seq
        extents = [[run.first, run.count, run.digest, 0] for run in batch]
        try:
            self.lane.record_extents(extents)
        except SplitBrainError:
            if self._already_ours(seq, extents):
                self.lane.stopped = None
                self.lane.next_seq = seq + 1
                return
            raise

    def _already_ours(self, seq: int, extents: list[list[Any]]) -> bool:
        """Whether the record at `seq` is exactly the one this batch makes (published by us
        just before a crash, so resuming must not call it split brain)."""
        key = f"{self.workspace.prefix}log/{seq:016d}"
        record = json.loads(self.workspace.store.get(key))
        return bool(record.get("extents") == extents)


@dataclass(frozen=True)
class SealedRun:
    """A run of blocks as sealed in the spool: its chunk, encoded."""

    first: int
    count: int
    digest: str
    stored: bytes


def _runs(writes: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """The batch as contiguous runs of blocks, each at most one payload long, later writes
    winning where writes overlap."""
    ordered = sorted(writes, key=lambda w: w[0])  # stable: arrival order kept for equal starts
    overlapping = any(b[0] < a[0] + len(a[1]) // BLOCK for a, b in pairwise(ordered))
    if overlapping:  # rewrites inside one batch: resolve block by block (newest wins)
        blocks: dict[int, memoryview] = {}
        for first, data in writes:
            view = memoryview(data)
            for i in range(len(data) // BLOCK):
                blocks[first + i] = view[i * BLOCK : (i + 1) * BLOCK]
        ordered = [(block, bytes(blocks[block])) for block in sorted(blocks)]
    runs: list[tuple[int, bytes]] = []
    start, parts, size = -1, list[bytes](), 0
    for first, data in ordered:
        view, pos = memoryview(data), 0
        while pos < len(data):
            block = first + pos // BLOCK
            if parts and (block != start + size or size == MAX_PAYLOAD_BLOCKS):
                runs.append((start, b"".join(parts)))
                parts, size = [], 0
            if not parts:
                start = block
            take = min(len(data) - pos, (MAX_PAYLOAD_BLOCKS - size) * BLOCK)
            parts.append(bytes(view[pos : pos + take]) if take < len(data) else data)
            size += take // BLOCK
            pos += take
    if parts:
        runs.append((start, b"".join(parts)))
    return runs
