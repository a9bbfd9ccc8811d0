"""Templates: a kernel, an initramfs holding the guest agent, a base disk and boot arguments."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from warren_forkd import initramfs, kernel

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: the guest's only userland
# quiet: the serial console is emulated byte by byte under TCG, so boot messages cost time.
CMDLINE = "console=ttyS0 quiet panic=-1 rdinit=/init"


@dataclass(frozen=True)
class Template:
    name: str
    kernel: Path  # an ELF vmlinux (PVH boot) or a bzImage
    initramfs: Path
    disk: Path  # raw ext4; never written once built, every VM runs on an overlay over it
    cmdline: str
    mem_mib: int

    def save(self, path: Path) -> None:
        fields = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        path.write_text(json.dumps(fields, indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Template:
        raw = json.loads(path.read_text())
        return cls(
            raw["name"],
            Path(raw["kernel"]),
            Path(raw["initramfs"]),
            Path(raw["disk"]),
            raw["cmdline"],
            int(raw["mem_mib"]),
        )


def disk_generation(disk: Path) -> str:
    """The identity of a disk's contents, which a snapshot is bound to."""
    digest = hashlib.sha256()
    with disk.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _reseed_helper(out: Path) -> None:
    source = resources.files("warren_forkd.guest").joinpath("reseed.c").read_text()
    with tempfile.TemporaryDirectory(prefix="forkd-reseed-") as tmp:
        src = Path(tmp) / "reseed.c"
        src.write_text(source)
        flags = ["-Os", "-static", "-nostdlib", "-fno-stack-protector", "-fno-pie", "-no-pie", "-s"]
        subprocess.run(["gcc", *flags, "-o", str(out), str(src)], check=True)


def build_initramfs(out: Path, kern: kernel.Kernel) -> None:
    """Busybox, the agent as /init, the reseed helper and the kernel modules the guest loads."""
    with tempfile.TemporaryDirectory(prefix="forkd-initramfs-") as tmp:
        helper = Path(tmp) / "warren-reseed"
        _reseed_helper(helper)
        agent = resources.files("warren_forkd.guest").joinpath("init").read_bytes()
        entries = [initramfs.directory(d) for d in ("bin", "dev", "proc", "sys", "lib", "lib/modules")]
        entries += [
            initramfs.chardev("dev/console", 5, 1),  # the kernel opens it before running /init
            initramfs.file("bin/busybox", BUSYBOX.read_bytes(), 0o755),
            initramfs.symlink("bin/sh", "busybox"),
            initramfs.file("bin/warren-reseed", helper.read_bytes(), 0o755),
            initramfs.file("init", agent, 0o755),
            initramfs.file("lib/modules/order", "\n".join(kernel.MODULES).encode() + b"\n"),
        ]
        entries += [initramfs.file(f"lib/modules/{m.name}", m.read_bytes()) for m in kern.modules]
        initramfs.write(out, entries)


def build_disk(out: Path, files: dict[str, bytes], size_mib: int = 16) -> None:
    """A raw ext4 image holding the given files (mkfs.ext4 -d: no mount, no root needed)."""
    with tempfile.TemporaryDirectory(prefix="forkd-disk-") as tmp:
        root = Path(tmp)
        for rel, data in files.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        out.unlink(missing_ok=True)
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-d", str(root), "-E", "root_owner=0:0", str(out), f"{size_mib}M"],
            capture_output=True,
            check=True,
            env={"PATH": "/usr/sbin:/sbin:/usr/bin:/bin"},
        )


def build(
    directory: Path, name: str = "busybox", mem_mib: int = 256, files: dict[str, bytes] | None = None
) -> Template:
    """Build a template in `directory` from the cached Debian kernel and the host's busybox."""
    directory.mkdir(parents=True, exist_ok=True)
    kern = kernel.fetch()
    build_initramfs(directory / "initramfs.cpio.gz", kern)
    build_disk(directory / "base.ext4", files or {"hello.txt": b"from the template\n"})
    tpl = Template(
        name, kern.vmlinux, directory / "initramfs.cpio.gz", directory / "base.ext4", CMDLINE, mem_mib
    )
    tpl.save(directory / "template.json")
    return tpl
