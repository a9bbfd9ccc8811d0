"""The node's chunk cache: fetched chunks on local disk, verified before any byte is served.

A chunk is fetched from object storage once per node (concurrent readers of one cold chunk
wait for the same fetch), kept on disk uncompressed, and re-verified whenever it is loaded
from disk into memory: node disks corrupt bytes too. Verified chunks stay in a bounded
in-memory LRU so warm reads do not hash again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path

from warren_blockd import chunks, metrics
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.errors import CorruptError


class ChunkCache:
    def __init__(self, root: Path, store: PolicyStore, memory_bytes: int = 256 << 20) -> None:
        self.root = root
        self.store = store
        self.memory_bytes = memory_bytes
        root.mkdir(parents=True, exist_ok=True)
        self._memory: OrderedDict[str, bytes] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self._inflight: dict[str, Future[bytes]] = {}

    def _path(self, digest: str) -> Path:
        return self.root / digest[:2] / digest

    def get(self, digest: str) -> bytes:
        with self._lock:
            raw = self._memory.get(digest)
            if raw is not None:
                self._memory.move_to_end(digest)
                metrics.CACHE_HITS.labels("memory").inc()
                return raw
            pending = self._inflight.get(digest)
            owner = pending is None
            if pending is None:
                pending = self._inflight[digest] = Future()
        if not owner:
            return pending.result()  # another reader is fetching this chunk
        try:
            raw = self._load(digest)
            pending.set_result(raw)
            return raw
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                del self._inflight[digest]

    def _load(self, digest: str) -> bytes:
        path = self._path(digest)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            raw = None
        if raw is not None and chunks.digest_of(raw) == digest:
            metrics.CACHE_HITS.labels("disk").inc()
        else:
            if raw is not None:  # the node copy went bad: drop it, fetch again
                metrics.CORRUPT_CHUNKS.labels("node").inc()
            try:
                with metrics.FETCH_SECONDS.time():
                    raw = self.store.get_chunk(digest)  # verified, or CorruptError
            except CorruptError:
                metrics.CORRUPT_CHUNKS.labels("storage").inc()
                raise
            metrics.CHUNK_FETCHES.inc()
            self._keep_on_disk(path, raw)
        self._remember(digest, raw)
        return raw

    def _keep_on_disk(self, path: Path, raw: bytes) -> None:
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_name(f".{path.name}.{threading.get_ident()}")
        tmp.write_bytes(raw)
        tmp.replace(path)

    def _remember(self, digest: str, raw: bytes) -> None:
        with self._lock:
            if digest in self._memory:
                return
            self._memory[digest] = raw
            self._held += len(raw)
            while self._held > self.memory_bytes and len(self._memory) > 1:
                _, dropped = self._memory.popitem(last=False)
                self._held -= len(dropped)

    def drop_memory(self) -> None:
        """Forget the in-memory copies (a benchmark's cold read starts from node disk or storage)."""
        with self._lock:
            self._memory.clear()
            self._held = 0
