"""Blob drivers (S3, local files) behind one interface, and the policy layer over them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class BlobInfo:
    key: str
    size: int
    modified: datetime  # when the object was last stored (timezone-aware)


class BlobDriver(Protocol):
    """What every store offers. Drivers translate their failures into warren_blockd.errors."""

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        """Store `data` at `key`. With create_only the write succeeds only if the key does
        not exist yet (S3 If-None-Match: *, O_EXCL for files); else PreconditionFailedError."""
        ...

    def exists(self, key: str) -> bool: ...

    def stat(self, key: str) -> datetime | None:
        """When `key` was last stored (S3 LastModified, a file's mtime), None if it does not
        exist. Storing the same key again moves it forward: the chunk gc relies on that."""
        ...

    def list_info(self, prefix: str) -> list[BlobInfo]:
        """Every object under `prefix` with its size and stored time, sorted by key."""
        ...

    def list(self, prefix: str, start_after: str = "") -> list[str]:
        """Keys under `prefix` sorted, only those after `start_after` when given."""
        ...

    def delete(self, key: str) -> None: ...
