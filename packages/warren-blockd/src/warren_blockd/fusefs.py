"""The FUSE side: one file per attached workspace, each backing a loop device.

The kernel has no network block device here, so a workspace reaches the kernel as a file in
this FUSE mount; `losetup` turns the file into a block device and ext4 mounts on that. Any
failure below (a chunk that fails verification, storage that cannot be reached, a stopped
lane) becomes EIO for the reader or writer: never a wrong byte.
"""

from __future__ import annotations

import errno
import logging
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

import mfusepy

from warren_blockd.device import Device
from warren_blockd.errors import BlobError
from warren_blockd.workspace import SplitBrainError

log = logging.getLogger("warren_blockd.fuse")


class DeviceFS(mfusepy.Operations):  # type: ignore[misc]
    use_ns = True

    def __init__(self, on_ready: Callable[[], None] = lambda: None) -> None:
        self.devices: dict[str, Device] = {}
        self._lock = threading.Lock()
        self._on_ready = on_ready
        self._started = time.time_ns()

    def attach(self, name: str, device: Device) -> None:
        with self._lock:
            self.devices[name] = device

    def detach(self, name: str) -> Device | None:
        with self._lock:
            return self.devices.pop(name, None)

    def _device(self, path: str) -> Device:
        device = self.devices.get(path.lstrip("/"))
        if device is None:
            raise mfusepy.FuseOSError(errno.ENOENT)
        return device

    def _guard(self, what: str, path: str, op: Callable[[], Any]) -> Any:
        try:
            return op()
        except (BlobError, SplitBrainError, OSError, ValueError) as exc:
            log.error(
                "device %s failed", what, extra={"fields": {"workspace": path.lstrip("/"), "error": str(exc)}}
            )
            raise mfusepy.FuseOSError(errno.EIO) from None

    # -- FUSE operations ----------------------------------------------------------------

    def init(self, conn: Any, config: Any = None) -> None:
        self._on_ready()

    def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
        times = {"st_atime": self._started, "st_mtime": self._started, "st_ctime": self._started}
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o700, "st_nlink": 2, **times}
        device = self._device(path)
        return {"st_mode": stat.S_IFREG | 0o600, "st_nlink": 1, "st_size": device.size, **times}

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", *sorted(self.devices)]

    def open(self, path: str, flags: int) -> int:
        self._device(path)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        device = self._device(path)
        data: bytes = self._guard("read", path, lambda: device.read(offset, size))
        return data

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        device = self._device(path)
        written: int = self._guard("write", path, lambda: device.write(offset, bytes(data)))
        return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if length != self._device(path).size:
            raise mfusepy.FuseOSError(errno.EINVAL)  # a workspace's size is fixed at create
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        device = self._device(path)
        self._guard("flush", path, device.flush)  # the loop device's flush: seal a batch
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        return 0
