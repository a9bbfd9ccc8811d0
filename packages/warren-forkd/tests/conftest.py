"""Fixtures: one template, one cold-booted parent and its snapshot, shared by the session."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from warren_forkd import snapshot, template


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
