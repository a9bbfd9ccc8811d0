"""Handing a node's workspaces from a running daemon to a new one, FUSE connection and all.

The running daemon listens on a unix socket (SOCK_SEQPACKET: one message per send, root
only). A new daemon started beside it on the same node, with the same state directory,
connects and the two exchange:

    new -> old   {"op": "hand_over"}
    old          quiesce: API operations held, FUSE reading stopped and every request it
                 read answered, write batches sealed in the spools, uploaders stopped
    old -> new   {"op": "state", "state": ...} with the /dev/fuse descriptor (and a copy
                 of the FUSE mount, for a new daemon in another mount namespace) attached
                 by SCM_RIGHTS; or {"op": "refused", "error": ...} and it serves on
    new          adopt: the mount made visible, every workspace attached from its node
                 state and spool, uploaders and the FUSE session ready but not started
    new -> old   {"op": "ready"}: the acknowledgement, and the commit point

The acknowledgement is the one step after which the old daemon never serves again, and the
new one does nothing that the old one could not undo before it: it starts uploading and
reading FUSE requests only once its acknowledgement was sent. A new daemon that fails or
dies before it leaves nothing changed, and the old one resumes where it stopped. An old
daemon that stops waiting shuts the socket down first: the kernel then either has the
acknowledgement queued for it (it commits) or refuses the new daemon's send (EPIPE: the
new one exits). So exactly one of them serves the connection and uploads each lane.
Requests the kernel receives meanwhile wait in the connection's queue: callers see
latency, never an error.
"""

from __future__ import annotations

import array
import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warren_blockd import fuse_session
from warren_blockd.daemon import Daemon, HandoffError

log = logging.getLogger("warren_blockd.handoff")
MESSAGE_BYTES = 1 << 20
DEFAULT_TIMEOUT = 120.0
# Seconds the new daemon waits, everything adopted, before it acknowledges. Tests only: they
# kill it there to prove the old daemon serves on.
HOLD_ENV = "WARREN_BLOCKD_HANDOFF_HOLD"


def _send(sock: socket.socket, doc: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(doc).encode()
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(data)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the descriptors that came with it; (None, []) at end of stream."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MESSAGE_BYTES, 4)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("a handoff message is a JSON object")
    return doc, list(fds)


class Listener:
    """The running daemon's side: hands over to whoever connects (root only, by the
    socket's mode), one handoff at a time."""

    def __init__(
        self,
        path: Path,
        daemon: Daemon,
        on_handed_over: Callable[[], None],
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.path = path
        self.daemon = daemon
        self.on_handed_over = on_handed_over
        self.timeout = timeout
        self.lock = threading.Lock()  # held for a whole handoff; shutdown waits for it
        path.parent.mkdir(parents=True, exist_ok=True)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        old = os.umask(0o077)
        try:
            self._sock.bind(str(tmp))
        finally:
            os.umask(old)
        self._sock.listen(2)
        tmp.replace(path)  # atomically: a new daemon never finds the path missing or stale

    def serve_forever(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    if self._one(conn):
                        return
                except Exception:
                    log.exception("handoff failed")

    def close(self) -> None:
        self._sock.close()

    def _one(self, conn: socket.socket) -> bool:
        conn.settimeout(self.timeout)
        request, fds = _receive(conn)
        for fd in fds:
            os.close(fd)
        if request is None or request.get("op") != "hand_over":
            return False
        started = time.monotonic()
        with self.lock:
            if self.daemon.gate.handed_over:
                _send(conn, {"op": "refused", "error": "this daemon has already handed over"})
                return False
            log.info("handing over", extra={"fields": {"to_pid": request.get("pid")}})
            # The copy of the FUSE mount is made first: nothing may walk into the mount while
            # its requests are not read.
            tree: int | None = None
            try:
                tree = fuse_session.clone_mount(self.daemon.fuse_dir)
            except OSError as exc:  # a new daemon that shares our mount namespace needs none
                log.warning("no copy of the FUSE mount to send", extra={"fields": {"error": str(exc)}})
            try:
                try:
                    self.daemon.quiesce(self.timeout)
                except HandoffError as exc:
                    log.error("handoff refused", extra={"fields": {"error": str(exc)}})
                    _send(conn, {"op": "refused", "error": str(exc)})
                    return False
                paused = time.monotonic()
                reply = self._exchange(conn, tree)
            finally:
                if tree is not None:
                    os.close(tree)
            if reply is not None and reply.get("op") == "ready":
                self.daemon.handed_over()
                log.info(
                    "handoff acknowledged",
                    extra={
                        "fields": {
                            "to_pid": request.get("pid"),
                            "quiesce_ms": round((paused - started) * 1000, 1),
                            "paused_ms": round((time.monotonic() - paused) * 1000, 1),
                            # What a sandbox sees: no FUSE request read, from the stop to the ack.
                            "fuse_paused_ms": round(
                                (time.monotonic() - self.daemon.fuse_paused_at) * 1000, 1
                            ),
                        }
                    },
                )
                self.on_handed_over()
                return True
            error = reply.get("error") if reply else "the new daemon went away before acknowledging"
            log.error("handoff failed; serving on", extra={"fields": {"error": error}})
            self.daemon.resume()
            return False

    def _exchange(self, conn: socket.socket, tree: int | None) -> dict[str, Any] | None:
        """Send the state and the descriptors; the new daemon's answer, or None."""
        daemon = self.daemon
        try:
            doc = daemon.export()
            if daemon.session is None:
                raise HandoffError("this daemon is not serving FUSE")
            fds = [daemon.session.fd] + ([tree] if tree is not None else [])
            _send(conn, {"op": "state", "state": doc}, fds)
            reply, extra = _receive(conn)
            for fd in extra:
                os.close(fd)
            return reply
        except (OSError, ValueError, HandoffError) as exc:
            log.warning("handoff exchange ended", extra={"fields": {"error": str(exc)}})
        # Stop waiting for good: after this, an acknowledgement is either queued here
        # already or refused to its sender.
        try:
            conn.shutdown(socket.SHUT_RDWR)
            conn.setblocking(False)
            late, extra = _receive(conn)
            for fd in extra:
                os.close(fd)
            return late
        except (OSError, ValueError):
            return None


def take_over(daemon: Daemon, path: Path, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """The new daemon's side. False if no daemon listens at `path` (a plain start); True
    once this daemon serves what the old one had; HandoffError if the handoff failed (the
    old daemon serves on, and this one must exit without touching anything)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return False  # none there, or a socket left by a daemon that died
    with sock:
        # The old daemon's quiesce has `timeout` on its side; its answer comes within that.
        sock.settimeout(timeout + 30)
        started = time.monotonic()
        state, fuse_fd, tree_fd = _ask(sock, path)
        try:
            daemon.adopt(state, fuse_fd, tree_fd)
        except Exception as exc:
            _abandon(daemon, fuse_fd)
            with contextlib.suppress(OSError):
                _send(sock, {"op": "abort", "error": str(exc)})
            raise HandoffError(f"adopting the running daemon's workspaces: {exc}") from exc
        finally:
            if tree_fd is not None:
                os.close(tree_fd)
        log.info("adopted; acknowledging", extra={"fields": {"workspaces": sorted(daemon.attached)}})
        hold = float(os.environ.get(HOLD_ENV, "0") or 0)
        if hold:
            time.sleep(hold)
        try:
            _send(sock, {"op": "ready"})
        except OSError as exc:
            _abandon(daemon, fuse_fd)
            raise HandoffError(
                f"the running daemon stopped waiting before this one acknowledged ({exc}); it serves on"
            ) from exc
        daemon.serve_adopted()
        log.info(
            "took over",
            extra={
                "fields": {
                    "from_pid": state.get("pid"),
                    "workspaces": sorted(daemon.attached),
                    "handoff_ms": round((time.monotonic() - started) * 1000, 1),
                }
            },
        )
        return True


def _ask(sock: socket.socket, path: Path) -> tuple[dict[str, Any], int, int | None]:
    """Ask for the handoff: the state document, the FUSE descriptor and the mount's copy."""
    try:
        _send(sock, {"op": "hand_over", "pid": os.getpid()})
        message, fds = _receive(sock)
    except (OSError, ValueError) as exc:
        raise HandoffError(f"asking the running daemon at {path} to hand over: {exc}") from exc
    if message is None:
        raise HandoffError(f"the running daemon at {path} closed the connection without an answer")
    if message.get("op") == "refused":
        raise HandoffError(f"the running daemon refused to hand over: {message.get('error')}")
    if message.get("op") != "state" or not fds or not isinstance(message.get("state"), dict):
        for fd in fds:
            os.close(fd)
        raise HandoffError(f"unexpected handoff message {message.get('op')!r} (or no descriptor with it)")
    for fd in fds[2:]:
        os.close(fd)
    return message["state"], fds[0], (fds[1] if len(fds) > 1 else None)


def _abandon(daemon: Daemon, fuse_fd: int) -> None:
    owned = daemon.session is not None and daemon.session.fd == fuse_fd
    daemon.abandon_adoption()
    if not owned:
        os.close(fuse_fd)
