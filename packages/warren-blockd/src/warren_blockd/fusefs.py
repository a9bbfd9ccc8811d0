"""The FUSE side: one file per attached workspace, each backing a loop device.

The kernel has no network block device here, so a workspace reaches the kernel as a file in
this FUSE mount; `losetup` turns the file into a block device and ext4 mounts on that. Any
failure below (a chunk that fails verification, storage that cannot be reached, a stopped
lane) becomes EIO for the reader or writer: never a wrong byte. A workspace's size is fixed:
truncating it to another size is EINVAL.

The file system is one directory (the root, node 1) of regular files. Each name gets a node
id the first time it is looked up and keeps it for the life of the connection, so the
kernel's inodes stay valid across a detach and attach of the same workspace, and across a
handoff (`nodes()` and `DeviceFS(nodes=...)` carry the table to the new daemon). File
handles carry nothing (always 0): any process can serve any open file.
"""

from __future__ import annotations

import errno
import logging
import stat
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from warren_blockd import fuse_wire as wire
from warren_blockd.device import Device
from warren_blockd.errors import BlobError
from warren_blockd.workspace import SplitBrainError

log = logging.getLogger("warren_blockd.fuse")
TIMEOUT = 1.0  # seconds the kernel may cache a name or attributes
ROOT_MODE = stat.S_IFDIR | 0o700
FILE_MODE = stat.S_IFREG | 0o600


class FuseError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(errno.errorcode.get(code, str(code)))
        self.code = code


Reply = bytes | list[bytes] | None
T = TypeVar("T")


class DeviceFS:
    def __init__(self, nodes: dict[str, int] | None = None, started_ns: int | None = None) -> None:
        self.devices: dict[str, Device] = {}
        self._lock = threading.Lock()
        self._ids: dict[str, int] = dict(nodes or {})
        self._names: dict[int, str] = {nodeid: name for name, nodeid in self._ids.items()}
        self._next = max(self._names, default=wire.ROOT_ID) + 1
        self.started_ns = started_ns if started_ns is not None else time.time_ns()
        self._ops: dict[int, Callable[[wire.Request], Reply]] = {
            wire.LOOKUP: self._lookup,
            wire.GETATTR: self._getattr,
            wire.SETATTR: self._setattr,
            wire.OPEN: self._open,
            wire.OPENDIR: self._open,
            wire.READ: self._read,
            wire.WRITE: self._write,
            wire.FSYNC: self._fsync,
            wire.FLUSH: self._ok,
            wire.RELEASE: self._ok,
            wire.RELEASEDIR: self._ok,
            wire.READDIR: self._readdir,
            wire.STATFS: self._statfs,
            wire.GETXATTR: lambda request: self._fail(request, errno.ENODATA),
            wire.LISTXATTR: lambda request: self._fail(request, errno.ENOSYS),
        }

    def attach(self, name: str, device: Device) -> None:
        with self._lock:
            self.devices[name] = device
            if name not in self._ids:
                self._ids[name] = self._next
                self._names[self._next] = name
                self._next += 1

    def detach(self, name: str) -> Device | None:
        with self._lock:
            return self.devices.pop(name, None)

    def nodes(self) -> dict[str, int]:
        """Every node id handed to the kernel so far (the handoff carries it on)."""
        with self._lock:
            return dict(self._ids)

    # -- dispatch ------------------------------------------------------------------------

    def handle(self, request: wire.Request) -> Reply:
        op = self._ops.get(request.opcode)
        if op is None:
            return wire.reply_error(request.unique, errno.ENOSYS)
        try:
            return op(request)
        except FuseError as exc:
            return wire.reply_error(request.unique, exc.code)

    @staticmethod
    def _fail(request: wire.Request, code: int) -> bytes:
        return wire.reply_error(request.unique, code)

    @staticmethod
    def _ok(request: wire.Request) -> bytes:
        return wire.out_header(request.unique)

    @staticmethod
    def _reply(request: wire.Request, payload: bytes) -> list[bytes]:
        return [wire.out_header(request.unique, 0, len(payload)), payload]

    def _name(self, nodeid: int) -> str:
        name = self._names.get(nodeid)
        if name is None:
            raise FuseError(errno.ENOENT)
        return name

    def _device(self, nodeid: int) -> tuple[str, Device]:
        name = self._name(nodeid)
        device = self.devices.get(name)
        if device is None:  # detached: the kernel's inode outlived the workspace here
            raise FuseError(errno.ENOENT)
        return name, device

    def _attr(self, nodeid: int) -> wire.Attr:
        if nodeid == wire.ROOT_ID:
            return wire.Attr(wire.ROOT_ID, 0, ROOT_MODE, 2, self.started_ns)
        _, device = self._device(nodeid)
        return wire.Attr(nodeid, device.size, FILE_MODE, 1, self.started_ns)

    @staticmethod
    def _guard(what: str, name: str, op: Callable[[], T]) -> T:
        try:
            return op()
        except (BlobError, SplitBrainError, OSError, ValueError) as exc:
            log.error("device %s failed", what, extra={"fields": {"workspace": name, "error": str(exc)}})
            raise FuseError(errno.EIO) from None

    # -- operations ----------------------------------------------------------------------

    def _lookup(self, request: wire.Request) -> Reply:
        if request.nodeid != wire.ROOT_ID:
            raise FuseError(errno.ENOTDIR)
        name = wire.lookup_name(request.body)
        with self._lock:
            nodeid = self._ids.get(name)
            attached = name in self.devices
        if nodeid is None or not attached:
            raise FuseError(errno.ENOENT)
        return self._reply(request, wire.entry_out(nodeid, self._attr(nodeid), TIMEOUT))

    def _getattr(self, request: wire.Request) -> Reply:
        return self._reply(request, wire.attr_out(self._attr(request.nodeid), TIMEOUT))

    def _setattr(self, request: wire.Request) -> Reply:
        if len(request.body) < wire.SETATTR_IN.size:
            raise FuseError(errno.EINVAL)
        valid, _fh, size, *_rest = wire.SETATTR_IN.unpack_from(request.body)
        attr = self._attr(request.nodeid)
        if valid & wire.FATTR_SIZE and size != attr.size:
            raise FuseError(errno.EINVAL)  # a workspace's size is fixed at create
        if valid & (wire.FATTR_MODE | wire.FATTR_UID | wire.FATTR_GID):
            raise FuseError(errno.EPERM)
        return self._reply(request, wire.attr_out(attr, TIMEOUT))  # times and the rest: unchanged

    def _open(self, request: wire.Request) -> Reply:
        if request.opcode == wire.OPENDIR and request.nodeid != wire.ROOT_ID:
            raise FuseError(errno.ENOTDIR)
        if request.opcode == wire.OPEN:
            self._device(request.nodeid)
        return self._reply(request, wire.OPEN_OUT.pack(0, 0))

    def _read(self, request: wire.Request) -> Reply:
        _fh, offset, size, *_rest = wire.READ_IN.unpack_from(request.body)
        name, device = self._device(request.nodeid)
        data = self._guard("read", name, lambda: device.read(offset, size))
        return [wire.out_header(request.unique, 0, len(data)), data]

    def _write(self, request: wire.Request) -> Reply:
        _fh, offset, size, *_rest = wire.WRITE_IN.unpack_from(request.body)
        name, device = self._device(request.nodeid)
        data = request.body[wire.WRITE_IN.size : wire.WRITE_IN.size + size]
        if len(data) != size:
            raise FuseError(errno.EINVAL)
        written = self._guard("write", name, lambda: device.write(offset, bytes(data)))
        return self._reply(request, wire.WRITE_OUT.pack(written))

    def _fsync(self, request: wire.Request) -> Reply:
        name, device = self._device(request.nodeid)
        self._guard("flush", name, lambda: device.flush().seq)  # the loop device's flush: seal a batch
        return wire.out_header(request.unique)

    def _readdir(self, request: wire.Request) -> Reply:
        if request.nodeid != wire.ROOT_ID:
            raise FuseError(errno.ENOTDIR)
        _fh, offset, size, *_rest = wire.READ_IN.unpack_from(request.body)
        with self._lock:
            names = sorted(self.devices)
            entries = [(wire.ROOT_ID, b".", ROOT_MODE), (wire.ROOT_ID, b"..", ROOT_MODE)]
            entries += [(self._ids[name], name.encode(), FILE_MODE) for name in names]
        out = b""
        for index in range(offset, len(entries)):
            ino, raw, mode = entries[index]
            record = wire.dirent(ino, index + 1, raw, mode)
            if len(out) + len(record) > size:
                break
            out += record
        return self._reply(request, out)

    def _statfs(self, request: wire.Request) -> Reply:
        with self._lock:
            blocks = sum(device.size for device in self.devices.values()) // 4096
            files = len(self.devices)
        return self._reply(request, wire.STATFS_OUT.pack(blocks, 0, 0, files, 0, 4096, 255, 4096))
