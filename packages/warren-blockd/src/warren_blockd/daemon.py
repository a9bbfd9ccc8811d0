"""The node daemon: workspaces attached as devices, mounted, flushed, forked, consolidated.

State on node disk (`state_dir`):
  fuse/                   the FUSE mount: one file per attached workspace
  cache/                  verified chunks fetched from storage
  workspaces/<id>/        dirty.img (copy-on-write layer), spool/ (batches not yet
                          replicated), mount.json (what to clean up after a crash)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warren_blockd import metrics
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.cache import ChunkCache
from warren_blockd.chunker import chunk_image
from warren_blockd.csi import mounts
from warren_blockd.device import Device
from warren_blockd.fusefs import DeviceFS
from warren_blockd.ids import WORKSPACE_ID_RULE, valid_workspace_id
from warren_blockd.manifest import BLOCK_SIZE, Manifest
from warren_blockd.replicator import Receipt, Replicator
from warren_blockd.workspace import Workspace, WorkspaceExistsError

log = logging.getLogger("warren_blockd.daemon")
MOUNT_OPTIONS = "nosuid,nodev,noinit_itable"  # holes read as zeros: no need to zero inode tables


class BlockdError(Exception):
    """A request the daemon refuses; `code` is stable for API clients."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_id(workspace_id: str) -> str:
    if not valid_workspace_id(workspace_id):
        raise BlockdError("invalid_id", f"workspace id {workspace_id!r} is invalid: use {WORKSPACE_ID_RULE}")
    return workspace_id


def run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise BlockdError(
            "host_command_failed", f"{' '.join(cmd)} failed: {done.stderr.strip() or done.returncode}"
        )
    return done.stdout.strip()


@dataclass
class Attached:
    workspace: Workspace
    device: Device
    replicator: Replicator
    generation_seq: int  # log_seq of the manifest it was attached from
    loop: str | None = None
    target: str | None = None
    consolidated_seq: int = 0
    consolidated_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Settings:
    backlog_bound: int = 256 << 20
    batch_bytes: int = 32 << 20
    flush_interval: float = 1.0
    consolidate_records: int = 64
    consolidate_interval: float = 60.0
    cache_memory: int = 256 << 20
    fork_wait: float = 60.0  # how long a fork waits for the source's writes to be replicated


def mounts_of(device: str) -> list[str]:
    """Every mount point of the filesystem on `device` (bind mounts included), deepest first."""
    try:
        rdev = Path(device).stat().st_rdev
    except OSError:
        return []
    wanted = f"{os.major(rdev)}:{os.minor(rdev)}"
    found = [e.mount_point for e in mounts.parse(mounts.MOUNTINFO.read_text()) if e.device == wanted]
    return sorted(found, key=len, reverse=True)


class Daemon:
    def __init__(self, store: PolicyStore, state_dir: Path, settings: Settings = Settings()) -> None:
        self.store = store
        self.state = state_dir
        self.settings = settings
        self.fuse_dir = state_dir / "fuse"
        self.ready = threading.Event()
        self.fs = DeviceFS(on_ready=self.ready.set)
        self.cache = ChunkCache(state_dir / "cache", store, settings.cache_memory)
        self.attached: dict[str, Attached] = {}
        # Detached before their spool drained: still uploading; a new attach waits for them.
        self._draining: dict[str, Replicator] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()

    def _dir(self, workspace_id: str) -> Path:
        return self.state / "workspaces" / workspace_id

    # -- lifecycle ------------------------------------------------------------------------

    def clean_stale(self) -> None:
        """After a crash: lazily unmount what the previous process left mounted on its dead
        FUSE files and free their loop devices. Spools stay: they are replayed on attach."""
        for record in (self.state / "workspaces").glob("*/mount.json"):
            info = json.loads(record.read_text())
            if info.get("target"):
                subprocess.run(["umount", "-l", info["target"]], capture_output=True, check=False)
            if info.get("loop"):
                subprocess.run(["losetup", "-d", info["loop"]], capture_output=True, check=False)
            record.unlink()
            log.info("cleaned stale mount", extra={"fields": info})
        # A FUSE mount whose process died answers every stat with ENOTCONN: detach it first.
        subprocess.run(["fusermount3", "-u", "-z", str(self.fuse_dir)], capture_output=True, check=False)
        self.fuse_dir.mkdir(parents=True, exist_ok=True)

    def background(self) -> None:
        """Seal batches every flush_interval and consolidate manifests now and then."""
        while not self._stop.wait(self.settings.flush_interval):
            self.tick()

    def tick(self) -> None:
        with self._lock:
            items = list(self.attached.items())
        for workspace_id, att in items:
            try:
                if att.replicator.pending_blocks:
                    att.device.flush()
                metrics.BACKLOG_BYTES.labels(workspace_id).set(att.replicator.backlog_bytes)
                metrics.REPLICATED_SEQ.labels(workspace_id).set(att.replicator.replicated_seq)
                self._maybe_consolidate(workspace_id, att)
            except Exception as exc:  # one workspace's trouble must not stop the others' flushes
                log.error(
                    "background work failed", extra={"fields": {"workspace": workspace_id, "error": str(exc)}}
                )

    def _maybe_consolidate(self, workspace_id: str, att: Attached) -> None:
        new = att.replicator.replicated_seq - max(att.consolidated_seq, att.generation_seq)
        due = time.monotonic() - att.consolidated_at >= self.settings.consolidate_interval
        if new >= self.settings.consolidate_records or (new > 0 and due):
            manifest = att.workspace.consolidate()
            att.consolidated_seq, att.consolidated_at = manifest.log_seq, time.monotonic()
            metrics.CONSOLIDATIONS.inc()
            log.info(
                "consolidated", extra={"fields": {"workspace": workspace_id, "log_seq": manifest.log_seq}}
            )

    def shutdown(self) -> None:
        """Unmount everything (each flushed and drained), then stop background work.

        A workspace may also be bound elsewhere (a pod's volume, by the CSI plugin); its
        device is going away with this process, so those mounts go too (lazily: a process
        inside keeps what it holds open), or the FUSE file behind the device stays busy."""
        for workspace_id in list(self.attached):
            loop = self.attached[workspace_id].loop
            for where in mounts_of(loop) if loop else []:
                if where != self.attached[workspace_id].target:
                    subprocess.run(["umount", "-l", where], capture_output=True, check=False)
                    log.info(
                        "unbound at shutdown", extra={"fields": {"workspace": workspace_id, "where": where}}
                    )
            try:
                self.unmount(workspace_id, wait_replicated=30)
            except Exception as exc:
                log.error(
                    "unmount at shutdown failed",
                    extra={"fields": {"workspace": workspace_id, "error": str(exc)}},
                )
        self._stop.set()

    # -- workspaces ----------------------------------------------------------------------

    def create(
        self,
        workspace_id: str,
        size_bytes: int | None = None,
        *,
        template: str | None = None,
        image: Path | None = None,
    ) -> dict[str, Any]:
        """A new workspace: a fork of `template`, the chunks of an ext4 `image`, or an empty
        ext4 filesystem of `size_bytes`."""
        check_id(workspace_id)
        ws = Workspace(self.store, workspace_id)
        if template:
            error = Workspace(self.store, check_id(template)).fork([workspace_id])[workspace_id]
            if error:
                raise BlockdError("exists", error)
            return {"workspace": workspace_id, "from": f"template {template}"}
        if image:
            manifest = self._import(image)
            try:
                ws.create(manifest.size_blocks, manifest)
            except WorkspaceExistsError as exc:
                raise BlockdError("exists", str(exc)) from None
            return {
                "workspace": workspace_id,
                "from": f"image {image.name}",
                "extents": len(manifest.extents),
            }
        if not size_bytes or size_bytes % BLOCK_SIZE or size_bytes < 16 << 20:
            raise BlockdError("invalid_size", "size_bytes must be a multiple of 4096 and at least 16 MiB")
        try:
            ws.create(size_bytes // BLOCK_SIZE)
        except WorkspaceExistsError as exc:
            raise BlockdError("exists", str(exc)) from None
        att = self.attach(workspace_id)
        try:
            att.loop = run("losetup", "--find", "--show", str(self.fuse_dir / workspace_id))
            run(
                "mkfs.ext4",
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                att.loop,
            )
        finally:
            receipt = self._detach(workspace_id, wait_replicated=self.settings.fork_wait)
        return {"workspace": workspace_id, "from": "empty ext4", "receipt": receipt.__dict__}

    def _import(self, image: Path) -> Manifest:
        """Chunk an ext4 image along its files and upload the chunks, many at a time."""
        if not image.is_file():
            raise BlockdError("bad_request", f"image {image} does not exist or is not a file")
        slots = threading.BoundedSemaphore(64)  # bounds the chunk bytes held in memory
        futures: list[Future[str]] = []

        def upload(raw: bytes) -> str:
            try:
                return self.store.put_chunk(raw)
            finally:
                slots.release()

        with ThreadPoolExecutor(16) as pool:

            def sink(_digest: str, raw: bytes) -> None:
                slots.acquire()
                futures.append(pool.submit(upload, raw))

            manifest = chunk_image(image, sink=sink)
            for future in futures:
                future.result()  # every chunk confirmed before the manifest can name it
        return manifest

    def attach(self, workspace_id: str) -> Attached:
        with self._lock:
            if workspace_id in self.attached:
                return self.attached[workspace_id]
            ws = Workspace(self.store, check_id(workspace_id))
            previous = self._draining.pop(workspace_id, None)
            if previous is not None:  # one uploader per spool: let the old one finish first
                previous.close(timeout=self.settings.fork_wait, drain=True)
                if previous.uploading():
                    self._draining[workspace_id] = previous
                    raise BlockdError(
                        "busy", f"{workspace_id}: earlier writes are still replicating; try again later"
                    )
            manifest = ws.effective()  # newest consolidated manifest + log tail: no bytes read
            wdir = self._dir(workspace_id)
            wdir.mkdir(parents=True, exist_ok=True)
            replicator = Replicator(
                ws, wdir / "spool", self.settings.backlog_bound, manifest.log_seq + 1, start=False
            )
            device = Device(manifest, self.cache, replicator, wdir / "dirty.img", self.settings.batch_bytes)
            replicator.start()
            att = Attached(ws, device, replicator, manifest.log_seq, consolidated_seq=manifest.log_seq)
            self.attached[workspace_id] = att
            self.fs.attach(workspace_id, device)
            log.info(
                "attached",
                extra={
                    "fields": {
                        "workspace": workspace_id,
                        "log_seq": manifest.log_seq,
                        "extents": len(manifest.extents),
                    }
                },
            )
            return att

    def _record_mount(self, workspace_id: str, att: Attached) -> None:
        (self._dir(workspace_id) / "mount.json").write_text(
            json.dumps({"target": att.target, "loop": att.loop})
        )

    def mount(self, workspace_id: str, target: str) -> dict[str, Any]:
        """Attach, put a loop device on the FUSE file, mount its ext4 at `target` nosuid,nodev."""
        att = self.attach(workspace_id)
        if att.target:
            if att.target == target:
                return {"workspace": workspace_id, "device": att.loop, "target": target}
            raise BlockdError("busy", f"workspace {workspace_id} is already mounted at {att.target}")
        Path(target).mkdir(parents=True, exist_ok=True)
        if not att.loop:
            att.loop = run("losetup", "--find", "--show", "--direct-io=on", str(self.fuse_dir / workspace_id))
        self._record_mount(workspace_id, att)
        run("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, att.loop, target)
        att.target = target
        self._record_mount(workspace_id, att)
        metrics.MOUNTED.set(sum(1 for a in self.attached.values() if a.target))
        log.info(
            "mounted", extra={"fields": {"workspace": workspace_id, "device": att.loop, "target": target}}
        )
        return {"workspace": workspace_id, "device": att.loop, "target": target}

    def restore(self, workspace_id: str, target: str) -> dict[str, Any]:
        """Serve a workspace on this node from storage (after node loss): the newest manifest
        plus the log tail, chunks faulted in as they are read. Mount is the same path."""
        started = time.monotonic()
        result = self.mount(workspace_id, target)
        att = self.attached[workspace_id]
        result.update(log_seq=att.generation_seq, restore_ms=round((time.monotonic() - started) * 1000, 1))
        return result

    def unmount(self, workspace_id: str, wait_replicated: float | None = None) -> Receipt:
        att = self.attached.get(workspace_id)
        if att is None:
            raise BlockdError("not_attached", f"workspace {workspace_id} is not attached on this node")
        if att.target:
            run("umount", att.target)
            att.target = None
            metrics.MOUNTED.set(sum(1 for a in self.attached.values() if a.target))
        return self._detach(workspace_id, wait_replicated)

    def _detach(self, workspace_id: str, wait_replicated: float | None) -> Receipt:
        att = self.attached[workspace_id]
        if att.loop:
            run("losetup", "-d", att.loop)
            att.loop = None
        receipt = att.device.flush()
        if wait_replicated:
            receipt = att.replicator.wait_replicated(receipt.seq, wait_replicated)
        drained = receipt.level == "replicated"
        with self._lock:
            self.fs.detach(workspace_id)
            del self.attached[workspace_id]
        att.replicator.close(timeout=wait_replicated or 0, drain=True)
        if att.replicator.uploading():
            self._draining[workspace_id] = att.replicator
        att.device.close()
        (self._dir(workspace_id) / "mount.json").unlink(missing_ok=True)
        if drained:
            try:  # the next restore, here or on any node, reads one manifest and no tail
                att.workspace.consolidate()
            except Exception as exc:
                log.warning(
                    "consolidation at detach failed",
                    extra={"fields": {"workspace": workspace_id, "error": str(exc)}},
                )
        if drained and not any((self._dir(workspace_id) / "spool").glob("*.batch")):
            shutil.rmtree(self._dir(workspace_id), ignore_errors=True)  # all of it is in storage
        log.info(
            "detached",
            extra={"fields": {"workspace": workspace_id, "receipt": receipt.level, "seq": receipt.seq}},
        )
        return receipt

    def flush(self, workspace_id: str, wait_replicated: float | None = None) -> Receipt:
        att = self.attached.get(workspace_id)
        if att is None:
            raise BlockdError("not_attached", f"workspace {workspace_id} is not attached on this node")
        if att.replicator.error:  # a stopped lane says why, whatever the filesystem says
            raise att.replicator.error
        if att.target:
            run("sync", "-f", att.target)  # the filesystem's dirty pages reach the device first
        receipt = att.device.flush()
        if wait_replicated:
            receipt = att.replicator.wait_replicated(receipt.seq, wait_replicated)
        return receipt

    def fork(self, source: str, children: list[str]) -> dict[str, str | None]:
        """Children get the source's manifest as it stands now. A source mounted here is frozen
        for the moment its writes take to reach storage, so the children see a clean filesystem."""
        check_id(source)
        for child in children:
            check_id(child)
        att = self.attached.get(source)
        if att and att.target:
            run("fsfreeze", "-f", att.target)
            try:
                self._settle(source, att)
                return att.workspace.fork(children)
            finally:
                run("fsfreeze", "-u", att.target)
        if att:
            self._settle(source, att)
        return Workspace(self.store, source).fork(children)

    def _settle(self, source: str, att: Attached) -> None:
        receipt = att.replicator.wait_replicated(att.device.flush().seq, self.settings.fork_wait)
        if receipt.level != "replicated":
            raise BlockdError(
                "not_replicated",
                f"{source}: writes not replicated within {self.settings.fork_wait}s; "
                "storage may be unreachable",
            )

    def stats(self) -> dict[str, Any]:
        workspaces = {}
        for workspace_id, att in list(self.attached.items()):
            rep = att.replicator
            workspaces[workspace_id] = {
                "target": att.target,
                "device": att.loop,
                "size_bytes": att.device.size,
                "dirty_blocks": att.device.dirty_blocks(),
                "backlog_bytes": rep.backlog_bytes,
                "replicated_seq": rep.replicated_seq,
                "backpressure_waits": rep.waits,
                "lane_error": str(rep.error) if rep.error else None,
            }
        return {"workspaces": workspaces, "store_retries": self.store.retries}
