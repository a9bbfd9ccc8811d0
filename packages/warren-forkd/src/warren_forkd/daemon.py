"""The daemon: templates, snapshots and VMs, all driven from one asyncio loop in its own thread.

State on node disk (`state_dir`):
  templates/<name>/   template.json (and, for a built template, its initramfs and base disk)
  snapshots/<id>/     memory, state, disk.qcow2, snapshot.json, template.json
  vms/<id>/           a live VM: sockets, console.log, qemu.log, qemu.pid, its overlay
Templates and snapshots survive a restart; VMs do not (QEMU runs as the daemon's child):
VMs left by a previous run are killed and their directories removed at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import shutil
import signal
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from warren_forkd import metrics, snapshot, template
from warren_forkd.errors import AgentError, ForkdError, RequestError
from warren_forkd.qemu import accel
from warren_forkd.template import Template

log = logging.getLogger("warren_forkd.daemon")
T = TypeVar("T")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ID_RULE = "1 to 63 lowercase letters, digits and '-', starting with a letter or digit"
MAX_CHILDREN = 64
MIN_MEM_MIB = 64


def check_id(kind: str, value: object) -> str:
    if not isinstance(value, str) or not ID_RE.match(value):
        raise RequestError("invalid_id", f"{kind} id {value!r} is invalid", f"use {ID_RULE}")
    return value


def _tail(path: Path, chars: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class VmRecord:
    id: str
    template: str
    workdir: Path
    state: str
    branched_from: str | None = None  # the snapshot a child was restored from
    snapshot_id: str | None = None  # the snapshot taken of this VM (it is then paused for good)
    running: snapshot.Running | None = None
    ready_ms: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one agent request at a time

    def describe(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "template": self.template,
            "state": self.state,
            "branched_from": self.branched_from,
            "snapshot": self.snapshot_id,
            "ready_ms": self.ready_ms,
            "pid": None,
            "pss_mib": None,
        }
        if self.running is not None and self.running.vm.proc.returncode is None:
            doc["pid"] = self.running.vm.pid
            with contextlib.suppress(OSError, ForkdError):
                doc["pss_mib"] = round(self.running.vm.pss_kib() / 1024, 1)
        return doc

    def live(self) -> snapshot.Running:
        if self.running is None or self.state != "running":
            raise RequestError(
                "wrong_state",
                f"VM {self.id} is {self.state}, not running",
                "a snapshotted VM stays paused for good (its children share its memory file): "
                "branch its snapshot instead; otherwise wait for the VM to be running",
            )
        return self.running


def describe_template(tpl: Template) -> dict[str, Any]:
    return {
        "name": tpl.name,
        "kernel": str(tpl.kernel),
        "initramfs": str(tpl.initramfs),
        "disk": str(tpl.disk),
        "cmdline": tpl.cmdline,
        "mem_mib": tpl.mem_mib,
    }


def describe_snapshot(snap: snapshot.Snapshot) -> dict[str, Any]:
    return {"id": snap.id, "template": snap.template.name, "disk_generation": snap.disk_generation}


class Daemon:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.templates_dir = state_dir / "templates"
        self.snapshots_dir = state_dir / "snapshots"
        self.vms_dir = state_dir / "vms"
        self.templates: dict[str, Template] = {}
        self.snapshots: dict[str, snapshot.Snapshot] = {}
        self.vms: dict[str, VmRecord] = {}
        self._reserved: set[str] = set()  # template and snapshot names being built
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="vms", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        for directory in (self.templates_dir, self.snapshots_dir, self.vms_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.clean_stale()
        for path in sorted(self.templates_dir.glob("*/template.json")):
            tpl = Template.load(path)
            self.templates[tpl.name] = tpl
        for path in sorted(self.snapshots_dir.glob("*/snapshot.json")):
            snap = snapshot.Snapshot.load(path.parent)
            self.snapshots[snap.id] = snap
        metrics.TEMPLATES.set(len(self.templates))
        metrics.SNAPSHOTS.set(len(self.snapshots))
        metrics.count_states([])
        self._thread.start()

    def clean_stale(self) -> None:
        """Kill the QEMUs a previous run left (by pid, only if its command line names the VM's
        directory) and remove their directories."""
        for workdir in sorted(self.vms_dir.iterdir()):
            with contextlib.suppress(OSError, ValueError):
                pid = int((workdir / "qemu.pid").read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if str(workdir).encode() in cmdline:
                    os.kill(pid, signal.SIGKILL)
                    log.info("killed a VM left by a previous run", extra={"fields": {"pid": pid}})
            shutil.rmtree(workdir, ignore_errors=True)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the daemon's loop from a request thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.call(self._drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.clean_stale()  # any QEMU a cancelled boot or branch could not stop itself

    async def _drain(self) -> None:
        """Cancel requests in flight (boots and restores kill their QEMU when cancelled), then
        stop every VM."""
        current = asyncio.current_task()
        pending = [task for task in asyncio.all_tasks() if task is not current]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        await self.stop_all()

    async def stop_all(self) -> None:
        await asyncio.gather(*(self._stop(rec) for rec in list(self.vms.values()) if rec.running))

    # -- lookups -----------------------------------------------------------------------------

    def _template(self, name: object) -> Template:
        if not isinstance(name, str) or name not in self.templates:
            raise RequestError(
                "not_found", f"no template {name!r}", "register it first with POST /v1/templates"
            )
        return self.templates[name]

    def _vm(self, vm_id: str) -> VmRecord:
        if vm_id not in self.vms:
            raise RequestError("not_found", f"no VM {vm_id!r}", "GET /v1/vms lists the VMs this daemon holds")
        return self.vms[vm_id]

    def _snapshot(self, snap_id: str) -> snapshot.Snapshot:
        if snap_id not in self.snapshots:
            raise RequestError(
                "not_found",
                f"no snapshot {snap_id!r}",
                "GET /v1/snapshots lists them; POST /v1/vms/<id>/snapshot takes one",
            )
        return self.snapshots[snap_id]

    def _new_vm_id(self, wanted: object) -> str:
        vm_id = check_id("VM", wanted) if wanted is not None else f"vm-{secrets.token_hex(4)}"
        if vm_id in self.vms or (self.vms_dir / vm_id).exists():
            raise RequestError("exists", f"VM {vm_id!r} already exists", "choose another id or stop it first")
        return vm_id

    def _counted(self) -> None:
        metrics.count_states([rec.state for rec in self.vms.values()])

    # -- reads -------------------------------------------------------------------------------

    async def list_templates(self) -> list[dict[str, Any]]:
        return [describe_template(t) for t in self.templates.values()]

    async def list_snapshots(self) -> list[dict[str, Any]]:
        return [describe_snapshot(s) for s in self.snapshots.values()]

    async def list_vms(self) -> list[dict[str, Any]]:
        return [rec.describe() for rec in self.vms.values()]

    async def get_vm(self, vm_id: str) -> dict[str, Any]:
        return self._vm(vm_id).describe()

    async def info(self) -> dict[str, Any]:
        return {"accelerator": accel(), "cpus": os.cpu_count(), "state_dir": str(self.state_dir)}

    # -- templates ---------------------------------------------------------------------------

    async def add_template(self, body: dict[str, Any]) -> dict[str, Any]:
        name = check_id("template", body.get("name"))
        if name in self.templates or name in self._reserved:
            raise RequestError("exists", f"template {name!r} already exists", "choose another name")
        mem_mib = body.get("mem_mib", 256)
        if not isinstance(mem_mib, int) or mem_mib < MIN_MEM_MIB:
            raise RequestError(
                "bad_request", f"mem_mib {mem_mib!r} is invalid", f"give an integer >= {MIN_MEM_MIB}"
            )
        cmdline = body.get("cmdline", template.CMDLINE)
        if not isinstance(cmdline, str):
            raise RequestError("bad_request", "cmdline must be a string", "give the kernel's boot arguments")
        paths = {key: body.get(key) for key in ("kernel", "initramfs", "disk")}
        directory = self.templates_dir / name
        self._reserved.add(name)
        try:
            if all(v is None for v in paths.values()):
                # Build the default template: Debian's kernel, busybox and the agent, a small ext4 disk.
                built = await asyncio.to_thread(template.build, directory, name, mem_mib)
                tpl = Template(name, built.kernel, built.initramfs, built.disk, cmdline, mem_mib)
            else:
                tpl = Template(name, *self._paths(paths), cmdline, mem_mib)
                directory.mkdir(parents=True, exist_ok=True)
            tpl.save(directory / "template.json")
        finally:
            self._reserved.discard(name)
        self.templates[name] = tpl
        metrics.TEMPLATES.set(len(self.templates))
        log.info("template added", extra={"fields": describe_template(tpl)})
        return describe_template(tpl)

    @staticmethod
    def _paths(paths: dict[str, object]) -> tuple[Path, Path, Path]:
        missing = [k for k, v in paths.items() if not isinstance(v, str) or not v]
        if missing:
            raise RequestError(
                "bad_request",
                f"template paths incomplete: {', '.join(missing)} missing",
                "give all of kernel, initramfs and disk (absolute paths on this node), "
                "or none of them to build the default busybox template",
            )
        out = []
        for key, value in paths.items():
            path = Path(str(value))
            if not path.is_absolute() or not path.is_file():
                raise RequestError(
                    "bad_path",
                    f"{key} {value!r} is not a file on this node",
                    "give an absolute path to a file",
                )
            out.append(path)
        return out[0], out[1], out[2]

    # -- VMs ---------------------------------------------------------------------------------

    async def boot(self, body: dict[str, Any]) -> dict[str, Any]:
        tpl = self._template(body.get("template"))
        vm_id = self._new_vm_id(body.get("id"))
        rec = VmRecord(vm_id, tpl.name, self.vms_dir / vm_id, "booting")
        self.vms[vm_id] = rec
        self._counted()
        try:
            rec.running = await snapshot.boot(tpl, rec.workdir)
        except Exception as exc:
            console = _tail(rec.workdir / "console.log")
            self._forget(rec)
            raise RequestError(
                "boot_failed",
                f"VM {vm_id} did not boot: {exc}; console: {console!r}",
                "check the template's kernel, initramfs (it must run the Warren agent) and cmdline",
            ) from exc
        self._started(rec, rec.running)
        metrics.BOOT_SECONDS.observe(rec.running.ready_ms / 1000)
        log.info("booted", extra={"fields": {"vm": vm_id, "ready_ms": rec.ready_ms}})
        return rec.describe()

    def _started(self, rec: VmRecord, running: snapshot.Running) -> None:
        rec.running, rec.ready_ms, rec.state = running, running.ready_ms, "running"
        self._counted()

    def _forget(self, rec: VmRecord) -> None:
        self.vms.pop(rec.id, None)
        shutil.rmtree(rec.workdir, ignore_errors=True)
        self._counted()

    async def take_snapshot(self, vm_id: str, body: dict[str, Any]) -> dict[str, Any]:
        rec = self._vm(vm_id)
        if rec.branched_from is not None:
            raise RequestError(
                "not_snapshottable",
                f"VM {vm_id} was branched from snapshot {rec.branched_from}: its memory is a private "
                "copy-on-write mapping, not a file a snapshot can keep",
                "snapshot a cold-booted VM (POST /v1/vms), or branch the existing snapshot",
            )
        parent = rec.live()
        snap_id = check_id("snapshot", body["id"]) if "id" in body else f"snap-{secrets.token_hex(4)}"
        if snap_id in self.snapshots or (self.snapshots_dir / snap_id).exists():
            raise RequestError("exists", f"snapshot {snap_id!r} already exists", "choose another id")
        async with rec.lock:
            rec.state = "snapshotting"
            self._counted()
            start = time.monotonic()
            try:
                snap = await snapshot.snapshot(parent, self.snapshots_dir / snap_id)
            except Exception as exc:
                shutil.rmtree(self.snapshots_dir / snap_id, ignore_errors=True)
                with contextlib.suppress(Exception):
                    await parent.vm.execute("cont")
                rec.state = "running"
                self._counted()
                raise RequestError(
                    "snapshot_failed", f"snapshot of {vm_id} failed: {exc}", "see the VM's qemu.log"
                ) from exc
        seconds = time.monotonic() - start
        rec.state, rec.snapshot_id = "snapshotted", snap_id
        self.snapshots[snap_id] = snap
        self._counted()
        metrics.SNAPSHOTS.set(len(self.snapshots))
        metrics.SNAPSHOT_SECONDS.observe(seconds)
        log.info("snapshot taken", extra={"fields": {"vm": vm_id, "snapshot": snap_id}})
        return describe_snapshot(snap) | {"vm": vm_id, "snapshot_ms": round(seconds * 1000, 1)}

    async def branch(self, snap_id: str, body: dict[str, Any]) -> dict[str, Any]:
        snap = self._snapshot(snap_id)
        count = body.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_CHILDREN:
            raise RequestError(
                "bad_request", f"count {count!r} is invalid", f"give an integer from 1 to {MAX_CHILDREN}"
            )
        wanted = body.get("ids")
        if wanted is not None and (not isinstance(wanted, list) or len(wanted) != count):
            raise RequestError("bad_request", "ids must be a list of count ids", "give count ids or none")
        ids = (
            [self._new_vm_id(w) for w in wanted] if wanted else [self._new_vm_id(None) for _ in range(count)]
        )
        if len(set(ids)) != len(ids):
            raise RequestError("bad_request", "ids repeat", "give distinct ids")
        try:
            await asyncio.to_thread(snapshot.check_generation, snap, snap.template.disk)
        except FileNotFoundError as exc:
            raise RequestError(
                "disk_missing",
                f"the base disk of snapshot {snap_id} is gone: {exc.filename}",
                "restore the template's base disk at that path",
            ) from exc
        except Exception:
            metrics.REFUSED_GENERATIONS.inc()
            raise
        records = [
            VmRecord(i, snap.template.name, self.vms_dir / i, "restoring", branched_from=snap_id) for i in ids
        ]
        for rec in records:
            self.vms[rec.id] = rec
        self._counted()
        start = time.monotonic()
        results = await snapshot.restore_each(snap, [(rec.workdir, rec.id) for rec in records])
        seconds = time.monotonic() - start
        children: list[dict[str, Any]] = []
        for rec, result in zip(records, results, strict=True):
            if isinstance(result, snapshot.Running):
                self._started(rec, result)
                metrics.CHILD_SECONDS.observe(result.ready_ms / 1000)
                metrics.CHILDREN.labels("ok").inc()
                children.append({"id": rec.id, "ok": True, "ready_ms": result.ready_ms})
            else:
                console = _tail(rec.workdir / "qemu.log")
                self._forget(rec)
                metrics.CHILDREN.labels("failed").inc()
                children.append(
                    {
                        "id": rec.id,
                        "ok": False,
                        "error": "restore_failed",
                        "message": f"{type(result).__name__}: {result}; qemu: {console!r}",
                    }
                )
        metrics.BRANCH_SECONDS.observe(seconds)
        failed = sum(1 for c in children if not c["ok"])
        log.info("branched", extra={"fields": {"snapshot": snap_id, "count": count, "failed": failed}})
        return {
            "snapshot": snap_id,
            "children": children,
            "failed": failed,
            "branch_total_ms": round(seconds * 1000, 1),
        }

    async def exec(self, vm_id: str, body: dict[str, Any]) -> dict[str, Any]:
        rec = self._vm(vm_id)
        command = body.get("command")
        if not isinstance(command, str) or not command.strip():
            raise RequestError("bad_request", "command must be a non-empty string", "give a shell command")
        timeout = body.get("timeout", 60)
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise RequestError("bad_request", f"timeout {timeout!r} is invalid", "give seconds > 0")
        running = rec.live()
        async with rec.lock:
            try:
                result = await running.agent.run(command, timeout=float(timeout))
            except TimeoutError as exc:
                metrics.EXECS.labels("timeout").inc()
                raise RequestError(
                    "exec_timeout", f"no answer from {vm_id}'s agent in {timeout} s", "raise timeout"
                ) from exc
            except (AgentError, ConnectionError) as exc:
                metrics.EXECS.labels("agent_error").inc()
                raise RequestError(
                    "agent_error", f"{vm_id}'s agent failed: {exc}", "stop the VM; see its console.log"
                ) from exc
        metrics.EXECS.labels("ok").inc()
        return {"id": vm_id, "rc": result.rc, "output": result.output.decode(errors="replace")}

    async def stop(self, vm_id: str) -> dict[str, Any]:
        rec = self._vm(vm_id)
        if rec.state in ("booting", "restoring", "snapshotting", "stopping"):
            raise RequestError("busy", f"VM {vm_id} is {rec.state}", "retry once the operation is done")
        await self._stop(rec)
        return {"id": vm_id, "state": "stopped"}

    async def _stop(self, rec: VmRecord) -> None:
        rec.state = "stopping"
        self._counted()
        if rec.running is not None:
            await rec.running.stop()
        # A snapshotted parent's memory and disk stay: the snapshot holds hard links to them.
        self._forget(rec)
        log.info("stopped", extra={"fields": {"vm": rec.id}})
