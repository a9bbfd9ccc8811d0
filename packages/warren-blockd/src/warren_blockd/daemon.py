"""The node daemon: workspaces attached as devices, mounted, flushed, forked, consolidated.

State on node disk (`state_dir`):
  fuse/                   the FUSE mount: one file per attached workspace
  cache/                  verified chunks fetched from storage
  workspaces/<id>/        dirty.img (copy-on-write layer), spool/ (batches not yet
                          replicated), mount.json (what to unmount after a crash);
                          base.manifest and dirty.map while a handoff is under way
  handoff.json            what the last handoff passed on (for whoever looks)

A handoff (handoff.py) moves everything to a new daemon on the same node without closing
the FUSE connection: `quiesce` stops this one at a clean point (no FUSE request in flight,
every write sealed in the spool, no uploader running, no API operation under way) and
`export` writes what the new one needs; the new one `adopt`s it. Until the new daemon
acknowledges, `resume` puts this one back exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warren_blockd import fuse_session, holder, loopdev, metrics
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.cache import ChunkCache
from warren_blockd.chunker import chunk_image
from warren_blockd.csi import mounts
from warren_blockd.device import Device
from warren_blockd.errors import NotFoundError
from warren_blockd.fuse_wire import InitParams
from warren_blockd.fusefs import DeviceFS
from warren_blockd.ids import WORKSPACE_ID_RULE, valid_workspace_id
from warren_blockd.manifest import BLOCK_SIZE, Manifest
from warren_blockd.replicator import Receipt, Replicator
from warren_blockd.workspace import SplitBrainError, Workspace, WorkspaceExistsError

log = logging.getLogger("warren_blockd.daemon")
MOUNT_OPTIONS = "nosuid,nodev,noinit_itable"  # holes read as zeros: no need to zero inode tables
MAX_SIBLINGS = 100  # the API's largest fork


class BlockdError(Exception):
    """A request the daemon refuses; `code` is stable for API clients."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def blank_id(size_bytes: int) -> str:
    """The stored empty ext4 file system that new workspaces of `size_bytes` fork (ids of
    this form are the daemon's own)."""
    return f"empty-ext4-{size_bytes // BLOCK_SIZE}"


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
    loop_fd: int | None = None  # our hold on `loop` (loopdev.py): closing it detaches it
    target: str | None = None
    consolidated_seq: int = 0
    consolidated_at: float = field(default_factory=time.monotonic)
    fence: int = 0  # the log record that fenced this node's takeover (holder.py)
    renewed_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Settings:
    backlog_bound: int = 256 << 20
    batch_bytes: int = 32 << 20
    flush_interval: float = 1.0
    consolidate_records: int = 64
    consolidate_interval: float = 60.0
    cache_memory: int = 256 << 20
    fork_wait: float = 60.0  # how long a fork waits for the source's writes to be replicated
    # How long the first fork of a source waits for others of it to join its freeze: the
    # children of one fork reach the node as one call each, within tens of milliseconds.
    fork_gather: float = 0.05
    # A call that says how many children its fork makes (`siblings`) waits for them
    # instead, until they all joined or this long: a claim's binds of a fork into eight
    # reach the node over some hundreds of milliseconds, and each freeze costs as much.
    fork_gather_max: float = 0.5
    # This node's name, as the cluster knows it: the holder of what it attaches (holder.py).
    node: str = field(default_factory=socket.gethostname)
    # How long a node's hold on an attached workspace lasts unrenewed (renewed every third of
    # it): another node takes the workspace over only after that, once this node is gone.
    hold: float = 30.0


class Gate:
    """API operations against a handoff. Operations run side by side; `hold` waits for the
    ones under way and keeps new ones waiting; `release` lets them go on (the handoff
    failed) or refuses them with `handed_over` (the client retries and reaches the new
    daemon once it listens on the socket)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self._held = False
        self.handed_over = False

    def _refuse_if_handed_over(self) -> None:
        if self.handed_over:
            raise BlockdError(
                "handed_over", "this daemon handed its workspaces to a new one on this node; retry"
            )

    @contextmanager
    def operation(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._held)
            self._refuse_if_handed_over()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    @contextmanager
    def unless_held(self) -> Iterator[bool]:
        """An operation that is skipped (yields False) rather than waits while held."""
        with self._cond:
            entered = not self._held and not self.handed_over
            if entered:
                self._active += 1
        try:
            yield entered
        finally:
            if entered:
                with self._cond:
                    self._active -= 1
                    self._cond.notify_all()

    def hold(self, timeout: float) -> bool:
        with self._cond:
            self._held = True
            if self._cond.wait_for(lambda: self._active == 0, timeout):
                return True
            self._held = False
            self._cond.notify_all()
            return False

    def release(self, handed_over: bool) -> None:
        with self._cond:
            self._held = False
            self.handed_over = handed_over
            self._cond.notify_all()


class HandoffError(RuntimeError):
    """A handoff step that failed; the old daemon resumes, the new one exits."""


def mounts_of(device: str) -> list[str]:
    """Every mount point of the filesystem on `device` (bind mounts included), deepest first."""
    try:
        rdev = Path(device).stat().st_rdev
    except OSError:
        return []
    wanted = f"{os.major(rdev)}:{os.minor(rdev)}"
    found = [e.mount_point for e in mounts.parse(mounts.MOUNTINFO.read_text()) if e.device == wanted]
    return sorted(found, key=len, reverse=True)


@dataclass
class _ForkBatch:
    """Children whose forks of one source are served by one freeze; the first of their
    calls leads the batch and makes them all, the others wait for its result."""

    children: dict[str, None] = field(default_factory=dict)  # ordered, without repeats
    result: dict[str, str | None] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass
class _Forks:
    turn: threading.Lock = field(default_factory=threading.Lock)
    waiting: _ForkBatch | None = None


class Daemon:
    def __init__(self, store: PolicyStore, state_dir: Path, settings: Settings = Settings()) -> None:
        self.store = store
        # Resolved once here: nothing may stat a path inside the FUSE mount while its
        # requests are not being read (a handoff), and resolving fuse/ later would.
        self.state = state_dir.resolve()
        self.settings = settings
        self.fuse_dir = self.state / "fuse"
        self.ready = threading.Event()
        self.fs = DeviceFS()
        self.session: fuse_session.Session | None = None
        self.gate = Gate()
        self.fuse_paused_at = 0.0  # monotonic time the last handoff stopped reading FUSE
        self.instance = uuid.uuid4().hex  # tells this process's answers from another's on a shared socket
        self.cache = ChunkCache(state_dir / "cache", store, settings.cache_memory)
        self.attached: dict[str, Attached] = {}
        # Detached before their spool drained: still uploading; a new attach waits for them.
        self._draining: dict[str, Replicator] = {}
        self._lock = threading.RLock()
        # Attaches of one id take turns; of different ids they overlap (striped: bounded).
        self._attach_locks = [threading.Lock() for _ in range(64)]
        # Source workspace id -> its forks: one freeze at a time, arrivals meanwhile batched.
        self._forking: dict[str, _Forks] = {}
        self._fork_joined = threading.Condition(self._lock)  # a child joined a waiting batch
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
            record.unlink()
            log.info("cleaned stale mount", extra={"fields": info})
        # The dead daemon's loop devices are autoclear: the kernel detached each as its last
        # mount went (above, or a pod's bind later). What is left on our FUSE files (one
        # attached by a version without autoclear, or between its attach and its hold) is
        # found by its backing file, never by the number mount.json recorded: after a reboot,
        # or once an operator detached it, that number may be someone else's. Still mounted
        # elsewhere, `losetup -d` only marks it to go with that mount.
        for device, backing in loopdev.backed_under(self.fuse_dir):
            fields = {"device": device, "backing": str(backing)}
            try:
                if not loopdev.detach_if_backed_by(device, backing):
                    continue  # gone meanwhile, or no longer ours
            except OSError as exc:
                log.error(
                    "detaching a stale loop device failed", extra={"fields": {**fields, "error": str(exc)}}
                )
                continue
            log.info("detached stale loop device", extra={"fields": fields})
        # A FUSE mount whose process died answers every stat with ENOTCONN: detach it first.
        with contextlib.suppress(OSError):  # nothing mounted there
            fuse_session.unmount(self.fuse_dir, lazy=True)
        self.fuse_dir.mkdir(parents=True, exist_ok=True)

    def start_fuse(self, workers: int = 16) -> None:
        """Mount the FUSE file system and serve it; `ready` is set once the kernel's INIT
        is answered."""
        self.fuse_dir.mkdir(parents=True, exist_ok=True)
        fd = fuse_session.mount_fuse(self.fuse_dir)
        self.session = fuse_session.Session(
            fd, self.fs.handle, workers=workers, on_init=lambda _params: self.ready.set()
        )
        self.session.start()

    def stop_fuse(self) -> None:
        """Unmount the FUSE file system (after `shutdown`) and let go of the connection."""
        # Loop devices let go of the FUSE files a moment after their detach: retry, and detach
        # lazily at last, so no mount outlives the daemon (a dead one answers ENOTCONN).
        for _ in range(20):
            try:
                fuse_session.unmount(self.fuse_dir)
                break
            except OSError:
                time.sleep(0.25)
        else:
            try:
                fuse_session.unmount(self.fuse_dir, lazy=True)
            except OSError as exc:
                log.error("unmounting the FUSE file system failed", extra={"fields": {"error": str(exc)}})
        if self.session is not None:
            self.session.close()

    def background(self) -> None:
        """Seal batches every flush_interval and consolidate manifests now and then."""
        while not self._stop.wait(self.settings.flush_interval):
            self.tick()

    def tick(self) -> None:
        with self.gate.unless_held() as entered:
            if entered:  # a handoff holds every workspace still: no seal, no consolidation
                self._tick()

    def _tick(self) -> None:
        with self._lock:
            items = list(self.attached.items())
        for workspace_id, att in items:
            try:
                if att.replicator.pending_blocks:
                    att.device.flush()
                metrics.BACKLOG_BYTES.labels(workspace_id).set(att.replicator.backlog_bytes)
                metrics.REPLICATED_SEQ.labels(workspace_id).set(att.replicator.replicated_seq)
                self._renew(workspace_id, att)
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
            self._fork_into(Workspace(self.store, check_id(template)), workspace_id)
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
        ws.refuse_if_released()  # a released id stays released, whatever the fork says
        blank = Workspace(self.store, blank_id(size_bytes))
        try:
            self._fork_into(blank, workspace_id)
        except NotFoundError:  # the first of its size: make the empty file system, keep it
            self._make_blank(blank.workspace_id, size_bytes)
            self._fork_into(blank, workspace_id)
        log.info("created", extra={"fields": {"workspace": workspace_id, "from": blank.workspace_id}})
        return {"workspace": workspace_id, "from": f"empty ext4 (a fork of {blank.workspace_id})"}

    @staticmethod
    def _fork_into(source: Workspace, workspace_id: str) -> None:
        """A new workspace as a fork of `source` (raises NotFoundError if there is none)."""
        error = source.fork([workspace_id])[workspace_id]
        if error:
            raise BlockdError("exists", error)

    def _make_blank(self, blank: str, size_bytes: int) -> None:
        """An empty ext4 file system of `size_bytes`, stored once as `blank` for every new
        workspace of that size to fork: a fork is a few small writes where mkfs and its
        replication cost a second or more. It is made under an id of its own and forked to
        `blank` when complete, so a concurrent creator never forks a half-made one (the
        loser of that race forks the winner's)."""
        draft = f"{blank}-{uuid.uuid4().hex[:12]}"
        Workspace(self.store, draft).create(size_bytes // BLOCK_SIZE)
        att = self.attach(draft)
        try:
            device = self._attach_loop(draft, att)  # direct I/O, as for a mount
            run(
                "mkfs.ext4",
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                device,
            )
            # The sandbox's own user, whoever its image says that is, may write at the top
            # of its workspace: world-writable and sticky, as /tmp is (a sandbox has one
            # tenant; the daemon never learns the image's user to give it the directory).
            run("debugfs", "-w", "-R", "set_inode_field / mode 041777", device)
            run("blockdev", "--flushbufs", device)
        finally:
            receipt = self._detach(draft, wait_replicated=self.settings.fork_wait)
        if receipt.level != "replicated":
            raise BlockdError(
                "not_replicated",
                f"the empty file system {draft} was not replicated within {self.settings.fork_wait}s; "
                "storage may be unreachable",
            )
        Workspace(self.store, draft).fork([blank])  # losing to another creator is fine
        Workspace(self.store, draft).release()  # the blank keeps the generation it stands on

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
        """The workspace served here (its device and replication), attached if it was not.
        The store's reads happen outside the daemon's lock: the eight children of a fork
        attach side by side, not one after another. One attach at a time for each id."""
        check_id(workspace_id)
        with self._attach_locks[hash(workspace_id) % len(self._attach_locks)]:
            with self._lock:
                if workspace_id in self.attached:
                    return self.attached[workspace_id]
                previous = self._draining.pop(workspace_id, None)
            ws = Workspace(self.store, workspace_id)
            if previous is not None:  # one uploader per spool: let the old one finish first
                previous.close(timeout=self.settings.fork_wait, drain=True)
                if previous.uploading():
                    with self._lock:
                        self._draining[workspace_id] = previous
                    raise BlockdError(
                        "busy", f"{workspace_id}: earlier writes are still replicating; try again later"
                    )
            manifest = ws.effective()  # newest consolidated manifest + log tail: no bytes read
            fence = self._take(ws)  # after the read: a released or missing id is refused first
            if fence > manifest.log_seq:  # a takeover's fence: read up to it again
                manifest = ws.effective()
            wdir = self._dir(workspace_id)
            wdir.mkdir(parents=True, exist_ok=True)
            replicator = Replicator(
                ws, wdir / "spool", self.settings.backlog_bound, manifest.log_seq + 1, start=False
            )
            device = Device(manifest, self.cache, replicator, wdir / "dirty.img", self.settings.batch_bytes)
            with self._lock:
                replicator.start()
                att = Attached(
                    ws, device, replicator, manifest.log_seq, consolidated_seq=manifest.log_seq, fence=fence
                )
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

    def _take(self, ws: Workspace) -> int:
        """Hold the workspace for this node before serving it (holder.py): refused while
        another node holds it; taken over once that hold lapsed, fenced with a log record.
        This node's unpublished writes from before a takeover (its spool) are superseded:
        moved aside, never published."""
        try:
            fence, previous = holder.take(ws, self.settings.node, self.settings.hold, time.time())
        except holder.HeldError as exc:
            raise BlockdError("held", str(exc)) from None
        if previous is not None:
            spool = self._dir(ws.workspace_id) / "spool"
            if any(spool.glob("*.batch")):
                aside = spool.with_name(f"superseded-{fence}")
                spool.rename(aside)
                log.warning(
                    "superseded writes kept aside",
                    extra={"fields": {"workspace": ws.workspace_id, "path": str(aside), "fence": fence}},
                )
            log.info(
                "took over",
                extra={"fields": {"workspace": ws.workspace_id, "from": previous.node, "fence": fence}},
            )
        return fence

    def _renew(self, workspace_id: str, att: Attached) -> None:
        """Renew this node's hold every third of it; a takeover since stops the lane."""
        if time.monotonic() - att.renewed_at < self.settings.hold / 3 or att.replicator.error:
            return
        try:
            holder.renew(att.workspace, self.settings.node, att.fence, time.time())
        except holder.TakenOverError as exc:
            att.replicator.stop(SplitBrainError(str(exc)))
            log.error("taken over", extra={"fields": {"workspace": workspace_id, "error": str(exc)}})
            return
        att.renewed_at = time.monotonic()

    def _attach_loop(self, workspace_id: str, att: Attached) -> str:
        """A loop device on the workspace's FUSE file, with direct I/O (every write reaches
        this daemon before it completes, none waits in the file's page cache), autoclear
        and held by us (loopdev.py): it goes when we let go of it and nothing mounts it,
        even if we die first."""
        backing = self.fuse_dir / workspace_id
        try:
            att.loop, att.loop_fd = loopdev.attach(backing, "--direct-io=on")
        except OSError as exc:
            raise BlockdError("host_command_failed", f"attaching a loop device to {backing}: {exc}") from exc
        return att.loop

    def _release_loop(self, workspace_id: str, att: Attached) -> None:
        """Let go of the loop device. Ours is held: closing it detaches it (or, while a
        lingering mount still holds it, the kernel does when that goes). One adopted from a
        handoff is not: autoclear already took it with its unmount, or it is detached here,
        if it is still bound to our file (its number may be another's by now)."""
        if att.loop is None:
            return
        if att.loop_fd is not None:
            os.close(att.loop_fd)
            att.loop_fd = None
        else:
            try:
                loopdev.detach_if_backed_by(att.loop, self.fuse_dir / workspace_id)
            except OSError as exc:
                raise BlockdError("host_command_failed", str(exc)) from exc
        att.loop = None

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
        device = att.loop or self._attach_loop(workspace_id, att)
        self._record_mount(workspace_id, att)
        run("mount", "-t", "ext4", "-o", MOUNT_OPTIONS, device, target)
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
            # Write the file system's dirty data to the device first: if another mount of it
            # still lingers (a pod's bind, unmounted lazily), this umount does not end the
            # file system, and what it had not written would reach the device only later,
            # after the flush below, or never.
            run("sync", "--file-system", att.target)
            run("umount", att.target)
            att.target = None
            metrics.MOUNTED.set(sum(1 for a in self.attached.values() if a.target))
        return self._detach(workspace_id, wait_replicated)

    def _detach(self, workspace_id: str, wait_replicated: float | None) -> Receipt:
        att = self.attached[workspace_id]
        self._release_loop(workspace_id, att)
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
        if drained and not att.replicator.error:
            try:  # every write is in storage: another node may attach it at once
                holder.let_go(att.workspace, self.settings.node, att.fence)
            except Exception as exc:  # its hold lapses by itself
                fields = {"workspace": workspace_id, "error": str(exc)}
                log.warning("letting go of the hold failed", extra={"fields": fields})
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
            try:
                run("sync", "-f", att.target)  # the filesystem's dirty pages reach the device first
            except BlockdError:
                if att.replicator.error:  # the lane stopped meanwhile: that is why the sync failed
                    raise att.replicator.error from None
                raise
        receipt = att.device.flush()
        if wait_replicated:
            receipt = att.replicator.wait_replicated(receipt.seq, wait_replicated)
        return receipt

    def fork(self, source: str, children: list[str], siblings: int | None = None) -> dict[str, str | None]:
        """Children get the source's manifest as it stands now. A source mounted here is frozen
        for the moment its writes take to reach storage, so the children see a clean filesystem.

        A fork into many children reaches the node as one call per child, within some
        hundreds of milliseconds. A frozen file system refuses a second freeze (EBUSY), so
        forks of one source go in batches (group commit): the first call of a batch leads it,
        the calls that arrive before it starts join it, and one freeze serves them all. The
        leader waits for the rest of its fork: until its `siblings` (all the fork's children,
        its own included) have joined, at most fork_gather_max, or fork_gather if it does not
        say; and, while the batch before it runs, for that. Each child is still made from the
        source as it stood after its call arrived."""
        check_id(source)
        for child in children:
            check_id(child)
        if siblings is not None and not 1 <= siblings <= MAX_SIBLINGS:
            raise BlockdError(
                "bad_request", f"siblings={siblings}: a fork makes 1 to {MAX_SIBLINGS} children"
            )
        with self._lock:
            forks = self._forking.setdefault(source, _Forks())
            leads = forks.waiting is None
            batch = forks.waiting = forks.waiting or _ForkBatch()
            batch.children.update(dict.fromkeys(children))
            self._fork_joined.notify_all()
        if not leads:
            batch.done.wait()
        else:
            try:
                if not forks.turn.locked():
                    self._gather(batch, siblings)
                with forks.turn:
                    with self._lock:
                        forks.waiting = None  # later calls start the next batch
                    batch.result = self._fork_now(source, list(batch.children))
            except BaseException as exc:
                batch.error = exc
            finally:
                batch.done.set()
        if batch.error is not None or batch.result is None:
            raise batch.error or BlockdError("internal", f"the fork of {source} made no result")
        return {child: batch.result[child] for child in children}

    def _gather(self, batch: _ForkBatch, siblings: int | None) -> None:
        """Wait for the rest of a fork's children to join its batch."""
        if siblings is None:
            time.sleep(self.settings.fork_gather)
            return
        with self._lock:
            self._fork_joined.wait_for(lambda: len(batch.children) >= siblings, self.settings.fork_gather_max)

    def _fork_now(self, source: str, children: list[str]) -> dict[str, str | None]:
        metrics.FORK_FREEZES.inc()
        metrics.FORK_CHILDREN.inc(len(children))
        att = self.attached.get(source)
        if att and att.target:
            began = time.monotonic()
            run("fsfreeze", "-f", att.target)
            frozen, settled = time.monotonic(), None
            try:
                self._settle(source, att)
                settled = time.monotonic()
                return att.workspace.fork(children)
            finally:
                run("fsfreeze", "-u", att.target)
                fields = {
                    "source": source,
                    "children": len(children),
                    "freeze_ms": round((frozen - began) * 1000),
                    "settle_ms": round((settled - frozen) * 1000) if settled else None,
                    "total_ms": round((time.monotonic() - began) * 1000),
                }
                log.info("forked", extra={"fields": fields})
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

    # -- handoff -------------------------------------------------------------------------

    def quiesce(self, timeout: float) -> None:
        """Stop at a clean point for a handoff: API operations done and held back, no FUSE
        request in flight and none read, every write sealed on node disk, no uploader running.
        Raises HandoffError (after `resume`) if a step does not finish within `timeout`."""
        if self.session is None or self.session.params is None:
            raise HandoffError("this daemon is not serving FUSE yet")
        deadline = time.monotonic() + timeout  # one budget for every step

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        if not self.gate.hold(left()):
            raise HandoffError(f"API operations still running after {timeout}s")
        try:
            with self._lock:
                attached = list(self.attached.items())
                draining = list(self._draining.items())
            # Uploaders first, while the sandboxes are still served: waiting for a record in
            # flight is the slow step, and no sandbox should wait for it.
            for workspace_id, replicator in [(w, a.replicator) for w, a in attached] + draining:
                if not replicator.pause(left()):
                    raise HandoffError(f"{workspace_id}: its uploader did not stop within {timeout}s")
            self.fuse_paused_at = time.monotonic()  # from here the sandboxes wait (a metric)
            if not self.session.pause(left()):
                raise HandoffError(f"FUSE requests still in flight after {timeout}s")
            for workspace_id, att in attached:
                try:
                    att.device.flush()  # the write batch sealed in the spool: the new one reads it there
                except Exception as exc:
                    raise HandoffError(f"{workspace_id}: sealing its writes failed: {exc}") from exc
        except BaseException:
            self.resume()
            raise

    def resume(self) -> None:
        """Serve again after `quiesce` (the handoff failed): nothing was lost or changed."""
        with self._lock:
            replicators = [a.replicator for a in self.attached.values()] + list(self._draining.values())
        for replicator in replicators:
            replicator.resume()
        if self.session is not None:
            self.session.start()
        self.gate.release(handed_over=False)
        log.info("resumed after a failed handoff")

    def export(self) -> dict[str, Any]:
        """What the new daemon needs, after `quiesce`: per workspace the manifest it was
        attached from and the map of its dirty layer (files beside its spool), and in the
        returned document its loop device, mount target and replication position, the FUSE
        node table and INIT parameters. Also written to `handoff.json`."""
        if self.session is None or self.session.params is None:
            raise HandoffError("this daemon is not serving FUSE")
        workspaces = []
        for workspace_id, att in sorted(self.attached.items()):
            wdir = self._dir(workspace_id)
            _write_file(wdir / "base.manifest", att.device.manifest.to_bytes())
            _write_file(wdir / "dirty.map", att.device.dirty_map())
            workspaces.append(
                {
                    "id": workspace_id,
                    "loop": att.loop,
                    "target": att.target,
                    "generation_seq": att.generation_seq,
                    "consolidated_seq": att.consolidated_seq,
                    "next_seq": att.replicator.replicated_seq + 1,
                    "next_spool_seq": att.replicator.next_spool_seq,
                    "fence": att.fence,
                }
            )
        draining = [
            {"id": w, "next_seq": r.replicated_seq + 1, "next_spool_seq": r.next_spool_seq}
            for w, r in sorted(self._draining.items())
        ]
        doc = {
            "version": 1,
            "pid": os.getpid(),
            "fuse": {
                "init": self.session.params.to_doc(),
                "nodes": self.fs.nodes(),
                "started_ns": self.fs.started_ns,
                "device": self._fuse_device(),
            },
            "workspaces": workspaces,
            "draining": draining,
        }
        _write_file(self.state / "handoff.json", json.dumps(doc, indent=2).encode())
        return doc

    def handed_over(self) -> None:
        """The new daemon acknowledged: let go of everything without touching it (the
        mounts, loop devices, spools and the FUSE connection are the new daemon's now)."""
        self.gate.release(handed_over=True)
        self._stop.set()
        if self.session is not None:
            self.session.close()  # our copy of the descriptor; the new daemon holds its own
        with self._lock:
            for att in self.attached.values():
                att.device.close()
                if att.loop_fd is not None:  # the mount holds the device now, then the new daemon
                    os.close(att.loop_fd)
                    att.loop_fd = None
        log.info("handed over", extra={"fields": {"workspaces": sorted(self.attached)}})

    def adopt(self, doc: dict[str, Any], fuse_fd: int, tree_fd: int | None) -> None:
        """Take over what `export` wrote, without serving yet (`serve_adopted` starts that):
        the FUSE mount made visible here, every workspace attached from its node state and
        spool with its uploader ready, the session ready to read the same connection."""
        if doc.get("version") != 1:
            raise HandoffError(f"handoff document version {doc.get('version')!r}: this daemon reads 1")
        fuse = doc["fuse"]
        self._show_fuse_mount(str(fuse["device"]), tree_fd)
        nodes = {str(name): int(nodeid) for name, nodeid in fuse["nodes"].items()}
        self.fs = DeviceFS(nodes=nodes, started_ns=int(fuse["started_ns"]))
        for item in doc["workspaces"]:
            workspace_id = check_id(item["id"])
            wdir = self._dir(workspace_id)
            ws = Workspace(self.store, workspace_id)
            replicator = self._handed_replicator(ws, item)
            try:
                manifest = Manifest.from_bytes((wdir / "base.manifest").read_bytes())
                device = Device(
                    manifest,
                    self.cache,
                    replicator,
                    wdir / "dirty.img",
                    self.settings.batch_bytes,
                    dirty_map=(wdir / "dirty.map").read_bytes(),
                )
            except (OSError, ValueError) as exc:
                raise HandoffError(f"{workspace_id}: its node state cannot be adopted: {exc}") from exc
            self.attached[workspace_id] = Attached(
                ws,
                device,
                replicator,
                int(item["generation_seq"]),
                loop=item["loop"],
                target=item["target"],
                consolidated_seq=int(item["consolidated_seq"]),
                fence=int(item.get("fence", 0)),  # from a version without holds: none
            )
            self.fs.attach(workspace_id, device)
        for item in doc["draining"]:
            workspace_id = check_id(item["id"])
            self._draining[workspace_id] = self._handed_replicator(Workspace(self.store, workspace_id), item)
        self.session = fuse_session.Session(fuse_fd, self.fs.handle, params=InitParams.from_doc(fuse["init"]))

    def _handed_replicator(self, ws: Workspace, item: dict[str, Any]) -> Replicator:
        spool = self._dir(ws.workspace_id) / "spool"
        replicator = Replicator(ws, spool, self.settings.backlog_bound, int(item["next_seq"]), start=False)
        if replicator.next_spool_seq != int(item["next_spool_seq"]):
            raise HandoffError(
                f"{ws.workspace_id}: the spool holds batches up to {replicator.next_spool_seq - 1}, the old "
                f"daemon sealed up to {int(item['next_spool_seq']) - 1}"
            )
        return replicator

    def _fuse_device(self) -> str | None:
        """major:minor of the mount on top at fuse/, from the mount table: a stat would ask
        the FUSE file system itself, which answers nothing while a handoff holds it."""
        found = None
        for entry in mounts.parse(mounts.MOUNTINFO.read_text()):
            if entry.mount_point == str(self.fuse_dir):
                found = entry.device
        return found

    def _show_fuse_mount(self, device: str, tree_fd: int | None) -> None:
        """The same FUSE mount at our fuse/: already there in a shared mount namespace, else
        attached from the copy the old daemon sent (a pod has a namespace of its own)."""
        # Not mkdir(exist_ok=True): that stats an existing directory, here the paused mount.
        with contextlib.suppress(FileExistsError):
            self.fuse_dir.mkdir(0o700)
        if self._fuse_device() == device:
            return
        if tree_fd is None:
            raise HandoffError(f"{self.fuse_dir} is not the old daemon's FUSE mount and no copy of it came")
        try:
            fuse_session.attach_mount(tree_fd, self.fuse_dir)
        except OSError as exc:
            raise HandoffError(f"attaching the old daemon's FUSE mount at {self.fuse_dir}: {exc}") from exc
        if self._fuse_device() != device:
            raise HandoffError(f"{self.fuse_dir} still is not the old daemon's FUSE mount")

    def serve_adopted(self) -> None:
        """After the old daemon's acknowledgement: upload, read FUSE requests, seal and
        consolidate, in that order (uploads first: writes may be waiting at the bound)."""
        if self.session is None:
            raise HandoffError("nothing was adopted")
        for att in self.attached.values():
            att.replicator.start()
        for replicator in self._draining.values():
            replicator.start()
        self.session.start()
        metrics.MOUNTED.set(sum(1 for a in self.attached.values() if a.target))
        self.ready.set()
        for workspace_id in self.attached:
            for name in ("base.manifest", "dirty.map"):
                (self._dir(workspace_id) / name).unlink(missing_ok=True)

    def abandon_adoption(self) -> None:
        """The handoff failed on this side: let go of what `adopt` opened, touching nothing."""
        for att in self.attached.values():
            att.device.close()
        self.attached.clear()
        self._draining.clear()
        if self.session is not None:
            os.close(self.session.fd)
            self.session = None


def _write_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
