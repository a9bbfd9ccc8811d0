"""Fixtures: one template, one cold-booted parent and its snapshot, shared by the session; and a
running daemon for the API tests."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from warren_forkd import snapshot, template
from warren_forkd.client import Client


@dataclass
class Forked:
    loop: asyncio.AbstractEventLoop
    parent: snapshot.Running
    snap: snapshot.Snapshot
    parent_pss_kib: int
    root: Path


@pytest.fixture(scope="session")
def forked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forked]:
    """A real QEMU parent (TCG here), booted from a fresh template and snapshotted, kept paused."""
    root = tmp_path_factory.mktemp("forkd")
    loop = asyncio.new_event_loop()
    tpl = template.build(root / "template", mem_mib=256)
    parent = loop.run_until_complete(snapshot.boot(tpl, root / "parent"))
    try:
        snap = loop.run_until_complete(snapshot.snapshot(parent, root / "snapshot"))
        yield Forked(loop, parent, snap, parent.vm.pss_kib(), root)
    finally:
        loop.run_until_complete(parent.stop())
        loop.close()


SERVE = [sys.executable, "-m", "warren_forkd", "serve"]


class Daemon:
    """`warren-forkd serve` as its own process, driven through its unix socket only."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state_dir = root / "state"
        self.log = root / "daemon.log"
        sock = root / "api.sock"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [*SERVE, "--socket", str(sock), "--state-dir", str(self.state_dir)],
                stdout=log,
                stderr=log,
            )
        self.client = Client(str(sock), timeout=300)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.get("/healthz")
                return
            except (FileNotFoundError, ConnectionRefusedError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"daemon did not start: {self.log.read_text()}") from None
                time.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM, as an init system stops it: the daemon kills its own VMs on the way out."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    running = Daemon(tmp_path_factory.mktemp("forkd-daemon"))
    try:
        yield running.client
    finally:
        assert running.stop() == 0, running.log.read_text()[-3000:]
