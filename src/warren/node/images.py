"""The node's images: built from local files, imported into containerd, never pulled."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from warren.cluster.local import ClusterContext, ClusterError
from warren.images import Built, ImageSpec, build_archive
from warren.images.rootfs import RECIPES, busybox_version
from warren.node.layout import NodeLayout

PAUSE = "warren.dev/pause:1"
NAMESPACE = "k8s.io"  # containerd namespace the CRI plugin uses
# containerd's CRI reports an image with this label as pinned, and the kubelet's image
# garbage collection leaves pinned images alone.
PINNED_LABEL = "io.cri-containerd.pinned=pinned"


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


def _ctr(bin_dir: Path, socket: Path, *args: str) -> str:
    return subprocess.run(
        [str(bin_dir / "ctr"), "--address", str(socket), "--namespace", NAMESPACE, *args],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def imported(bin_dir: Path, layout: NodeLayout) -> dict[str, str]:
    """Image name -> manifest digest, as containerd holds them."""
    return held(bin_dir, layout.containerd_socket)


def held(bin_dir: Path, socket: Path) -> dict[str, str]:
    """Image name -> manifest digest, as the containerd on `socket` holds them."""
    return {name: digest for name, (digest, _labels) in _listing(bin_dir, socket).items()}


def _listing(bin_dir: Path, socket: Path) -> dict[str, tuple[str, str]]:
    """Image name -> (manifest digest, labels): `ctr images ls`'s REF, DIGEST and LABELS
    (the last column; SIZE before it is two words)."""
    lines = _ctr(bin_dir, socket, "images", "ls").splitlines()[1:]
    return {cols[0]: (cols[2], cols[-1]) for cols in (line.split() for line in lines) if len(cols) > 3}  # noqa: PLR2004


def import_built(
    bin_dir: Path,
    socket: Path,
    built: Sequence[Built],
    progress: Callable[[str], None],
    dry_run: bool = False,
) -> list[str]:
    """Import every archive whose image the containerd on `socket` does not already hold with
    the same digest; the names imported. Each image is also named by its digest
    (repository@sha256:...), as a pull would name it: the CRI resolves a reference pinned by
    digest only through that name. Both names are pinned for the CRI, so the kubelet's image
    garbage collection never removes an image no registry could give back. With `dry_run`,
    the names that would be imported, named or pinned, and nothing done."""
    try:
        have = _listing(bin_dir, socket)
    except subprocess.CalledProcessError as exc:
        raise ClusterError(
            f"cannot list the images of the containerd on {socket}: {exc.stderr.strip()}; is containerd "
            "running there, and is that its socket?"
        ) from None
    done = []
    for image in built:
        by_digest = f"{image.name.rsplit(':', 1)[0]}@{image.manifest_digest}"
        wanted = (image.manifest_digest, PINNED_LABEL)
        missing = [ref for ref in (image.name, by_digest) if not _is(have.get(ref), *wanted)]
        if not missing:
            continue
        done.append(image.name)
        if dry_run:
            continue
        if have.get(image.name, ("", ""))[0] != image.manifest_digest:
            try:
                _ctr(bin_dir, socket, "images", "import", str(image.archive))
            except subprocess.CalledProcessError as exc:
                raise ClusterError(
                    f"importing {image.archive} into containerd failed: {exc.stderr}"
                ) from None
            progress(f"imported image {image.name} ({image.manifest_digest[:19]})")
        if have.get(by_digest, ("", ""))[0] != image.manifest_digest:
            _ctr(bin_dir, socket, "images", "tag", "--force", image.name, by_digest)
        for ref in (image.name, by_digest):
            _ctr(bin_dir, socket, "images", "label", ref, PINNED_LABEL)
    return done


def _is(found: tuple[str, str] | None, digest: str, label: str) -> bool:
    """Whether `ctr images ls` showed this digest with this label."""
    return found is not None and found[0] == digest and label in found[1].split(",")


def ensure_imported(ctx: ClusterContext, layout: NodeLayout, progress: Callable[[str], None]) -> None:
    import_built(
        ctx.layout.bin_dir, layout.containerd_socket, build_all(ctx.layout.bin_dir, layout.images), progress
    )
