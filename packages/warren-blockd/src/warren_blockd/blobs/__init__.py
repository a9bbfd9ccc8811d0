"""Blob drivers (S3, local files) behind one interface, and the policy layer over them."""

from __future__ import annotations

from typing import Protocol


class BlobDriver(Protocol):
    """What every store offers. Drivers translate their failures into warren_blockd.errors."""

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        """Store `data` at `key`. With create_only the write succeeds only if the key does
        not exist yet (S3 If-None-Match: *, O_EXCL for files); else PreconditionFailedError."""
        ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str, start_after: str = "") -> list[str]:
        """Keys under `prefix` sorted, only those after `start_after` when given."""
        ...

    def delete(self, key: str) -> None: ...
