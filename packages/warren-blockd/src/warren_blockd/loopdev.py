"""Loop devices that go away with the daemon's hold on them, and are never detached by
number alone.

A loop device outlives the process that attached it. A daemon that dies (kill -9, a crash)
or exits without its detach (an unmount that failed) leaves the device bound to a file of a
FUSE mount nobody serves, and the number it recorded in mount.json may belong to someone
else by the time a new daemon reads it (after a reboot, or once an operator detached it).

So every device the daemon attaches is marked autoclear (LO_FLAGS_AUTOCLEAR, as `mount -o
loop` does) and held open by the daemon. The kernel then detaches it at its last close:
the daemon's own close at detach when nothing else holds it; its exit if it dies before
mounting; the unmount of the ext4 on it (a restarted daemon's lazy unmount, a pod's
unpublish, an operator's umount) if it dies while mounted. Nothing here detaches a device
without first reading that its backing file is ours.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import subprocess
import threading
from pathlib import Path

LOOP_SET_STATUS64 = 0x4C04
LOOP_GET_STATUS64 = 0x4C05
LOOP_CTL_ADD = 0x4C80
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONTROL = Path("/dev/loop-control")
LO_FLAGS_AUTOCLEAR = 4
# struct loop_info64 (linux/loop.h): device, inode, rdevice, offset, sizelimit; number,
# encrypt type, encrypt key size, flags; file name, crypt name, key; init[2]. 232 bytes.
_INFO64 = struct.Struct("=5Q4I64s64s32s2Q")
_FLAGS = 8  # lo_flags in the unpacked tuple
SYS_BLOCK = Path("/sys/block")
# Another process on the machine may take a number between our choosing and binding it.
ATTACH_TRIES = 16
CHOOSE_SPAN = 256  # numbers looked at past the first free one
# Numbers chosen here and not yet bound. Concurrent `losetup --find` calls were given the
# same free number; all but one failed and slept 200 ms before asking again (a fork's eight
# children waited up to 1.3 s for their devices). Each attach here takes a number of its
# own. The daemon never opens a file of its FUSE mount itself, `losetup` does: a child it
# forked meanwhile would inherit that descriptor, and closing it before its exec waits for
# a FUSE answer from the daemon, which waits for the child.
_reserved: set[int] = set()
_choosing = threading.Lock()


class LoopError(OSError):
    """A loop device that is not what the caller attached."""


def backing_file(device: str) -> str | None:
    """The backing file the kernel names for `device` (/dev/loopN), None if it is unbound.
    A file whose mount was detached from the tree (a lazy unmount) reads as its path from
    that mount's root."""
    try:
        return (SYS_BLOCK / Path(device).name / "loop" / "backing_file").read_text().rstrip("\n")
    except OSError:
        return None


def backed_under(directory: Path) -> list[tuple[str, Path]]:
    """Every loop device whose backing file lies under `directory`, with that file."""
    prefix = f"{directory}/"
    found = []
    for entry in sorted(SYS_BLOCK.glob("loop*")):
        device = f"/dev/{entry.name}"
        backing = backing_file(device)
        if backing is not None and backing.startswith(prefix):
            found.append((device, Path(backing)))
    return found


def status(fd: int) -> tuple[int, int, int]:
    """(backing file's device as the kernel encodes it, its inode, flags) of an open loop device."""
    info = _INFO64.unpack(fcntl.ioctl(fd, LOOP_GET_STATUS64, bytes(_INFO64.size)))
    return int(info[0]), int(info[1]), int(info[_FLAGS])


def attach(backing: Path, *options: str) -> tuple[str, int]:
    """A loop device bound to `backing` by `losetup` with `options`, autoclear and held
    (hold()): (/dev/loopN, the descriptor that holds it). Concurrent attaches in this
    process bind distinct numbers side by side."""
    for _ in range(ATTACH_TRIES):
        number = _choose()
        device = f"/dev/loop{number}"
        try:
            done = subprocess.run(
                ["losetup", *options, device, str(backing)], capture_output=True, text=True, check=False
            )
        finally:
            with _choosing:
                _reserved.discard(number)
        if done.returncode == 0:
            try:
                return device, hold(device, backing)
            except BaseException:
                with contextlib.suppress(OSError):  # only if it is still ours
                    detach_if_backed_by(device, backing)
                raise
        if backing_file(device) in (None, str(backing)):  # not taken by another: a real failure
            raise LoopError(f"losetup {device} {backing} failed: {done.stderr.strip() or done.returncode}")
    raise LoopError(errno.EBUSY, f"no free loop device for {backing} after {ATTACH_TRIES} tries")


def _choose() -> int:
    """An unbound loop number with a node in /dev that no other attach here has chosen (its
    device made if need be: in a container whose /dev is a copy, only numbers made before
    it started have nodes)."""
    with _choosing, LOOP_CONTROL.open("rb", buffering=0) as control:
        first = int(fcntl.ioctl(control, LOOP_CTL_GET_FREE))
        for number in range(first, first + CHOOSE_SPAN):
            if number in _reserved or backing_file(f"/dev/loop{number}") is not None:
                continue
            if not (SYS_BLOCK / f"loop{number}").exists():
                with contextlib.suppress(FileExistsError):
                    fcntl.ioctl(control, LOOP_CTL_ADD, number)
            if Path(f"/dev/loop{number}").exists():
                _reserved.add(number)
                return number
    last = first + CHOOSE_SPAN - 1
    raise LoopError(
        errno.ENODEV,
        f"no free loop device with a node in /dev from /dev/loop{first} to /dev/loop{last}: "
        "make nodes for more (mknod /dev/loopN b 7 N) or detach unused ones (losetup -d)",
    )


def hold(device: str, backing: Path) -> int:
    """Open `device`, check it is bound to `backing`, and mark it autoclear. The returned
    descriptor keeps it bound; closing it detaches it unless something else (a mount)
    still holds it, in which case the kernel detaches it when that goes."""
    fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    try:
        found = backing_file(device)  # read while we hold it: the number cannot change owner now
        if found != str(backing):
            raise LoopError(f"{device} is bound to {found!r}, not {backing}: not ours to hold")
        info = list(_INFO64.unpack(fcntl.ioctl(fd, LOOP_GET_STATUS64, bytes(_INFO64.size))))
        info[_FLAGS] |= LO_FLAGS_AUTOCLEAR
        fcntl.ioctl(fd, LOOP_SET_STATUS64, _INFO64.pack(*info))
    except BaseException:
        os.close(fd)
        raise
    return fd


def detach_if_backed_by(device: str, backing: Path) -> bool:
    """Detach `device` if its backing file is `backing` (still held by a mount: detached
    when that goes). False if it is unbound or bound to another file: not ours to touch."""
    if backing_file(device) != str(backing):
        return False
    done = subprocess.run(["losetup", "-d", device], capture_output=True, text=True, check=False)
    if done.returncode and backing_file(device) == str(backing):
        raise LoopError(f"losetup -d {device} failed: {done.stderr.strip() or done.returncode}")
    return True
