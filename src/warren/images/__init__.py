"""OCI images without a registry: root filesystems packed as OCI image archives.

An image here is a directory tree turned into one reproducible layer (sorted entries,
zero timestamps and owners), an image config and a manifest, written as an OCI image
layout inside a tar archive that `ctr images import` reads. The same inputs give the same
digests, so an archive's checksum can be pinned in a bundle.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class ImageSpec:
    name: str  # full reference, e.g. warren.dev/busybox:1.35
    rootfs: Path
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = (f"PATH={DEFAULT_PATH}",)
    workdir: str = "/"
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Built:
    name: str
    archive: Path
    manifest_digest: str
    archive_sha256: str


def _normalise(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _walk(root: Path) -> Iterable[Path]:
    """Every path under root, parents before children, in a stable order."""
    yield from sorted(root.rglob("*"), key=lambda p: p.relative_to(root).parts)


def layer_tar(rootfs: Path) -> bytes:
    """The root filesystem as an uncompressed, reproducible tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _walk(rootfs):
            arcname = str(path.relative_to(rootfs))
            info = _normalise(tar.gettarinfo(str(path), arcname))
            if info.isfile():
                with path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buf.getvalue()


def _gzip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as gz:
        gz.write(data)
    return buf.getvalue()


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_archive(spec: ImageSpec, out: Path) -> Built:
    """Write an OCI image layout archive for `spec` to `out`."""
    raw = layer_tar(spec.rootfs)
    layer = _gzip(raw)
    config = _json(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": list(spec.env),
                "Entrypoint": list(spec.entrypoint) or None,
                "Cmd": list(spec.cmd) or None,
                "WorkingDir": spec.workdir,
                "Labels": spec.labels or None,
            },
            "rootfs": {"type": "layers", "diff_ids": [_digest(raw)]},
            "history": [{"created_by": "warren image build", "created": "1970-01-01T00:00:00Z"}],
            "created": "1970-01-01T00:00:00Z",
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": _digest(layer), "size": len(layer)}],
        }
    )
    tag = spec.name.rsplit(":", 1)[1] if ":" in spec.name.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": _digest(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": spec.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                }
            ],
        }
    )
    files = {
        "oci-layout": _json({"imageLayoutVersion": "1.0.0"}),
        "index.json": index,
        **{f"blobs/sha256/{_digest(b).split(':')[1]}": b for b in (layer, config, manifest)},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = _normalise(tarfile.TarInfo(directory))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name in sorted(files):
            info = _normalise(tarfile.TarInfo(name))
            info.size, info.mode = len(files[name]), 0o644
            tar.addfile(info, io.BytesIO(files[name]))
    tmp.replace(out)
    return Built(spec.name, out, _digest(manifest), hashlib.sha256(out.read_bytes()).hexdigest())
