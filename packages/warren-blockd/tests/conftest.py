"""Fixtures: a real SeaweedFS for the integration tests (started here, stopped after)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from warren_blockd import loopdev
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.csi import mounts
from warren_blockd.testing import BlockdProcess, Weed, make_bucket


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """What a test needs follows from its fixtures: a running daemon needs root, SeaweedFS
    is a service, so `make check` (no root, no services) can leave them out by marker."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "blockd_factory" in fixtures:
            item.add_marker(pytest.mark.root)
        if "seaweedfs" in fixtures:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The S3 endpoint of a `weed mini` serving from a temporary directory."""
    weed = Weed(tmp_path_factory.mktemp("seaweedfs"))
    weed.start()
    yield weed.endpoint
    weed.stop()


@pytest.fixture
def bucket(seaweedfs: str) -> str:
    return make_bucket(seaweedfs)


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])
def store(request: pytest.FixtureRequest, local_root: Path) -> PolicyStore:
    """A workspace store: local files always, a real SeaweedFS in the integration tier."""
    if request.param == "local":
        return PolicyStore(LocalDriver(local_root))
    from warren_blockd.blobs.s3 import S3Driver

    endpoint = request.getfixturevalue("seaweedfs")
    bucket = request.getfixturevalue("bucket")
    return PolicyStore(S3Driver(bucket, endpoint=endpoint, access_key="any", secret_key="any", timeout=30))


def loop_mount_missing() -> str | None:
    """Why a loop mount cannot be tried here, or None."""
    if os.geteuid() != 0:
        return "needs root to mount a loop device"
    if not Path("/dev/loop-control").exists():
        return "needs loop devices (/dev/loop-control is missing)"
    if not all(shutil.which(tool) for tool in ("mount", "umount", "fsfreeze", "cp")):
        return "needs mount, umount, fsfreeze and cp"
    return None


@contextmanager
def loop_mounted(image: Path, target: Path) -> Iterator[None]:
    """The image file mounted on a loop device at `target` (which must exist) for the body.
    After it, `image` holds what the kernel wrote, its journal checkpointed, and nothing
    writes it any more.

    `umount` alone promises neither: a process that makes a mount namespace while the mount
    is up (another tier's unshare, mmdebstrap, a container) copies it, and the file system
    outlives our umount. Its journal is then not checkpointed, so the image's own metadata
    lags (fsync'd files missing), and it writes the image again when that namespace ends.
    Freezing flushes the journal into place; the copy taken while frozen replaces `image`,
    so any later write lands in the old, unlinked file.
    """
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(target)], check=False, capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mount -o loop failed here: {mounted.stderr.strip()}")
    frozen = image.with_name(f"{image.name}.frozen")
    try:
        yield
        subprocess.run(["fsfreeze", "--freeze", str(target)], check=True)
        try:
            subprocess.run(["cp", "--sparse=always", str(image), str(frozen)], check=True)
        finally:
            subprocess.run(["fsfreeze", "--unfreeze", str(target)], check=True)
    finally:
        subprocess.run(["umount", str(target)], check=True)
    frozen.replace(image)


def needs_root_and_fuse() -> None:
    # CI runs these tiers on purpose: there a missing prerequisite fails instead of skipping.
    give_up = pytest.fail if os.environ.get("CI") else pytest.skip
    if os.geteuid() != 0:
        give_up("needs root: the daemon mounts FUSE, attaches loop devices and mounts ext4")
    if not Path("/dev/fuse").exists():
        give_up("needs /dev/fuse (the daemon mounts and serves FUSE itself)")


@pytest.fixture
def blockd_factory(tmp_path: Path) -> Iterator[Callable[..., BlockdProcess]]:
    """Start daemons against a store; every one is stopped (and its mounts cleaned) after."""
    needs_root_and_fuse()
    started: list[BlockdProcess] = []

    def start(
        store: str, endpoint: str | None = None, *extra: str, name: str = "node", **options: Any
    ) -> BlockdProcess:
        daemon = BlockdProcess(tmp_path / name, store, endpoint, *extra, **options)
        started.append(daemon)
        return daemon

    yield start
    for daemon in reversed(started):
        daemon.stop()
    # A killed daemon (or one whose unmount failed) leaves mounts behind. The ext4 ones go
    # first, deepest first: the kernel then detaches their loop devices (autoclear). A device
    # still bound to a file of this test is detached next, while the FUSE mount under it is
    # still in the tree (only then does its backing file read as under tmp_path); the FUSE
    # mounts last.
    ours = [e for e in mounts.parse(mounts.MOUNTINFO.read_text()) if e.mount_point.startswith(f"{tmp_path}/")]
    fuse = [e.mount_point for e in ours if e.fstype.startswith("fuse")]
    for target in sorted((e.mount_point for e in ours if e.mount_point not in fuse), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    for device, _ in loopdev.backed_under(tmp_path):
        subprocess.run(["losetup", "-d", device], check=False, capture_output=True)
    for target in fuse:
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


Blockd = BlockdProcess  # the name the tests use
__all__ = ["Blockd", "Weed", "make_bucket"]


_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI every tier here must run: a skipped test fails the session."""
    if os.environ.get("CI") and _skipped:
        print(f"\nCI=true and {len(_skipped)} test(s) skipped: {', '.join(_skipped)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
