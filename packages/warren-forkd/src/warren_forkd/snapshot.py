"""Cold boot, snapshot and branch: the mechanics forkd's API will expose."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from warren_forkd.agent import Agent
from warren_forkd.errors import GenerationMismatchError
from warren_forkd.qemu import Vm, VmConfig
from warren_forkd.template import Template, disk_generation


def _ms_since(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 1)


def _overlay(path: Path, backing: Path, backing_format: str) -> None:
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", backing_format, "-b", str(backing), str(path)],
        check=True,
    )


@dataclass
class Running:
    vm: Vm
    agent: Agent
    ready_ms: float  # launch to agent-ready (for a child: after its reseed, ready for workload)

    async def stop(self) -> None:
        await self.agent.close()
        await self.vm.kill()


async def boot(tpl: Template, workdir: Path) -> Running:
    """Cold-boot the template; its RAM is a shared file so it can become a snapshot."""
    workdir.mkdir(parents=True, exist_ok=True)
    disk = workdir / "disk.qcow2"
    _overlay(disk, tpl.disk, "raw")
    cfg = VmConfig(tpl, workdir, workdir / "memory", share=True, disk=disk, vmgenid=str(uuid.uuid4()))
    start = time.monotonic()
    vm = await Vm.launch(cfg)
    try:
        agent = await Agent.connect(cfg.agent_socket, timeout=30)
        await agent.ping(timeout=120)
    except BaseException:
        await vm.kill()
        raise
    return Running(vm, agent, _ms_since(start))


@dataclass(frozen=True)
class Snapshot:
    directory: Path
    template: Template
    disk_generation: str  # of the base disk the guest ran over: its page cache describes it

    @property
    def memory(self) -> Path:
        return self.directory / "memory"

    @property
    def state(self) -> Path:
        return self.directory / "state"

    @property
    def disk(self) -> Path:
        return self.directory / "disk.qcow2"  # the parent's overlay, frozen: children stack on it

    @property
    def id(self) -> str:
        return self.directory.name

    def save(self) -> None:
        meta = {"template": self.template.name, "disk_generation": self.disk_generation}
        (self.directory / "snapshot.json").write_text(json.dumps(meta, indent=2) + "\n")
        self.template.save(self.directory / "template.json")

    @classmethod
    def load(cls, directory: Path) -> Snapshot:
        meta = json.loads((directory / "snapshot.json").read_text())
        return cls(directory, Template.load(directory / "template.json"), meta["disk_generation"])


async def snapshot(parent: Running, directory: Path) -> Snapshot:
    """Pause the parent and save its device state; its RAM file becomes the snapshot's memory.

    The parent stays paused and must never run again: its shared mapping would write into the
    file every child maps. Stop it once its children no longer need it measured.
    """
    cfg = parent.vm.cfg
    directory.mkdir(parents=True)
    snap = Snapshot(directory, cfg.template, disk_generation(cfg.template.disk))
    await parent.vm.execute("stop")
    await parent.vm.set_ignore_shared()
    await parent.vm.execute("migrate", {"uri": f"exec:cat > {shlex.quote(str(snap.state))}"})
    await parent.vm.wait_migration()
    # Same inodes, no copy: the guest RAM is already in the file.
    os.link(cfg.mem_file, snap.memory)
    os.link(cfg.disk, snap.disk)
    snap.save()
    return snap


def check_generation(snap: Snapshot, base_disk: Path) -> None:
    found = disk_generation(base_disk)
    if found != snap.disk_generation:
        raise GenerationMismatchError(snap.id, snap.disk_generation, found)


async def restore(snap: Snapshot, workdir: Path, name: str) -> Running:
    """One child: private copy-on-write RAM, its own overlay disk, fresh entropy and identity.

    Refused before anything starts if the base disk no longer has the snapshot's generation.
    """
    check_generation(snap, snap.template.disk)
    return await _restore(snap, workdir, name)


async def _restore(snap: Snapshot, workdir: Path, name: str) -> Running:
    workdir.mkdir(parents=True)
    disk = workdir / "disk.qcow2"
    # The chain is child -> snapshot layer -> base; the layer names the base it was made on.
    _overlay(disk, snap.disk, "qcow2")
    cfg = VmConfig(
        snap.template, workdir, snap.memory, share=False, disk=disk, vmgenid=str(uuid.uuid4()), incoming=True
    )
    start = time.monotonic()
    vm = await Vm.launch(cfg)
    try:
        await vm.set_ignore_shared()
        await vm.execute("migrate-incoming", {"uri": f"exec:cat {shlex.quote(str(snap.state))}"})
        # The parent was paused when saved, so the child comes up paused too.
        if await vm.wait_status({"paused", "running"}) == "paused":
            await vm.execute("cont")
        agent = await Agent.connect(cfg.agent_socket, timeout=30)
        await agent.ping()
        await agent.fork(os.urandom(64), name, uuid.uuid4().hex, cfg.vmgenid)
    except BaseException:
        await vm.kill()
        raise
    return Running(vm, agent, _ms_since(start))


async def restore_each(snap: Snapshot, children: list[tuple[Path, str]]) -> list[Running | Exception]:
    """Start one child per (workdir, name) concurrently, each succeeding or failing on its own.

    The caller checks the disk generation once for the batch (hashing is the costly part).
    """
    tasks = [asyncio.ensure_future(_restore(snap, workdir, name)) for workdir, name in children]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    out: list[Running | Exception] = []
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            # Cancelled or interrupted: not a child's own failure; leave no child running.
            await stop_all([r for r in results if isinstance(r, Running)])
            raise result
        out.append(result)
    return out


async def branch(snap: Snapshot, root: Path, n: int) -> list[Running]:
    """Start n children from one snapshot concurrently; if any fails, none is left running."""
    check_generation(snap, snap.template.disk)  # once for the batch: hashing is the costly part
    results = await restore_each(snap, [(root / f"child-{i}", f"child-{i}") for i in range(n)])
    children = [r for r in results if isinstance(r, Running)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        await asyncio.gather(*(c.stop() for c in children))
        raise errors[0]
    return children


async def stop_all(vms: list[Running]) -> None:
    await asyncio.gather(*(vm.stop() for vm in vms))
