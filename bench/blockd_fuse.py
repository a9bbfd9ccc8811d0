"""warren-blockd's FUSE loop against the libfuse path it replaced (mfusepy), in one run.

    python bench/blockd_fuse.py --work DIR [--out bench/results/blockd-fuse.json]

Run it through `make bench-blockd-fuse` (as root: FUSE, loop devices). Both arms serve the
same kind of workspace (a real Device over a local store, its writes sealed and replicated
as in the daemon) from this process, one FUSE file behind a loop device with direct I/O, as
the daemon does; only the FUSE transport differs: Warren's own loop (fuse_session.py with
fusefs.DeviceFS) or mfusepy over libfuse 3 with the handlers the daemon used before. The arms
alternate, ROUNDS times each, and the median of each figure is kept:

  seq_write_mib_s     1 MiB O_DIRECT writes to the loop device, then fsync
  seq_read_mib_s      1 MiB O_DIRECT reads of what was written
  rand_read_4k_iops   4 KiB O_DIRECT reads at random block offsets (warm)
  rand_write_4k_iops  4 KiB O_DIRECT writes at random block offsets, fsync every 64

`ratio` is Warren's loop over mfusepy for each figure (above 1: faster). A handoff's pause is
measured by the blockd tier's own logs (`paused_ms`), not here.
"""

from __future__ import annotations

import argparse
import errno
import json
import mmap
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.cache import ChunkCache
from warren_blockd.device import Device
from warren_blockd.fuse_session import Session, mount_fuse, unmount
from warren_blockd.fusefs import DeviceFS
from warren_blockd.replicator import Replicator
from warren_blockd.workspace import Workspace

MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
SIZE = 1 << 30
SEQ_BYTES = 256 * MIB
RANDOM_OPS = 4000
ROUNDS = 3


def device(work: Path) -> tuple[Device, Replicator]:
    store = PolicyStore(LocalDriver(work / "store"))
    ws = Workspace(store, "ws")
    ws.create(SIZE // 4096)
    manifest = ws.effective()
    replicator = Replicator(ws, work / "spool", 4 << 30, manifest.log_seq + 1, start=False)
    dev = Device(manifest, ChunkCache(work / "cache", store), replicator, work / "dirty.img")
    replicator.start()
    return dev, replicator


@contextmanager
def served_by_warren(dev: Device, mountpoint: Path) -> Iterator[Path]:
    fs = DeviceFS()
    fs.attach("ws", dev)
    ready = threading.Event()
    session = Session(mount_fuse(mountpoint), fs.handle, on_init=lambda _params: ready.set())
    session.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the kernel did not initialise the FUSE mount")
        yield mountpoint / "ws"
    finally:
        unmount(mountpoint, lazy=True)
        session.close()


@contextmanager
def served_by_mfusepy(dev: Device, mountpoint: Path) -> Iterator[Path]:
    import mfusepy

    class Ops(mfusepy.Operations):  # type: ignore[misc]  # the daemon's handlers before its own loop
        use_ns = True

        def __init__(self) -> None:
            self.started = time.time_ns()

        def _check(self, path: str) -> None:
            if path != "/ws":
                raise mfusepy.FuseOSError(errno.ENOENT)

        def getattr(self, path: str, fh: int | None = None) -> dict[str, int]:
            times = {"st_atime": self.started, "st_mtime": self.started, "st_ctime": self.started}
            if path == "/":
                return {"st_mode": 0o40700, "st_nlink": 2, **times}
            self._check(path)
            return {"st_mode": 0o100600, "st_nlink": 1, "st_size": dev.size, **times}

        def readdir(self, path: str, fh: int) -> list[str]:
            return [".", "..", "ws"]

        def open(self, path: str, flags: int) -> int:
            self._check(path)
            return 0

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            try:
                return dev.read(offset, size)
            except (OSError, ValueError):
                raise mfusepy.FuseOSError(errno.EIO) from None

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            try:
                return dev.write(offset, bytes(data))
            except (OSError, ValueError):
                raise mfusepy.FuseOSError(errno.EIO) from None

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            dev.flush()
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            return 0

    thread = threading.Thread(
        target=lambda: mfusepy.FUSE(
            Ops(), str(mountpoint), foreground=True, nothreads=False, fsname="warren-blockd-bench"
        ),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 30
    while not os.path.ismount(mountpoint):
        if time.monotonic() > deadline:
            raise RuntimeError("mfusepy did not mount")
        time.sleep(0.05)
    try:
        yield mountpoint / "ws"
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False)
        thread.join(10)


@contextmanager
def loop_device(backing: Path) -> Iterator[str]:
    name = subprocess.run(
        ["losetup", "--find", "--show", "--direct-io=on", str(backing)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        yield name
    finally:
        subprocess.run(["losetup", "-d", name], check=False)


def measure(loop: str) -> dict[str, float]:
    buf = mmap.mmap(-1, MIB)  # page-aligned, as O_DIRECT needs
    buf.write(os.urandom(MIB))
    small = mmap.mmap(-1, 4096)
    small.write(os.urandom(4096))
    rng = random.Random(11)
    figures: dict[str, float] = {}
    fd = os.open(loop, os.O_RDWR | os.O_DIRECT)
    try:
        start = time.perf_counter()
        for offset in range(0, SEQ_BYTES, MIB):
            os.pwritev(fd, [buf], offset)
        os.fsync(fd)
        figures["seq_write_mib_s"] = SEQ_BYTES / MIB / (time.perf_counter() - start)
        start = time.perf_counter()
        for offset in range(0, SEQ_BYTES, MIB):
            os.preadv(fd, [buf], offset)
        figures["seq_read_mib_s"] = SEQ_BYTES / MIB / (time.perf_counter() - start)
        blocks = SEQ_BYTES // 4096
        start = time.perf_counter()
        for _ in range(RANDOM_OPS):
            os.preadv(fd, [small], rng.randrange(blocks) * 4096)
        figures["rand_read_4k_iops"] = RANDOM_OPS / (time.perf_counter() - start)
        start = time.perf_counter()
        for i in range(RANDOM_OPS):
            os.pwritev(fd, [small], rng.randrange(blocks) * 4096)
            if i % 64 == 63:
                os.fsync(fd)
        os.fsync(fd)
        figures["rand_write_4k_iops"] = RANDOM_OPS / (time.perf_counter() - start)
    finally:
        os.close(fd)
    return figures


def one_round(arm: Callable[[Device, Path], Any], work: Path) -> dict[str, float]:
    work.mkdir(parents=True)
    mountpoint = work / "mnt"
    mountpoint.mkdir()
    dev, replicator = device(work)
    try:
        with arm(dev, mountpoint) as backing, loop_device(backing) as loop:
            return measure(loop)
    finally:
        replicator.close(timeout=120)
        dev.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "blockd-fuse.json")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="blockd-fuse-bench-"))
    arms = {"warren": served_by_warren, "mfusepy": served_by_mfusepy}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for round_ in range(ROUNDS):
        for name, arm in arms.items():
            runs[name].append(one_round(arm, work / f"{name}-{round_}"))
            print(name, {k: round(v, 1) for k, v in runs[name][-1].items()}, flush=True)
    medians = {
        name: {key: round(statistics.median(r[key] for r in results), 1) for key in results[0]}
        for name, results in runs.items()
    }
    result = {
        "rounds": ROUNDS,
        "seq_bytes": SEQ_BYTES,
        "random_ops": RANDOM_OPS,
        **medians,
        "ratio": {
            key: round(medians["warren"][key] / medians["mfusepy"][key], 2) for key in medians["warren"]
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
