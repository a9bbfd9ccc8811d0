"""A workspace in object storage: consolidated manifests, an ordered log of writes, forks.

Layout under `workspaces/<id>/`:
  manifests/<generation>-<log seq>   consolidated manifests (create-only; newest wins); a
                                     fork's first generation names its source's as its base
  log/<seq>                          write records after the newest manifest (create-only)
  refs/<generation>/<child>          forks standing on that generation (kept while named)
  released                           the sandbox is gone: the id is refused from then on

Chunks live once, in `chunks/`, shared by every workspace: a fork publishes the source's
effective manifest under the child's id and copies no data; chunks nothing names any more
are collected by gc.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.errors import BlobError, NotFoundError, PreconditionFailedError
from warren_blockd.manifest import Extent, Manifest

log = logging.getLogger(__name__)


class SplitBrainError(RuntimeError):
    """Another writer published the same log sequence number: this lane stops for good."""


class WorkspaceExistsError(RuntimeError):
    pass


class WorkspaceReleasedError(RuntimeError):
    """The workspace was released: restore, fork and create refuse its id for good."""


@dataclass
class Released:
    """What one `release` call did."""

    workspace: str
    found: bool  # False: nothing was stored under this id
    records_deleted: int = 0
    generations_deleted: int = 0
    kept_for_forks: list[int] = field(default_factory=list)  # generations forks still stand on


def _n(value: int) -> str:
    return f"{value:016d}"  # fixed width: listing order is numeric order


@dataclass
class Workspace:
    store: PolicyStore
    workspace_id: str

    @property
    def prefix(self) -> str:
        return f"workspaces/{self.workspace_id}/"

    @property
    def _released_key(self) -> str:
        return f"{self.prefix}released"

    def refuse_if_released(self) -> None:
        # One HEAD on paths that already list and read manifests: cheap beside them.
        if self.store.exists(self._released_key):
            raise WorkspaceReleasedError(
                f"workspace {self.workspace_id} was released; its id cannot be used again"
            )

    def _manifest_key(self, generation: int, log_seq: int) -> str:
        # The log position is in the name: fork and restore learn it from a listing alone.
        return f"{self.prefix}manifests/{_n(generation)}-{_n(log_seq)}"

    def create(self, size_blocks: int, manifest: Manifest | None = None) -> Manifest:
        manifest = manifest or Manifest(size_blocks)
        self._publish_generation(0, manifest.log_seq, manifest.to_bytes())
        return manifest

    def _publish_generation(self, generation: int, log_seq: int, body: bytes) -> None:
        if generation == 0:  # a new workspace: a released id's leftovers must not come back
            self.refuse_if_released()
        try:
            self.store.put(self._manifest_key(generation, log_seq), body, create_only=True)
        except PreconditionFailedError:
            if generation == 0:
                raise WorkspaceExistsError(f"workspace {self.workspace_id} already exists") from None
            raise

    def _generations(self) -> list[tuple[int, int, str]]:
        """(generation, log_seq, key) of every stored generation, oldest first."""
        self.refuse_if_released()
        found = []
        for key in self.store.list(f"{self.prefix}manifests/"):
            generation, _, log_seq = key.rsplit("/", 1)[1].partition("-")
            found.append((int(generation), int(log_seq), key))
        if not found:
            raise NotFoundError(self.prefix, "no such workspace")
        return found

    def load(self, key: str) -> Manifest:
        """A stored generation, resolved: a fork's generation names its source's generation as
        its base and carries only its own extents on top."""
        doc = json.loads(self.store.get(key))
        if "base" not in doc:
            return Manifest.from_doc(doc)
        base = self.load(doc["base"])
        own = [Extent(*e) for e in doc["extents"]]
        return base.overlay(own, log_seq=doc["log_seq"]) if own else base.with_log_seq(doc["log_seq"])

    def _tail(self, log_seq: int) -> list[str]:
        log = f"{self.prefix}log/"
        # Only the tail is listed: restore costs the same however long the history is.
        return self.store.list(log, start_after=f"{log}{_n(log_seq)}")

    def _newest_whole(self) -> tuple[int, Manifest]:
        """(its log position, the manifest) of the newest generation that reads whole. A
        consolidation whose writer was killed mid-upload can leave a torn object where the
        newest generation would be; the one before it, with the log records after it (they
        are kept), is the same state."""
        generations = self._generations()
        for _, log_seq, key in reversed(generations):
            try:
                return log_seq, self.load(key)
            except (ValueError, KeyError, TypeError) as exc:  # not JSON, or not a manifest
                log.warning("torn generation skipped", extra={"fields": {"key": key, "error": str(exc)}})
        raise RuntimeError(f"{self.workspace_id}: no generation of it reads whole")

    def effective(self) -> Manifest:
        """Restore is a read: the newest consolidated manifest plus the log tail after it."""
        log_seq, manifest = self._newest_whole()
        seq, torn = log_seq, None
        for record in self._tail(log_seq):
            record_seq = int(record.rsplit("/", 1)[1])
            if record_seq != seq + 1:
                raise RuntimeError(f"{self.workspace_id}: log gap between {seq} and {record_seq}")
            try:
                doc = json.loads(self.store.get(record))
                writes = [Extent(*e) for e in doc["extents"]]
            except (ValueError, KeyError, TypeError):
                # Torn mid-upload: its writer was killed publishing it, so nothing it names
                # was ever receipted. Only a takeover's fence may follow it.
                torn, writes, doc = record, [], {}
            if torn is not None and torn != record:
                if "fence" not in doc:
                    raise RuntimeError(
                        f"{self.workspace_id}: log record {torn} is torn and its writer went on"
                    )
                torn = None  # fenced off: the new writer's records follow
            manifest = manifest.overlay(writes, log_seq=record_seq)
            seq = record_seq
        return manifest

    def replicated_seq(self) -> int:
        """The newest write record proven in storage (0: none since the workspace was created
        or forked). A `replicated` receipt names such a number, and restore brings back
        every write at or below it."""
        _, log_seq, _ = self._generations()[-1]
        tail = self._tail(log_seq)
        return int(tail[-1].rsplit("/", 1)[1]) if tail else log_seq

    def consolidate(self, keep: int = 3) -> Manifest:
        """Publish the effective manifest, flattened, as a new generation (the log tail then
        starts after it). Older generations beyond the newest `keep` are dropped unless a
        fork still stands on them; log records stay as history. A superseded generation
        that names a base lets go of it unless a fork of ours still reads through it."""
        generations = self._generations()
        generation, log_seq, newest_key = generations[-1]
        if not self._tail(log_seq):
            with contextlib.suppress(ValueError, KeyError, TypeError):  # torn: publish it whole again
                return self.load(newest_key)  # nothing new since the last consolidation
        manifest = self.effective()
        try:
            self._publish_generation(generation + 1, manifest.log_seq, manifest.to_bytes())
        except PreconditionFailedError:
            # Another consolidation of this very state got there first (the daemon's
            # background work beside a fork, or both daemons of a handoff): the same
            # manifest, and the one that published it lets go of what it supersedes.
            return manifest
        if not self._forked(generation):
            self._release_base(newest_key)
        for old_generation, _, old_key in generations[: -keep or None]:
            if not self._forked(old_generation):
                self._release_base(old_key)  # a fork that held it back has flattened since
                self.store.delete(old_key)
        return manifest

    def _forked(self, generation: int) -> bool:
        return bool(self.store.list(f"{self.prefix}refs/{_n(generation)}/"))

    def _release_base(self, key: str) -> None:
        """Once flattened, a fork no longer stands on its source's generation."""
        try:
            doc = json.loads(self.store.get(key))
        except ValueError:
            return  # torn (its writer killed mid-upload): a consolidation's, which names no base
        if "base" in doc:
            source, generation = doc["base"].split("/")[1], doc["base"].rsplit("/", 1)[1].partition("-")[0]
            self.store.delete(f"workspaces/{source}/refs/{generation}/{self.workspace_id}")

    def fork(self, child_ids: list[str]) -> dict[str, str | None]:
        """Each child gets a generation that names this workspace's newest generation as its
        base: one small write per child whatever the workspace's size, no chunk copied, and
        no child waits on another. Unconsolidated writes are consolidated first, so the base
        is exactly the effective manifest. Each child succeeds or fails on its own."""
        generation, log_seq, key = self._generations()[-1]
        if self._tail(log_seq):
            self.consolidate()
            generation, log_seq, key = self._generations()[-1]
        body = json.dumps({"version": 1, "base": key, "log_seq": 0, "extents": []}).encode()

        def one(child: str) -> str | None:
            ref = f"{self.prefix}refs/{_n(generation)}/{child}"
            try:
                # The reference first: a generation is never dropped under a fork.
                self.store.put(ref, b"")
                # Then the marker, again: release writes its marker before it looks for
                # references, so either it sees this one or this sees its marker.
                if self.store.exists(self._released_key):
                    self.store.delete(ref)
                    raise WorkspaceReleasedError(f"workspace {self.workspace_id} was released")
                Workspace(self.store, child)._publish_generation(0, 0, body)
                return None
            except (WorkspaceExistsError, WorkspaceReleasedError) as exc:
                # The id is taken. Unless by this very fork (a retry), the reference would
                # hold the generation back for good.
                if not self._stands_on(child, key):
                    self.store.delete(ref)
                return str(exc)
            except BlobError as exc:  # the child may be published all the same: keep the reference
                return str(exc)

        with ThreadPoolExecutor(min(32, max(1, len(child_ids)))) as pool:
            return dict(zip(child_ids, pool.map(one, child_ids), strict=True))

    def fork_base(self) -> tuple[str, int] | None:
        """(source workspace, its write record) this workspace was forked from, while it has
        nothing of its own: one generation, naming a base, and no log record after it."""
        generations = self._generations()
        if len(generations) != 1 or self._tail(generations[0][1]):
            return None
        base = json.loads(self.store.get(generations[0][2])).get("base")
        if not base:
            return None
        return str(base).split("/")[1], int(str(base).rsplit("-", 1)[1])

    def _stands_on(self, child: str, key: str) -> bool:
        """Whether `child` is a fork whose first generation names `key` as its base."""
        try:
            doc = json.loads(self.store.get(Workspace(self.store, child)._manifest_key(0, 0)))
        except NotFoundError:
            return False
        return bool(doc.get("base") == key)

    def release(self) -> Released:
        """Remove this workspace from storage (its sandbox is gone); idempotent.

        The marker goes first: from then on restore, fork and create refuse the id, and a
        release cut short is finished by the next call (or the gc). Log records go, and
        every generation no fork stands on; one a fork stands on stays until that fork
        flattens, and a later call or the gc removes it. Chunks are left to the gc: other
        workspaces may share them."""
        keys = self.store.list(self.prefix)
        if not keys:
            return Released(self.workspace_id, found=False)
        if self._released_key not in keys:
            self.store.put(self._released_key, b"")
            keys = self.store.list(self.prefix)  # references are read after the marker: see fork
        result = Released(self.workspace_id, found=True)
        records = [key for key in keys if key.startswith(f"{self.prefix}log/")]
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(self.store.delete, records))
        result.records_deleted = len(records)
        forked = {key.split("/")[3] for key in keys if key.startswith(f"{self.prefix}refs/")}
        for key in keys:
            if not key.startswith(f"{self.prefix}manifests/"):
                continue
            generation = key.rsplit("/", 1)[1].partition("-")[0]
            if generation in forked:  # its fork reads through it, and through its own base
                result.kept_for_forks.append(int(generation))
                continue
            try:
                # Our reference on the source before the generation: cut short here, the
                # next call still finds the generation and so the reference to drop.
                self._release_base(key)
            except NotFoundError:
                continue  # a concurrent release got there first
            self.store.delete(key)
            result.generations_deleted += 1
        return result


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

    def upload(self, payloads: list[tuple[int, bytes]]) -> list[Future[str]]:
        """Start storing each (first block, data) as a chunk, in parallel; a chunk may go up
        before earlier records are published (nothing names it until its record does)."""
        for first_block, data in payloads:
            if not data or len(data) % 4096:
                raise ValueError(
                    f"a write is whole 4 KiB blocks; got {len(data)} bytes at block {first_block}"
                )
        store = self.workspace.store
        return [self._pool.submit(store.put_chunk, data, check_first=False) for _, data in payloads]

    def upload_encoded(self, chunks_: list[tuple[str, bytes]]) -> list[Future[str]]:
        """Like upload, for chunks already encoded (digest, stored bytes) when they were sealed."""
        store = self.workspace.store
        return [self._pool.submit(store.put_encoded_chunk, digest, stored) for digest, stored in chunks_]

    def record(self, payloads: list[tuple[int, bytes]], digests: list[str]) -> int:
        """Publish the next record naming chunks already confirmed in storage; returns its seq."""
        return self.record_extents(
            [
                [first, len(data) // 4096, digest, 0]
                for (first, data), digest in zip(payloads, digests, strict=True)
            ]
        )

    def record_extents(self, extents: list[list[Any]]) -> int:
        """Publish the next record: [first block, blocks, chunk digest, offset] per extent."""
        if self.stopped:
            raise SplitBrainError(self.stopped)
        seq = self.next_seq
        body = json.dumps({"seq": seq, "extents": extents}).encode()
        try:
            self.workspace.store.put(f"{self.workspace.prefix}log/{_n(seq)}", body, create_only=True)
        except PreconditionFailedError:
            self.stopped = f"{self.workspace.workspace_id}: log record {seq} was published by another writer"
            raise SplitBrainError(self.stopped) from None
        self.next_seq += 1
        return seq

    def publish(self, payloads: list[tuple[int, bytes]]) -> int:
        """Store the chunks, then (all confirmed) publish their record; returns its seq."""
        if self.stopped:
            raise SplitBrainError(self.stopped)
        return self.record(payloads, [future.result() for future in self.upload(payloads)])
