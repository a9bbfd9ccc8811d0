"""Blobs as files under one directory (node disk, tests, air-gapped single nodes)."""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from warren_blockd.blobs import BlobInfo
from warren_blockd.errors import BlobError, NotFoundError, PreconditionFailedError


class LocalDriver:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise BlobError(key, "keys are relative paths without '..'")
        return self.root / key

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise NotFoundError(key, "no such blob") from None

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write aside, fsync, then publish in one step: readers never see half a blob.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            if create_only:
                try:
                    os.link(tmp, path)  # fails if the key exists: the file system's O_EXCL
                except FileExistsError:
                    raise PreconditionFailedError(key, "already exists") from None
            else:
                Path(tmp).replace(path)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def stat(self, key: str) -> datetime | None:
        try:
            return datetime.fromtimestamp(self._path(key).stat().st_mtime, UTC)
        except FileNotFoundError:
            return None

    def list_info(self, prefix: str) -> list[BlobInfo]:
        found = []
        for key in self.list(prefix):
            try:
                st = self._path(key).stat()
            except FileNotFoundError:  # deleted since the walk
                continue
            found.append(BlobInfo(key, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC)))
        return found

    def list(self, prefix: str, start_after: str = "") -> list[str]:
        base = self.root
        top = base / prefix.rpartition("/")[0]  # walk only the directory the prefix names
        if not top.is_dir():
            return []
        files = (p for p in top.rglob("*") if p.is_file() and not p.name.startswith(".tmp-"))
        keys = (str(p.relative_to(base)) for p in files)
        return sorted(k for k in keys if k.startswith(prefix) and k > start_after)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
