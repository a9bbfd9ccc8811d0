"""The policy layer. Faults come from a wrapper driver: a real store cannot be made to fail
exactly N times on demand, which is what retry behaviour must be tested against."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from warren_blockd import chunks
from warren_blockd.blobs import BlobInfo
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore, RetryPolicy
from warren_blockd.errors import CorruptError, PreconditionFailedError, TransientError


class Flaky:
    """Delegates to a real driver after failing the first `failures` calls."""

    def __init__(self, inner: LocalDriver, failures: int) -> None:
        self.inner = inner
        self.failures = failures
        self.calls = 0

    def _maybe_fail(self, key: str) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise TransientError(key, "injected")

    def get(self, key: str) -> bytes:
        self._maybe_fail(key)
        return self.inner.get(key)

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        self._maybe_fail(key)
        self.inner.put(key, data, create_only=create_only)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def stat(self, key: str) -> datetime | None:
        return self.inner.stat(key)

    def list_info(self, prefix: str) -> list[BlobInfo]:
        return self.inner.list_info(prefix)

    def list(self, prefix: str, start_after: str = "") -> list[str]:
        return self.inner.list(prefix, start_after)

    def delete(self, key: str) -> None:
        self.inner.delete(key)


def store(tmp_path: Path, failures: int, attempts: int = 4) -> tuple[PolicyStore, Flaky]:
    flaky = Flaky(LocalDriver(tmp_path), failures)
    return PolicyStore(flaky, RetryPolicy(attempts=attempts), sleep=lambda _s: None), flaky


def test_transient_failures_are_retried(tmp_path: Path) -> None:
    policy, flaky = store(tmp_path, failures=3)
    policy.put("k", b"v")
    assert flaky.calls == 4 and policy.retries == 3
    assert policy.get("k") == b"v"


def test_retries_are_bounded(tmp_path: Path) -> None:
    policy, flaky = store(tmp_path, failures=10, attempts=4)
    with pytest.raises(TransientError):
        policy.put("k", b"v")
    assert flaky.calls == 4


def test_lost_conditional_write_is_never_retried(tmp_path: Path) -> None:
    policy, flaky = store(tmp_path, failures=0)
    policy.put("log/1", b"a", create_only=True)
    with pytest.raises(PreconditionFailedError):
        policy.put("log/1", b"b", create_only=True)
    assert flaky.calls == 2 and policy.retries == 0
    assert policy.get("log/1") == b"a"


def test_chunks_are_verified_before_they_are_served(tmp_path: Path) -> None:
    policy, _ = store(tmp_path, failures=0)
    digest = policy.put_chunk(b"hello workspace" * 100)
    assert policy.get_chunk(digest) == b"hello workspace" * 100
    # CorruptError the stored chunk behind the store's back.
    path = tmp_path / chunks.key_for(digest)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptError):
        policy.get_chunk(digest)


def test_put_chunk_is_idempotent(tmp_path: Path) -> None:
    policy, _ = store(tmp_path, failures=0)
    first = policy.put_chunk(b"same")
    assert policy.put_chunk(b"same") == first
    assert policy.list("chunks/") == [chunks.key_for(first)]
