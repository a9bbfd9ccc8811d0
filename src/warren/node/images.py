"""The node's images: built from local files, imported into containerd, never pulled."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from warren.cluster.local import ClusterContext, ClusterError
from warren.images import Built, ImageSpec, build_archive
from warren.images.rootfs import RECIPES, busybox_version
from warren.node.layout import NodeLayout

PAUSE = "warren.dev/pause:1"
NAMESPACE = "k8s.io"  # containerd namespace the CRI plugin uses


def busybox_image() -> str:
    return f"warren.dev/busybox:{busybox_version()}"


def coredns_image(version: str) -> str:
    return f"warren.dev/coredns:{version}"


def coredns_version(bin_dir: Path) -> str:
    out = subprocess.run([str(bin_dir / "coredns"), "-version"], capture_output=True, text=True, check=True)
    # "CoreDNS-1.15.0\nlinux/amd64, go1.26.8, v1.15.0"
    return out.stdout.split()[0].split("-", 1)[1]


def _coredns_rootfs(bin_dir: Path, version: str) -> Callable[[Path], ImageSpec]:
    def make(root: Path) -> ImageSpec:
        (root / "etc").mkdir(parents=True)
        (root / "etc/passwd").write_text("nonroot:x:65532:65532:nonroot:/:/bin/false\n")
        shutil.copy2(bin_dir / "coredns", root / "coredns")
        return ImageSpec(name=coredns_image(version), rootfs=root, entrypoint=("/coredns",), env=())

    return make


def build_all(bin_dir: Path, out_dir: Path, only: set[str] | None = None) -> list[Built]:
    """Archives for pause, busybox and CoreDNS (reproducible: same inputs, same digests)."""
    recipes: dict[str, Callable[[Path], ImageSpec]] = {
        "pause": RECIPES["pause"].make,
        "busybox": RECIPES["busybox"].make,
        "coredns": _coredns_rootfs(bin_dir, coredns_version(bin_dir)),
    }
    built = []
    for name, make in recipes.items():
        if only is not None and name not in only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"warren-image-{name}-") as tmp:
            spec = make(Path(tmp) / "rootfs")
            built.append(build_archive(spec, out_dir / f"{name}.tar"))
    return built


def _ctr(bin_dir: Path, layout: NodeLayout, *args: str) -> str:
    return subprocess.run(
        [str(bin_dir / "ctr"), "--address", str(layout.containerd_socket), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def imported(bin_dir: Path, layout: NodeLayout) -> dict[str, str]:
    """Image name -> manifest digest, as containerd holds them."""
    lines = _ctr(bin_dir, layout, "images", "ls").splitlines()[1:]
    return {cols[0]: cols[2] for cols in (line.split() for line in lines) if len(cols) > 2}  # noqa: PLR2004


def ensure_imported(ctx: ClusterContext, layout: NodeLayout, progress: Callable[[str], None]) -> None:
    have = imported(ctx.layout.bin_dir, layout)
    for image in build_all(ctx.layout.bin_dir, layout.images):
        if have.get(image.name) == image.manifest_digest:
            continue
        try:
            _ctr(ctx.layout.bin_dir, layout, "images", "import", str(image.archive))
        except subprocess.CalledProcessError as exc:
            raise ClusterError(f"importing {image.archive} into containerd failed: {exc.stderr}") from None
        progress(f"imported image {image.name} ({image.manifest_digest[:19]})")
