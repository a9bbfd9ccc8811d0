"""One FUSE connection served by Warren's own loop: mounted here, or taken over from another
process, and stoppable at a request boundary so that it can be handed on.

- `mount_fuse` opens /dev/fuse and mounts it (mount(2), as root, nosuid,nodev); the kernel
  then sends INIT, which the session answers.
- A `Session` has one reader thread that polls the descriptor together with a wake-up pipe,
  so `pause()` can stop it between two reads; requests go to worker threads, and `pause()`
  returns only once every request it read has been answered. Requests the kernel queues
  meanwhile stay queued in the kernel (a caller waits, nothing fails) until this session
  `resume()`s or another process serves the same descriptor.
- `Session(..., params=...)` serves a connection whose INIT was answered by another process
  (the kernel never sends INIT twice): the handoff passes the negotiated parameters along.
- `clone_mount`/`attach_mount` move a mount into another mount namespace (open_tree and
  move_mount), for a new daemon in a pod of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from warren_blockd import fuse_wire as wire

log = logging.getLogger("warren_blockd.fuse")
MS_NOSUID = 2
MS_NODEV = 4
MNT_DETACH = 2
AT_FDCWD = -100
OPEN_TREE_CLONE = 1
MOVE_MOUNT_F_EMPTY_PATH = 4
SYS_OPEN_TREE = 428  # the same number on every architecture (syscalls from 424 on are shared)
SYS_MOVE_MOUNT = 429

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.syscall.restype = ctypes.c_long


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


def mount_fuse(target: Path, fsname: str = "warren-blockd") -> int:
    """Open /dev/fuse and mount it at `target` nosuid,nodev; returns the descriptor."""
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0"
    try:
        _check(
            _libc.mount(
                fsname.encode(), os.fsencode(target), f"fuse.{fsname}".encode(), MS_NOSUID | MS_NODEV,
                options.encode(),
            ),
            f"mounting FUSE at {target}",
        )  # fmt: skip
    except OSError:
        os.close(fd)
        raise
    return fd


def unmount(target: Path, lazy: bool = False) -> None:
    _check(_libc.umount2(os.fsencode(target), MNT_DETACH if lazy else 0), f"unmounting {target}")


def clone_mount(path: Path) -> int:
    """A descriptor for a detached copy of the mount at `path`, for another namespace."""
    return _check(
        _libc.syscall(SYS_OPEN_TREE, AT_FDCWD, os.fsencode(path), OPEN_TREE_CLONE | os.O_CLOEXEC),
        f"open_tree {path}",
    )


def attach_mount(tree_fd: int, target: Path) -> None:
    """Attach a copy made by `clone_mount` (in any namespace) at `target` in ours."""
    _check(
        _libc.syscall(SYS_MOVE_MOUNT, tree_fd, b"", AT_FDCWD, os.fsencode(target), MOVE_MOUNT_F_EMPTY_PATH),
        f"move_mount to {target}",
    )


Handler = Callable[[wire.Request], bytes | list[bytes] | None]


class Session:
    """Serves one /dev/fuse descriptor; `handle` turns a request into its reply (None: no
    reply, as for FORGET). INIT is answered here; a handler's exception is an EIO reply."""

    def __init__(
        self,
        fd: int,
        handle: Handler,
        *,
        params: wire.InitParams | None = None,
        workers: int = 16,
        on_init: Callable[[wire.InitParams], None] = lambda _params: None,
    ) -> None:
        self.fd = fd
        self.handle = handle
        self.params = params
        self.on_init = on_init
        self.ended = threading.Event()  # the connection is gone (unmounted or aborted)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="fuse")
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._inflight = 0
        self._idle = threading.Condition()
        self._reader: threading.Thread | None = None
        self._stop = False
        os.set_blocking(fd, False)  # the reader polls; a spurious wake-up must not block it

    # -- control ---------------------------------------------------------------------

    def start(self) -> None:
        """Start reading (again) from the descriptor."""
        if self._reader is not None and self._reader.is_alive():
            return
        self._stop = False
        self._drain_wake()
        self._reader = threading.Thread(target=self._read_loop, name="fuse-reader", daemon=True)
        self._reader.start()

    def pause(self, timeout: float) -> bool:
        """Stop reading and wait until every request read so far is answered. False if that
        took longer than `timeout` (the reader is stopped all the same; `start` resumes)."""
        self._stop = True
        os.write(self._wake_w, b"x")
        if self._reader is not None:
            self._reader.join(timeout)
            if self._reader.is_alive():
                return False
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    def close(self) -> None:
        """Stop and let go of the descriptor (the connection lives on while another process,
        or a mount's loop device, holds it)."""
        self.pause(timeout=30)
        self._pool.shutdown(wait=True)
        for fd in (self._wake_r, self._wake_w, self.fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the loop --------------------------------------------------------------------

    def _drain_wake(self) -> None:
        try:
            while os.read(self._wake_r, 64):
                pass
        except BlockingIOError:
            pass

    def _read_loop(self) -> None:
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        size = self.params.read_buffer if self.params else 1 << 21  # INIT fits in any buffer
        while not self._stop:
            events = dict(poller.poll())
            if self._stop or self._wake_r in events:
                return
            if self.fd not in events:
                continue
            try:
                buf = os.read(self.fd, size)
            except BlockingIOError:
                continue
            except OSError as exc:
                if exc.errno == errno.ENOENT:  # the request was interrupted before we read it
                    continue
                if exc.errno != errno.ENODEV:
                    log.error("reading /dev/fuse failed", extra={"fields": {"error": str(exc)}})
                self.ended.set()  # ENODEV: unmounted, or the connection was aborted
                return
            try:
                request = wire.parse_request(buf)
            except wire.ProtocolError as exc:
                log.error("malformed FUSE request", extra={"fields": {"error": str(exc)}})
                continue
            if request.opcode == wire.INIT:
                self._init(request)
                size = self.params.read_buffer if self.params else size
                continue
            if request.opcode in (wire.FORGET, wire.BATCH_FORGET, wire.INTERRUPT):
                # No reply to forgets; interrupts are ignored (every request here is short
                # and answered anyway), which the protocol allows.
                continue
            if request.opcode == wire.DESTROY:
                self._reply(request.unique, [wire.out_header(request.unique)])
                continue
            with self._idle:
                self._inflight += 1
            self._pool.submit(self._serve, request)

    def _init(self, request: wire.Request) -> None:
        try:
            params, payload = wire.negotiate(request.body)
        except wire.ProtocolError as exc:
            log.error("FUSE INIT refused", extra={"fields": {"error": str(exc)}})
            self._reply(request.unique, [wire.reply_error(request.unique, errno.EPROTO)])
            return
        self.params = params
        self._reply(request.unique, [wire.out_header(request.unique, 0, len(payload)), payload])
        log.info("FUSE initialised", extra={"fields": params.to_doc()})
        self.on_init(params)

    def _serve(self, request: wire.Request) -> None:
        try:
            try:
                reply = self.handle(request)
            except Exception:
                log.exception("FUSE handler failed", extra={"fields": {"opcode": request.opcode}})
                reply = wire.reply_error(request.unique, errno.EIO)
            if reply is not None:
                self._reply(request.unique, [reply] if isinstance(reply, bytes) else reply)
        finally:
            with self._idle:
                self._inflight -= 1
                if self._inflight == 0:
                    self._idle.notify_all()

    def _reply(self, unique: int, parts: list[bytes]) -> None:
        try:
            os.writev(self.fd, parts)
        except OSError as exc:
            # ENOENT: the kernel no longer waits for it (interrupted, or the connection was
            # aborted); nothing else can be done with a reply that did not go.
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                log.error("FUSE reply failed", extra={"fields": {"unique": unique, "error": str(exc)}})
