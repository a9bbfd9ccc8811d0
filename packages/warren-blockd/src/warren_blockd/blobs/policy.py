"""The one policy layer over every blob driver: retries with backoff for transient
failures only, a deadline per operation, verify-before-serve for chunks, and the writers'
half of the chunk gc's grace rule (see gc.py)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from warren_blockd import chunks
from warren_blockd.blobs import BlobDriver, BlobInfo
from warren_blockd.errors import CorruptError, TransientError

T = TypeVar("T")
# The gc deletes an unreferenced chunk only once it was stored longer ago than this; writers
# reuse a stored chunk only while it is younger than half of it (put_chunk).
CHUNK_GRACE = timedelta(hours=6)


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 6
    base_delay: float = 0.05
    max_delay: float = 2.0
    deadline: float = 30.0


class PolicyStore:
    def __init__(
        self,
        driver: BlobDriver,
        policy: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        *,
        grace: timedelta = CHUNK_GRACE,
    ) -> None:
        self.driver = driver
        self.policy = policy
        self.sleep = sleep
        self.grace = grace  # the shortest gc grace this writer is safe beside
        self.retries = 0  # exposed as a metric

    def _run(self, op: Callable[[], T]) -> T:
        start = time.monotonic()
        for attempt in range(1, self.policy.attempts + 1):
            try:
                return op()
            except TransientError:
                late = time.monotonic() - start > self.policy.deadline
                if attempt == self.policy.attempts or late:
                    raise
                self.retries += 1
                delay = min(self.policy.max_delay, self.policy.base_delay * 2 ** (attempt - 1))
                self.sleep(delay * random.uniform(0.5, 1.0))  # noqa: S311  # jitter, not secrecy
        raise AssertionError("unreachable")

    def get(self, key: str) -> bytes:
        return self._run(lambda: self.driver.get(key))

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        # A create-only write that lost (PreconditionFailedError) is never retried: the caller
        # must stop, not write again over what another writer published.
        self._run(lambda: self.driver.put(key, data, create_only=create_only))

    def exists(self, key: str) -> bool:
        return self._run(lambda: self.driver.exists(key))

    def stat(self, key: str) -> datetime | None:
        return self._run(lambda: self.driver.stat(key))

    def list_info(self, prefix: str) -> list[BlobInfo]:
        return self._run(lambda: self.driver.list_info(prefix))

    def list(self, prefix: str, start_after: str = "") -> list[str]:
        return self._run(lambda: self.driver.list(prefix, start_after))

    def delete(self, key: str) -> None:
        self._run(lambda: self.driver.delete(key))

    def put_chunk(self, raw: bytes, *, check_first: bool = True) -> str:
        """Store a chunk (idempotent: same content, same key) and return its digest.
        check_first skips the upload of a chunk already stored; fresh writes skip the check
        (one round trip less per chunk, and rewriting identical bytes is harmless).

        A stored chunk is reused only if it was stored less than grace/2 ago; an older one
        is stored again, which renews its time. The caller will name it in a record soon,
        and until then nothing references it: the gc must see it as young (gc.py)."""
        digest, stored = chunks.encode(raw)
        key = chunks.key_for(digest)
        if check_first:
            when = self.stat(key)
            if when is not None and datetime.now(UTC) - when < self.grace / 2:
                return digest
        self.put(key, stored)
        return digest

    def put_encoded_chunk(self, digest: str, stored: bytes) -> str:
        """Store a chunk encoded earlier (chunks.encode); returns its digest."""
        self.put(chunks.key_for(digest), stored)
        return digest

    def get_chunk(self, digest: str) -> bytes:
        """A chunk's raw bytes, verified. A corrupt fetch is fetched once more (it may have
        been cut short on the way); corrupt twice, the error reaches the caller."""
        key = chunks.key_for(digest)
        try:
            return chunks.decode(digest, self.get(key))
        except CorruptError:
            self.retries += 1
            return chunks.decode(digest, self.get(key))
