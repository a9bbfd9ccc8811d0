"""A workspace in object storage: consolidated manifests, an ordered log of writes, forks.

Layout under `workspaces/<id>/`:
  manifests/<generation>   consolidated manifests (create-only; newest wins)
  log/<seq>                write records after the newest manifest (create-only)

Chunks live once, in `chunks/`, shared by every workspace: a fork publishes the source's
effective manifest under the child's id and copies no data.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.errors import BlobError, NotFoundError, PreconditionFailedError
from warren_blockd.manifest import Extent, Manifest


class SplitBrainError(RuntimeError):
    """Another writer published the same log sequence number: this lane stops for good."""


class WorkspaceExistsError(RuntimeError):
    pass


def _n(value: int) -> str:
    return f"{value:016d}"  # fixed width: listing order is numeric order


@dataclass
class Workspace:
    store: PolicyStore
    workspace_id: str

    @property
    def prefix(self) -> str:
        return f"workspaces/{self.workspace_id}/"

    def create(self, size_blocks: int, manifest: Manifest | None = None) -> Manifest:
        manifest = manifest or Manifest(size_blocks)
        try:
            self.store.put(f"{self.prefix}manifests/{_n(0)}", manifest.to_bytes(), create_only=True)
        except PreconditionFailedError:
            raise WorkspaceExistsError(f"workspace {self.workspace_id} already exists") from None
        return manifest

    def _newest_manifest(self) -> tuple[int, Manifest]:
        keys = self.store.list(f"{self.prefix}manifests/")
        if not keys:
            raise NotFoundError(self.prefix, "no such workspace")
        newest = keys[-1]
        return int(newest.rsplit("/", 1)[1]), Manifest.from_bytes(self.store.get(newest))

    def effective(self) -> Manifest:
        """Restore is a read: the newest consolidated manifest plus the log tail after it."""
        _, manifest = self._newest_manifest()
        seq = manifest.log_seq
        log = f"{self.prefix}log/"
        # Only the tail is listed: restore costs the same however long the history is.
        for key in self.store.list(log, start_after=f"{log}{_n(manifest.log_seq)}"):
            record_seq = int(key.rsplit("/", 1)[1])
            if record_seq != seq + 1:
                raise RuntimeError(f"{self.workspace_id}: log gap between {seq} and {record_seq}")
            writes = [Extent(*e) for e in json.loads(self.store.get(key))["extents"]]
            manifest = manifest.overlay(writes, log_seq=record_seq)
            seq = record_seq
        return manifest

    def consolidate(self, keep: int = 3) -> Manifest:
        """Publish the effective manifest as a new generation (the log tail then starts after
        it) and drop generations older than the newest `keep`; log records stay as history."""
        generation, newest = self._newest_manifest()
        manifest = self.effective()
        if manifest.log_seq == newest.log_seq:
            return manifest  # nothing new since the last consolidation
        self.store.put(f"{self.prefix}manifests/{_n(generation + 1)}", manifest.to_bytes(), create_only=True)
        for old in self.store.list(f"{self.prefix}manifests/")[:-keep]:
            self.store.delete(old)
        return manifest

    def fork(self, child_ids: list[str]) -> dict[str, str | None]:
        """Publish this workspace's effective manifest under each child id: one small write
        per child, no chunk copied. Each child succeeds or fails on its own."""
        manifest = self.effective()  # read once: children never wait on each other or the source
        base = Manifest(manifest.size_blocks, manifest.extents)

        def one(child: str) -> str | None:
            try:
                Workspace(self.store, child).create(base.size_blocks, base)
                return None
            except (WorkspaceExistsError, BlobError) as exc:
                return str(exc)

        with ThreadPoolExecutor(min(32, max(1, len(child_ids)))) as pool:
            return dict(zip(child_ids, pool.map(one, child_ids), strict=True))


class LogLane:
    """Publishes one workspace's write records in strict order. Each record's chunks are
    confirmed in storage before the record is published, and the record is written
    create-only: if another writer already holds that sequence number the lane stops."""

    def __init__(self, workspace: Workspace, next_seq: int, parallel: int = 16) -> None:
        self.workspace = workspace
        self.next_seq = next_seq
        self.stopped: str | None = None
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix=f"put-{workspace.workspace_id}")

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def publish(self, payloads: list[tuple[int, bytes]]) -> int:
        """Store each (first block, data) as a chunk, then publish the record; returns its seq."""
        if self.stopped:
            raise SplitBrainError(self.stopped)
        store = self.workspace.store
        for first_block, data in payloads:
            if not data or len(data) % 4096:
                raise ValueError(
                    f"a write is whole 4 KiB blocks; got {len(data)} bytes at block {first_block}"
                )
        # Chunks go up in parallel; every one is confirmed before the record can name it.
        digests = list(self._pool.map(lambda p: store.put_chunk(p[1], check_first=False), payloads))
        extents = [
            [first, len(data) // 4096, digest, 0]
            for (first, data), digest in zip(payloads, digests, strict=True)
        ]
        seq = self.next_seq
        record = json.dumps({"seq": seq, "extents": extents}).encode()
        try:
            store.put(f"{self.workspace.prefix}log/{_n(seq)}", record, create_only=True)
        except PreconditionFailedError:
            self.stopped = f"{self.workspace.workspace_id}: log record {seq} was published by another writer"
            raise SplitBrainError(self.stopped) from None
        self.next_seq += 1
        return seq
