"""Root filesystems for the images Warren needs, made from what the host already has."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warren.images import ImageSpec

BUSYBOX = Path("/bin/busybox")  # Debian's busybox-static: one static binary, every applet
PAUSE_SOURCE = Path(__file__).with_name("pause.c")


class ImageError(RuntimeError):
    pass


def _base_dirs(root: Path) -> None:
    for name in ("bin", "dev", "etc", "proc", "sys", "tmp", "var/run", "workspace"):
        (root / name).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "etc/passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
    )
    (root / "etc/group").write_text("root:x:0:\nnogroup:x:65534:\n")
    (root / "etc/hostname").write_text("sandbox\n")


def busybox_version() -> str:
    out = subprocess.run([str(BUSYBOX)], capture_output=True, text=True, check=False).stdout
    # First line: "BusyBox v1.35.0 (Debian 1:1.35.0-4+b1) multi-call binary."
    return out.split()[1].lstrip("v") if out.startswith("BusyBox") else "unknown"


def busybox_rootfs(root: Path) -> ImageSpec:
    if not BUSYBOX.is_file():
        raise ImageError(f"{BUSYBOX} is missing: install Debian's busybox-static package")
    _base_dirs(root)
    shutil.copy2(BUSYBOX, root / "bin/busybox")
    applets = subprocess.run(
        [str(BUSYBOX), "--list-full"], capture_output=True, text=True, check=True
    ).stdout.split()
    for applet in applets:
        link = root / applet
        if link.name == "busybox" or link.exists():
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("/bin/busybox")
    return ImageSpec(name=f"warren.dev/busybox:{busybox_version()}", rootfs=root, cmd=("sh",))


def pause_rootfs(root: Path) -> ImageSpec:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise ImageError("a C compiler is needed to build the pause image: install gcc")
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [cc, "-static", "-Os", "-s", "-o", str(root / "pause"), str(PAUSE_SOURCE)],
        check=True,
    )
    return ImageSpec(name="warren.dev/pause:1", rootfs=root, entrypoint=("/pause",), env=())


@dataclass(frozen=True)
class Recipe:
    make: Callable[[Path], ImageSpec]
    description: str


RECIPES = {
    "busybox": Recipe(busybox_rootfs, "busybox-static userland: sandbox and test image"),
    "pause": Recipe(pause_rootfs, "the pod sandbox's pause process"),
}
