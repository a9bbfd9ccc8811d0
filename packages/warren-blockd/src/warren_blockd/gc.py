"""Chunk collection: delete the chunks nothing references any more, safely beside writers.

Mark: every chunk named by a remaining manifest generation or log record, in every
workspace, and by the bases (a source's generations) that the newest generation and any
generation a fork stands on name. An older generation's base may be gone: its workspace
has flattened since, and its newest generation names the chunks it still needs. A released
workspace counts only through the generations forks stand on; the rest of it is finished
off first.
Sweep: delete a chunk that is unmarked AND was stored more than `grace` before the gc
started; a younger one stays for a later run. Memory images (memory.py) go the same way:
an image whose workspace is released, then its pieces no remaining image names.

The race this closes: a writer's dedup check (PolicyStore.put_chunk) finds a chunk stored
and skips the upload, then publishes a record naming it a little later; in between nothing
references the chunk. Writers reuse a stored chunk only while it is younger than grace/2
and store it again (renewing its time) otherwise, so a chunk a writer is about to name was
stored less than grace/2 before its check. If the gc deletes it, it was stored more than
grace before the gc started, so that check came more than grace/2 before the gc started,
and the record, published less than grace/2 after the check, was there for the scan. A
fresh upload is the same case with the check at the upload.

That holds while (1) a writer publishes its record (an import: its first generation) within
grace/2 of its check or upload, (2) clocks (the store's, which stamps objects, the nodes'
and the gc's) agree to well within grace/2, and (3) every writer uses a grace no longer
than the gc's (the default, CHUNK_GRACE, on both sides).
"""

from __future__ import annotations

import json
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from warren_blockd.blobs.policy import CHUNK_GRACE, PolicyStore
from warren_blockd.errors import NotFoundError
from warren_blockd.workspace import Workspace

DEFAULT_GRACE = CHUNK_GRACE
ATTEMPTS = 5  # reads of one workspace that keeps changing under the scan, before giving up


class GcError(RuntimeError):
    """The scan could not see a consistent store: nothing was deleted."""


@dataclass
class Report:
    workspaces: int = 0
    releases_finished: int = 0  # released workspaces whose leftovers this run removed
    chunks_seen: int = 0
    referenced: int = 0
    deleted: int = 0  # with dry_run: would be deleted
    bytes_freed: int = 0
    kept_young: int = 0  # unreferenced, but stored within the grace
    missing: int = 0  # referenced but not stored: lost data, should stay 0
    images_deleted: int = 0  # memory images of released workspaces
    image_pieces_deleted: int = 0
    dry_run: bool = False


def gc(
    store: PolicyStore,
    grace: timedelta = DEFAULT_GRACE,
    *,
    now: datetime | None = None,
    dry_run: bool = False,
    parallel: int = 32,
) -> Report:
    """Mark, then sweep. `now` is when the gc starts (tests pass a later time instead of
    waiting); it is taken before anything is read, as the grace rule requires."""
    cutoff = (now or datetime.now(UTC)) - grace
    workspaces = _by_workspace(store.list("workspaces/"))
    report = Report(workspaces=len(workspaces), dry_run=dry_run)
    for workspace_id, keys in workspaces.items():
        released = f"workspaces/{workspace_id}/released"
        if released in keys and keys != [released] and not dry_run:
            done = Workspace(store, workspace_id).release()
            workspaces[workspace_id] = store.list(f"workspaces/{workspace_id}/")
            report.releases_finished += bool(done.records_deleted or done.generations_deleted)
    with ThreadPoolExecutor(parallel) as pool:
        marked = _mark(store, pool, workspaces)
        stored = store.list_info("chunks/")
        doomed = []
        for info in stored:
            if info.key.rsplit("/", 1)[1] in marked:
                report.referenced += 1
            elif info.modified < cutoff:
                doomed.append(info.key)
                report.bytes_freed += info.size
            else:
                report.kept_young += 1
        if not dry_run:
            list(pool.map(store.delete, doomed))
    report.chunks_seen, report.deleted = len(stored), len(doomed)
    report.missing = len(marked) - report.referenced
    _collect_images(store, workspaces, cutoff, report)
    return report


def _collect_images(
    store: PolicyStore, workspaces: dict[str, list[str]], cutoff: datetime, report: Report
) -> None:
    """Memory images (memory.py) go with their workspace: the manifest of an image whose
    workspace is released or gone is deleted, then every piece no remaining manifest names,
    once stored before the cutoff (a capture writes its pieces first, its manifest last, and
    reuses only a young piece, as writers reuse chunks)."""
    named: set[str] = set()
    for key in store.list("images/"):
        if key.count("/") != 1:
            continue  # a piece
        try:
            doc = json.loads(store.get(key))
        except NotFoundError:
            continue
        keys = workspaces.get(str(doc.get("workspace")), [])
        if not keys or f"workspaces/{doc['workspace']}/released" in keys:
            report.images_deleted += 1
            if not report.dry_run:
                store.delete(key)
        else:
            named.update(piece for item in doc["files"] for piece in item["pieces"])
    for info in store.list_info("images/chunks/"):
        if info.key.rsplit("/", 1)[1] not in named and info.modified < cutoff:
            report.image_pieces_deleted += 1
            report.bytes_freed += info.size
            if not report.dry_run:
                store.delete(info.key)


def _by_workspace(keys: list[str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        grouped[key.split("/")[1]].append(key)
    return dict(grouped)


def _to_read(workspace_id: str, keys: list[str]) -> list[tuple[str, bool]]:
    """The keys whose chunks count, each with whether its base counts too: every generation
    and record of a live workspace; of a released one only the generations forks stand on
    (release removes the rest, and no new fork can stand on it)."""
    prefix = f"workspaces/{workspace_id}/"
    generations = [key for key in keys if key.startswith(f"{prefix}manifests/")]
    forked = {key.split("/")[3] for key in keys if key.startswith(f"{prefix}refs/")}

    def needed(key: str) -> bool:  # its workspace or a fork reads through it
        return key == generations[-1] or key.rsplit("/", 1)[1].partition("-")[0] in forked

    if f"{prefix}released" in keys:
        return [(key, True) for key in generations if needed(key)]
    records = [(key, False) for key in keys if key.startswith(f"{prefix}log/")]
    return [(key, needed(key)) for key in generations] + records


def _mark(store: PolicyStore, pool: ThreadPoolExecutor, workspaces: dict[str, list[str]]) -> set[str]:
    marked: set[str] = set()
    done: set[str] = set()  # keys whose chunks, and whose bases' chunks, are marked

    def chain(key: str, follow: bool) -> tuple[list[str], set[str]]:
        """The chunks of a generation or record, and of the bases it names when `follow`;
        with them the keys now done (all of a chain, or nothing of an unfollowed one)."""
        keys: list[str] = []
        found: set[str] = set()
        at: str | None = key
        while at and at not in done:
            doc = json.loads(store.get(at))
            found.update(extent[2] for extent in doc["extents"])
            if "base" in doc and not follow:
                break
            keys.append(at)
            at = doc.get("base")
        return keys, found

    pending = workspaces
    for _ in range(ATTEMPTS):
        reads: dict[str, list[Future[tuple[list[str], set[str]]]]] = {
            workspace_id: [
                pool.submit(chain, key, follow)
                for key, follow in _to_read(workspace_id, keys)
                if key not in done
            ]
            for workspace_id, keys in pending.items()
        }
        changed = {}
        for workspace_id, futures in reads.items():
            try:
                for future in futures:
                    keys, found = future.result()
                    marked |= found
                    done.update(keys)
            except NotFoundError:
                # Gone since the listing: consolidated, flattened or released meanwhile.
                # Whatever it named is now named by what replaced it: list again, read that.
                changed[workspace_id] = store.list(f"workspaces/{workspace_id}/")
        if not changed:
            return marked
        pending = changed
    raise GcError(
        f"workspaces {', '.join(sorted(pending))} changed under every scan or name a generation "
        "that is gone; nothing was deleted"
    )
