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
import shutil
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
    user: str = ""  # the image's default user ("" leaves the config's field out)


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


@dataclass(frozen=True)
class _Blob:
    digest: str
    size: int
    path: Path | None = None  # on disk (large layers), or
    data: bytes = b""  # in memory


@dataclass(frozen=True)
class Layer:
    """A compressed layer on disk: what its uncompressed tar hashes to, and its blob."""

    diff_id: str
    digest: str
    size: int
    path: Path


def compress_layer(raw: Path, out: Path) -> Layer:
    """Compress an uncompressed layer tar into `out` (gzip, reproducible: no name, no time)."""
    raw_hash, gz_hash = hashlib.sha256(), hashlib.sha256()

    class _Tee(io.RawIOBase):
        def __init__(self, sink: io.BufferedWriter) -> None:
            self.sink = sink

        def writable(self) -> bool:
            return True

        def write(self, b: bytes) -> int:  # type: ignore[override]
            gz_hash.update(b)
            return self.sink.write(b)

    with (
        raw.open("rb") as src,
        out.open("wb") as sink,
        gzip.GzipFile(fileobj=_Tee(sink), mode="wb", mtime=0, compresslevel=6) as gz,
    ):
        while chunk := src.read(1 << 20):
            raw_hash.update(chunk)
            gz.write(chunk)
    return Layer("sha256:" + raw_hash.hexdigest(), "sha256:" + gz_hash.hexdigest(), out.stat().st_size, out)


def build_archive(spec: ImageSpec, out: Path) -> Built:
    """Write an OCI image layout archive for `spec` (one layer: its root filesystem) to `out`."""
    raw = layer_tar(spec.rootfs)
    layer = _gzip(raw)
    return _write(spec, [(_digest(raw), _Blob(_digest(layer), len(layer), data=layer))], out)


def build_layered_archive(spec: ImageSpec, layers: list[Layer], out: Path) -> Built:
    """The same from compressed layers (compress_layer), bottom first; spec.rootfs is unused."""
    return _write(
        spec, [(layer.diff_id, _Blob(layer.digest, layer.size, path=layer.path)) for layer in layers], out
    )


def _write(spec: ImageSpec, layers: list[tuple[str, _Blob]], out: Path) -> Built:
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
                **({"User": spec.user} if spec.user else {}),
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id for diff_id, _ in layers]},
            "history": [
                {"created_by": "warren image build", "created": "1970-01-01T00:00:00Z"} for _ in layers
            ],
            "created": "1970-01-01T00:00:00Z",
        }
    )
    manifest = _json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": OCI_LAYER, "digest": b.digest, "size": b.size} for _, b in layers],
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
    blobs = {b.digest: b for _, b in layers}
    for data in (config, manifest):
        blobs[_digest(data)] = _Blob(_digest(data), len(data), data=data)
    small = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": index}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".partial")
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory in ("blobs", "blobs/sha256"):
            info = _normalise(tarfile.TarInfo(directory))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        entries: dict[str, _Blob | bytes] = {
            **small,
            **{f"blobs/sha256/{d.split(':')[1]}": b for d, b in blobs.items()},
        }
        for name in sorted(entries):
            entry = entries[name]
            info = _normalise(tarfile.TarInfo(name))
            info.mode = 0o644
            if isinstance(entry, bytes):
                info.size = len(entry)
                tar.addfile(info, io.BytesIO(entry))
            elif entry.path is not None:
                info.size = entry.size
                with entry.path.open("rb") as handle:
                    tar.addfile(info, handle)
            else:
                info.size = entry.size
                tar.addfile(info, io.BytesIO(entry.data))
    tmp.replace(out)
    return Built(spec.name, out, _digest(manifest), _file_sha256(out))


def prune_beside(current: Path, keep: int) -> None:
    """Remove all but the `keep` newest cached directories beside `current` that share its
    name up to the key (`<kind>-<key>`), `current` always kept."""
    kind = current.name.rsplit("-", 1)[0]
    found = sorted(current.parent.glob(f"{kind}-*"), key=lambda d: d.stat().st_mtime, reverse=True)
    for old in [d for d in found if d != current][keep - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()
