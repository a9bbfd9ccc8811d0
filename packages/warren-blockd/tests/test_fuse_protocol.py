"""Warren's FUSE loop: the wire layouts against the kernel's, the negotiation, the file system's
answers to each opcode (over a real Device, no kernel), and a session on a real FUSE mount
that pauses with requests queued in the kernel and is served on by another session."""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import needs_root_and_fuse
from warren_blockd import chunks
from warren_blockd import fuse_wire as wire
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.cache import ChunkCache
from warren_blockd.device import Device
from warren_blockd.fuse_session import Session, mount_fuse, unmount
from warren_blockd.fusefs import DeviceFS
from warren_blockd.replicator import Replicator
from warren_blockd.workspace import LogLane, Workspace

BLOCK = 4096
KERNEL_SIZES = {  # sizeof() of each struct in include/uapi/linux/fuse.h
    "IN_HEADER": 40,
    "OUT_HEADER": 16,
    "INIT_OUT": 64,
    "ATTR": 88,
    "ATTR_OUT": 16,  # fuse_attr_out is 104: these 16, then fuse_attr
    "ENTRY_OUT": 40,  # fuse_entry_out is 128: these 40, then fuse_attr
    "READ_IN": 40,
    "WRITE_IN": 40,
    "WRITE_OUT": 8,
    "OPEN_OUT": 16,
    "STATFS_OUT": 80,
    "SETATTR_IN": 88,
    "FORGET_IN": 8,
    "BATCH_FORGET_IN": 8,
    "FORGET_ONE": 16,
    "DIRENT": 24,
}


def test_layouts_are_the_kernels() -> None:
    for name, size in KERNEL_SIZES.items():
        assert getattr(wire, name).size == size, name


def request(opcode: int, body: bytes = b"", nodeid: int = wire.ROOT_ID, unique: int = 7) -> wire.Request:
    header = wire.IN_HEADER.pack(wire.IN_HEADER.size + len(body), opcode, unique, nodeid, 0, 0, 1, 0, 0)
    return wire.parse_request(header + body)


def init_body(minor: int, flags: int, major: int = 7) -> bytes:
    return struct.pack("<IIIII44x", major, minor, 131072, flags, 0)


def test_a_request_must_be_exactly_as_long_as_it_says() -> None:
    good = wire.IN_HEADER.pack(44, wire.GETATTR, 9, 1, 0, 0, 1, 0, 0) + bytes(4)
    assert wire.parse_request(good).body.nbytes == 4
    with pytest.raises(wire.ProtocolError):
        wire.parse_request(good[:-1])
    with pytest.raises(wire.ProtocolError):
        wire.parse_request(good[:20])


def test_negotiation_takes_the_lower_minor_and_only_offered_flags() -> None:
    offered = wire.ASYNC_READ | wire.MAX_PAGES | wire.BIG_WRITES | (1 << 10)  # and one we do not want
    params, reply = wire.negotiate(memoryview(init_body(44, offered)))
    assert (params.major, params.minor) == (7, wire.KERNEL_MINOR)
    assert params.flags == wire.ASYNC_READ | wire.MAX_PAGES | wire.BIG_WRITES
    assert (params.max_pages, params.max_write) == (256, 1 << 20)
    major, minor, readahead, flags, *_ = wire.INIT_OUT.unpack(reply)
    assert (major, minor, readahead, flags) == (7, wire.KERNEL_MINOR, 131072, params.flags)
    assert params.read_buffer >= wire.IN_HEADER.size + wire.WRITE_IN.size + params.max_write
    assert wire.InitParams.from_doc(params.to_doc()) == params

    older, _ = wire.negotiate(memoryview(init_body(29, wire.ASYNC_READ)))
    assert older.minor == 29
    assert (older.max_pages, older.max_write) == (32, 128 << 10)  # no MAX_PAGES: the kernel's default


def test_negotiation_refuses_what_it_cannot_speak() -> None:
    with pytest.raises(wire.ProtocolError, match="FUSE 8"):
        wire.negotiate(memoryview(init_body(0, 0, major=8)))
    with pytest.raises(wire.ProtocolError, match=r"7\.27"):
        wire.negotiate(memoryview(init_body(27, 0)))
    with pytest.raises(wire.ProtocolError):
        wire.negotiate(memoryview(b"\x07\x00"))


def test_directory_entries_are_padded_to_eight_bytes() -> None:
    entry = wire.dirent(5, 3, b"ws-1", 0o100600)
    assert len(entry) == 32
    ino, offset, namelen, kind = wire.DIRENT.unpack_from(entry)
    assert (ino, offset, namelen, kind) == (5, 3, 4, 8)  # DT_REG
    assert entry[24:28] == b"ws-1" and entry[28:] == bytes(4)


# -- the file system, opcode by opcode ---------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> PolicyStore:
    store = PolicyStore(LocalDriver(tmp_path / "store"))
    ws = Workspace(store, "ws")
    ws.create(64)
    LogLane(ws, 1).publish([(2, bytes([7]) * BLOCK * 2)])  # blocks 2-3 in a chunk, the rest holes
    return store


@pytest.fixture
def device(store: PolicyStore, tmp_path: Path) -> Iterator[Device]:
    ws = Workspace(store, "ws")
    manifest = ws.effective()
    replicator = Replicator(ws, tmp_path / "spool", 1 << 30, manifest.log_seq + 1, start=False)
    device = Device(manifest, ChunkCache(tmp_path / "cache", store), replicator, tmp_path / "dirty.img")
    replicator.start()
    yield device
    replicator.close(timeout=10)
    device.close()


def error_of(reply: bytes | list[bytes] | None) -> int:
    assert reply is not None
    raw = reply if isinstance(reply, bytes) else b"".join(reply)
    length, error, unique = wire.OUT_HEADER.unpack_from(raw)
    assert length == len(raw) and unique == 7
    return -error


def payload(reply: bytes | list[bytes] | None) -> bytes:
    assert error_of(reply) == 0
    assert reply is not None
    return (reply if isinstance(reply, bytes) else b"".join(reply))[wire.OUT_HEADER.size :]


def lookup(fs: DeviceFS, name: str) -> int:
    out = payload(fs.handle(request(wire.LOOKUP, name.encode() + b"\0")))
    nodeid, *_ = wire.ENTRY_OUT.unpack_from(out)
    ino, size, *_rest = wire.ATTR.unpack_from(out, wire.ENTRY_OUT.size)
    assert ino == nodeid and size == 64 * BLOCK
    return int(nodeid)


def read_in(offset: int, size: int) -> bytes:
    return wire.READ_IN.pack(0, offset, size, 0, 0, 0, 0)


def test_each_opcode_gets_its_answer(device: Device) -> None:
    fs = DeviceFS()
    assert error_of(fs.handle(request(wire.LOOKUP, b"ws\0"))) == errno.ENOENT
    fs.attach("ws", device)
    nodeid = lookup(fs, "ws")
    assert nodeid != wire.ROOT_ID
    root = payload(fs.handle(request(wire.GETATTR, bytes(16))))
    assert wire.ATTR.unpack_from(root, wire.ATTR_OUT.size)[9] == 0o40700  # mode
    assert error_of(fs.handle(request(wire.OPEN, bytes(8), nodeid))) == 0
    assert (
        payload(fs.handle(request(wire.READ, read_in(2 * BLOCK, 2 * BLOCK), nodeid)))
        == bytes([7]) * 2 * BLOCK
    )
    assert payload(fs.handle(request(wire.READ, read_in(0, BLOCK), nodeid))) == bytes(BLOCK)  # a hole
    assert payload(fs.handle(request(wire.READ, read_in(63 * BLOCK, 3 * BLOCK), nodeid))) == bytes(
        BLOCK
    )  # EOF

    data = os.urandom(BLOCK + 100)
    write = wire.WRITE_IN.pack(0, 5 * BLOCK + 3, len(data), 0, 0, 0, 0) + data
    assert wire.WRITE_OUT.unpack(payload(fs.handle(request(wire.WRITE, write, nodeid))))[0] == len(data)
    assert payload(fs.handle(request(wire.READ, read_in(5 * BLOCK + 3, len(data)), nodeid))) == data
    assert error_of(fs.handle(request(wire.FSYNC, bytes(16), nodeid))) == 0
    assert device.replicator.pending_blocks == 0  # FSYNC sealed the batch: the loop device's flush
    assert error_of(fs.handle(request(wire.FLUSH, bytes(24), nodeid))) == 0
    assert error_of(fs.handle(request(wire.RELEASE, bytes(24), nodeid))) == 0

    def setattr_in(valid: int, size: int = 0, mode: int = 0) -> bytes:
        return wire.SETATTR_IN.pack(valid, 0, size, 0, 0, 0, 0, 0, 0, 0, mode, 0, 0)

    same = setattr_in(wire.FATTR_SIZE, 64 * BLOCK)
    assert wire.ATTR.unpack_from(payload(fs.handle(request(wire.SETATTR, same, nodeid))), 16)[1] == 64 * BLOCK
    assert error_of(fs.handle(request(wire.SETATTR, setattr_in(wire.FATTR_SIZE, 0), nodeid))) == errno.EINVAL
    assert (
        error_of(fs.handle(request(wire.SETATTR, setattr_in(wire.FATTR_MODE, mode=0o777), nodeid)))
        == errno.EPERM
    )
    assert error_of(fs.handle(request(wire.GETXATTR, bytes(8) + b"user.x\0", nodeid))) == errno.ENODATA
    assert error_of(fs.handle(request(wire.LISTXATTR, bytes(8), nodeid))) == errno.ENOSYS
    assert error_of(fs.handle(request(9, b"\0" * 8 + b"dir\0"))) == errno.ENOSYS  # MKDIR: anything else

    listing = payload(fs.handle(request(wire.READDIR, read_in(0, 4096))))
    names, pos = [], 0
    while pos < len(listing):
        _ino, _off, namelen, _kind = wire.DIRENT.unpack_from(listing, pos)
        names.append(listing[pos + 24 : pos + 24 + namelen])
        pos += (24 + namelen + 7) // 8 * 8
    assert names == [b".", b"..", b"ws"]
    assert payload(fs.handle(request(wire.READDIR, read_in(3, 4096)))) == b""  # past the last entry
    blocks = wire.STATFS_OUT.unpack(payload(fs.handle(request(wire.STATFS))))[0]
    assert blocks == 64


def test_node_ids_stay_across_detach_and_attach_and_travel_with_a_handoff(device: Device) -> None:
    fs = DeviceFS()
    fs.attach("ws", device)
    nodeid = lookup(fs, "ws")
    fs.detach("ws")
    assert error_of(fs.handle(request(wire.GETATTR, bytes(16), nodeid))) == errno.ENOENT
    assert error_of(fs.handle(request(wire.LOOKUP, b"ws\0"))) == errno.ENOENT
    fs.attach("ws", device)
    assert lookup(fs, "ws") == nodeid
    successor = DeviceFS(nodes=fs.nodes(), started_ns=fs.started_ns)
    successor.attach("ws", device)
    successor.attach("other", device)
    assert lookup(successor, "ws") == nodeid
    assert lookup(successor, "other") not in (nodeid, wire.ROOT_ID)


def test_a_failure_below_is_eio_never_a_wrong_byte(
    store: PolicyStore, device: Device, tmp_path: Path
) -> None:
    digest = device.manifest.lookup(2)
    assert digest is not None
    chunk = next((tmp_path / "store").rglob(digest[0]))
    chunk.write_bytes(chunks.encode(b"\x01" * 2 * BLOCK)[1])  # stored bytes that do not match the digest
    fs = DeviceFS()
    fs.attach("ws", device)
    nodeid = lookup(fs, "ws")
    assert error_of(fs.handle(request(wire.READ, read_in(2 * BLOCK, BLOCK), nodeid))) == errno.EIO
    too_far = wire.WRITE_IN.pack(0, 64 * BLOCK, BLOCK, 0, 0, 0, 0) + bytes(BLOCK)
    assert error_of(fs.handle(request(wire.WRITE, too_far, nodeid))) == errno.EIO


# -- a session on a real FUSE mount ------------------------------------------------------


def waits_on_fuse(tid: int) -> bool:
    """Whether thread `tid` sleeps in the kernel waiting for a FUSE reply."""
    try:
        return Path(f"/proc/self/task/{tid}/wchan").read_text() == "request_wait_answer"
    except FileNotFoundError:
        return False


@pytest.mark.root
def test_a_paused_session_keeps_requests_queued_and_another_serves_them(
    device: Device, tmp_path: Path
) -> None:
    needs_root_and_fuse()
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    fs = DeviceFS()
    fs.attach("ws", device)
    initialised = threading.Event()
    fd = mount_fuse(mountpoint)
    first = Session(fd, fs.handle, on_init=lambda _params: initialised.set())
    first.start()
    second: Session | None = None
    try:
        assert initialised.wait(10)
        path = mountpoint / "ws"
        with path.open("r+b", buffering=0) as handle:
            handle.seek(9 * BLOCK)
            handle.write(b"before")
        assert first.pause(10)
        result: list[bytes] = []
        tids: list[int] = []

        def read_it() -> None:
            tids.append(threading.get_native_id())
            with path.open("rb", buffering=0) as handle:
                handle.seek(2 * BLOCK)
                result.append(handle.read(BLOCK))

        reader = threading.Thread(target=read_it)
        reader.start()
        deadline = time.monotonic() + 10
        while not (tids and waits_on_fuse(tids[0])):  # the kernel holds it: nobody reads /dev/fuse
            assert time.monotonic() < deadline, "the read never reached the kernel's queue"
            time.sleep(0.02)
        assert not result
        # Another session on the same connection (as a new daemon gets it) answers it, with
        # the parameters the first one negotiated: the kernel does not send INIT again.
        assert first.params is not None
        second = Session(os.dup(fd), fs.handle, params=first.params)
        second.start()
        reader.join(10)
        assert result == [bytes([7]) * BLOCK]
        assert path.read_bytes()[9 * BLOCK : 9 * BLOCK + 6] == b"before"
    finally:
        unmount(mountpoint, lazy=True)
        for session in (first, second):
            if session is not None:
                session.close()
