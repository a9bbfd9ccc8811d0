"""QEMU microVMs: the command line, the process, its QMP session and its memory footprint."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from qemu.qmp import QMPClient

from warren_forkd.errors import QemuError
from warren_forkd.template import Template

QEMU = "qemu-system-x86_64"
AGENT_PORT = "org.warren.agent"


def accel() -> str:
    """TCG unless told otherwise: on nested hosts /dev/kvm opens but guests never run."""
    return os.environ.get("WARREN_FORKD_ACCEL", "tcg")


@dataclass(frozen=True)
class VmConfig:
    template: Template
    workdir: Path  # sockets, console log and the VM's disk overlay live here
    mem_file: Path
    # The parent maps its RAM file shared, so guest memory is the file itself; a child maps the
    # snapshot's file private: pages are read from the shared page cache and copied on write.
    share: bool
    disk: Path  # a qcow2 overlay over the template's base disk
    vmgenid: str
    incoming: bool = False  # a child: wait for device state over QMP instead of booting

    @property
    def qmp_socket(self) -> Path:
        return self.workdir / "qmp.sock"

    @property
    def agent_socket(self) -> Path:
        return self.workdir / "agent.sock"


def command(cfg: VmConfig) -> list[str]:
    tpl = cfg.template
    mem = f"{tpl.mem_mib}M"
    share = "on" if cfg.share else "off"
    cmd = [
        QEMU,
        "-M", "microvm,memory-backend=mem",
        "-accel", accel(),
        "-cpu", "max",
        "-smp", "1",
        "-m", mem,
        "-object", f"memory-backend-file,id=mem,size={mem},mem-path={cfg.mem_file},share={share}",
        "-nodefaults", "-no-user-config", "-display", "none",
        "-serial", f"file:{cfg.workdir / 'console.log'}",
        "-kernel", str(tpl.kernel),
        "-initrd", str(tpl.initramfs),
        "-append", kernel_args(tpl),
        "-device", "virtio-serial-device",
        "-chardev", f"socket,id=agent,path={cfg.agent_socket},server=on,wait=off",
        "-device", f"virtserialport,chardev=agent,name={AGENT_PORT}",
        "-drive", f"file={cfg.disk},if=none,id=disk,format=qcow2",
        "-device", "virtio-blk-device,drive=disk",
        # Realizes on microvm but microvm's ACPI tables do not describe it, so the guest never
        # sees it (see NOTES.md); kept so the identity is carried once the machine supports it.
        "-device", f"vmgenid,guid={cfg.vmgenid}",
        "-qmp", f"unix:{cfg.qmp_socket}",
    ]  # fmt: skip
    if cfg.incoming:
        cmd += ["-incoming", "defer"]
    return cmd


def host_tsc_khz() -> int:
    """The host's TSC rate, which is also the rate a TCG guest's TSC runs at."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return round(float(line.split(":")[1]) * 1000)
    raise QemuError("no 'cpu MHz' in /proc/cpuinfo")


def kernel_args(tpl: Template) -> str:
    # Under TCG the kernel's TSC calibration against the PIT fails whenever the host is busy, and
    # the guest then hangs in early boot: tell it the rate instead.
    return tpl.cmdline + (f" tsc_early_khz={host_tsc_khz()}" if accel() == "tcg" else "")


def pss_kib(pid: int) -> int:
    """Proportional set size: pages shared with other processes are split between them."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise QemuError(f"no Pss in /proc/{pid}/smaps_rollup")


class Vm:
    """A running QEMU process and its QMP session (QEMU connects to a socket we serve)."""

    def __init__(self, cfg: VmConfig, proc: asyncio.subprocess.Process, qmp: QMPClient) -> None:
        self.cfg = cfg
        self.proc = proc
        self.qmp = qmp

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    async def launch(cls, cfg: VmConfig, timeout: float = 30.0) -> Vm:
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        qmp = QMPClient(cfg.workdir.name)
        await qmp.start_server(str(cfg.qmp_socket))
        log = (cfg.workdir / "qemu.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            *command(cfg), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log
        )
        log.close()
        # For whoever cleans up after a crash (the daemon at start): which process this VM is.
        (cfg.workdir / "qemu.pid").write_text(f"{proc.pid}\n")
        vm = cls(cfg, proc, qmp)
        try:
            async with asyncio.timeout(timeout):
                accept = asyncio.ensure_future(qmp.accept())
                exited = asyncio.ensure_future(proc.wait())
                done, _ = await asyncio.wait({accept, exited}, return_when=asyncio.FIRST_COMPLETED)
                if accept not in done:
                    accept.cancel()
                    raise QemuError(f"QEMU exited at start: {vm.log_tail()}")
                exited.cancel()
                await accept
        except BaseException:
            await vm.kill()
            raise
        return vm

    def log_tail(self) -> str:
        text = (self.cfg.workdir / "qemu.log").read_text(errors="replace")
        return text[-2000:] or f"(empty log; command: {shlex.join(command(self.cfg))})"

    async def execute(self, cmd: str, args: dict[str, object] | None = None) -> object:
        return await self.qmp.execute(cmd, args)

    async def query(self, cmd: str) -> dict[str, object]:
        info = await self.qmp.execute(cmd)
        if not isinstance(info, dict):
            raise QemuError(f"{cmd} answered {info!r}")
        return info

    async def set_ignore_shared(self) -> None:
        # Shared, file-backed RAM is left out of the migration stream: the file already holds it.
        caps = [{"capability": "x-ignore-shared", "state": True}]
        await self.execute("migrate-set-capabilities", {"capabilities": caps})

    async def wait_migration(self, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while True:
                info = await self.query("query-migrate")
                status = info.get("status")
                if status == "completed":
                    return
                if status in ("failed", "cancelled"):
                    raise QemuError(f"migration {status}: {info.get('error-desc', '')} {self.log_tail()}")
                await asyncio.sleep(0.005)

    async def wait_status(self, wanted: set[str], timeout: float = 60.0) -> str:
        async with asyncio.timeout(timeout):
            while True:
                if self.proc.returncode is not None:
                    raise QemuError(f"QEMU exited: {self.log_tail()}")
                info = await self.query("query-status")
                if (status := str(info["status"])) in wanted:
                    return status
                await asyncio.sleep(0.005)

    def pss_kib(self) -> int:
        return pss_kib(self.pid)

    async def kill(self) -> None:
        """Stop QEMU by its pid (SIGKILL: nothing in a throwaway VM needs a clean shutdown)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        with contextlib.suppress(Exception):
            await self.qmp.disconnect()
