"""One workspace as a block device: its manifest below, a copy-on-write layer on node disk above.

Reads take a block from the dirty layer if it was written here, else from its chunk (faulted
in and verified by the chunk cache), else zeros. Writes land in the dirty layer (a sparse
file on node disk) and in the replicator's batch; a batch is sealed on node disk at every
flush, and when it grows past `batch_bytes`, so memory stays bounded.

The dirty layer is a cache, not the record: after a restart it is rebuilt from the spool
(batches not yet replicated), and everything older comes back from storage. A handoff is
not a restart: the new daemon adopts the layer as it is (`dirty_map`, the bitmap of what
was written), with the manifest the old daemon attached from, so nothing is fetched again.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from warren_blockd import metrics
from warren_blockd.cache import ChunkCache
from warren_blockd.manifest import BLOCK_SIZE, Manifest
from warren_blockd.replicator import Receipt, Replicator

ZERO_BLOCK = bytes(BLOCK_SIZE)


class Device:
    def __init__(
        self,
        manifest: Manifest,
        cache: ChunkCache,
        replicator: Replicator,
        dirty_path: Path,
        batch_bytes: int = 32 << 20,
        *,
        dirty_map: bytes | None = None,
    ) -> None:
        self.manifest = manifest
        self.cache = cache
        self.replicator = replicator
        self.size = manifest.size_blocks * BLOCK_SIZE
        self.batch_blocks = max(1, batch_bytes // BLOCK_SIZE)
        self._write_lock = threading.Lock()
        if dirty_map is not None:  # a handoff: the layer and its map as the old daemon left them
            if len(dirty_map) != (manifest.size_blocks + 7) // 8:
                raise ValueError(f"a dirty map of {len(dirty_map)} bytes for {manifest.size_blocks} blocks")
            self._fd = os.open(dirty_path, os.O_RDWR)
            if os.fstat(self._fd).st_size != self.size:
                os.close(self._fd)
                raise ValueError(f"{dirty_path} is not {self.size} bytes long")
            self._dirty = bytearray(dirty_map)
            return
        dirty_path.unlink(missing_ok=True)
        self._fd = os.open(dirty_path, os.O_RDWR | os.O_CREAT, 0o600)
        os.ftruncate(self._fd, self.size)
        self._dirty = bytearray((manifest.size_blocks + 7) // 8)  # one bit per block
        for first, data in replicator.spooled():  # not yet replicated: serve it from here
            self._store_blocks(first, data)

    def close(self) -> None:
        os.close(self._fd)

    def _is_dirty(self, block: int) -> bool:
        return bool(self._dirty[block >> 3] & (1 << (block & 7)))

    def _store_blocks(self, first: int, data: bytes) -> None:
        os.pwrite(self._fd, data, first * BLOCK_SIZE)
        for block in range(first, first + len(data) // BLOCK_SIZE):  # marked after the bytes land
            self._dirty[block >> 3] |= 1 << (block & 7)

    def _block(self, block: int) -> bytes:
        if self._is_dirty(block):
            return os.pread(self._fd, BLOCK_SIZE, block * BLOCK_SIZE)
        where = self.manifest.lookup(block)
        if where is None:
            return ZERO_BLOCK
        digest, index = where
        raw = self.cache.get(digest)
        return raw[index * BLOCK_SIZE : (index + 1) * BLOCK_SIZE]

    def read(self, offset: int, size: int) -> bytes:
        size = max(0, min(size, self.size - offset))
        if size == 0:
            return b""
        first, last = offset // BLOCK_SIZE, (offset + size - 1) // BLOCK_SIZE
        data = b"".join(self._block(b) for b in range(first, last + 1))
        start = offset - first * BLOCK_SIZE
        metrics.READ_BYTES.inc(size)
        return data[start : start + size]

    def write(self, offset: int, data: bytes) -> int:
        if offset + len(data) > self.size:
            raise ValueError(
                f"write of {len(data)} bytes at {offset} passes the end of the device ({self.size})"
            )
        with self._write_lock:
            first = offset // BLOCK_SIZE
            head = offset - first * BLOCK_SIZE
            end = offset + len(data)
            last = (end - 1) // BLOCK_SIZE
            if head or end % BLOCK_SIZE:  # a partial block: merge with what is there
                current = bytearray(self.read(first * BLOCK_SIZE, (last - first + 1) * BLOCK_SIZE))
                current[head : head + len(data)] = data
                data = bytes(current)
            self._store_blocks(first, data)
            self.replicator.write(first, data)
        metrics.WRITE_BYTES.inc(end - offset)
        if self.replicator.pending_blocks >= self.batch_blocks:
            self.flush()  # may wait at the backlog bound: that is the slow-down
        return end - offset

    def flush(self) -> Receipt:
        """Seal the writes so far on node disk: a `local` receipt (or `replicated`, if nothing
        new was written since a batch that is already in storage)."""
        before = self.replicator.waits
        receipt = self.replicator.flush()
        metrics.FLUSHES.inc()
        metrics.BACKPRESSURE_WAITS.inc(self.replicator.waits - before)
        return receipt

    def dirty_map(self) -> bytes:
        """The bitmap of blocks held in the dirty layer (for a handoff, once writes stopped)."""
        with self._write_lock:
            return bytes(self._dirty)

    def dirty_blocks(self) -> int:
        # One popcount over the whole map: a byte at a time took ~40 ms for a 10 GiB
        # workspace, and every publish on the node reads every workspace's count (/v1/stats).
        return int.from_bytes(self._dirty, "little").bit_count()
