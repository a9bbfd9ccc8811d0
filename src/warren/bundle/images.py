"""Warren's service images in an extracted bundle, as a configuration's workloads use them.

The bundle's manifest pins every image it carries by its manifest digest (`pins.images`,
image name -> sha256:...), and each service image's archive is `images/<service>.tar`. An
installer pins the rendered workloads by those digests and puts exactly those archives on
the nodes (imported into containerd) or in the operator's registry (pushed byte for byte),
so what runs is what the bundle carries and a node never has to pull.

Standard library only (see the package docstring): preflight runs this with the host's
`python3 -S` before anything is installed, so a bundle without the images the configuration
asks for stops the run before any host changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from warren.bundle import MANIFEST, BundleError
from warren.bundle.manifest import Manifest, ManifestError

# The images each kind of stores runs as workloads (manifests/warren-system.yaml.j2): the
# embedded stores are workloads too; external ones are the operator's.
# Every configuration also runs the agent (delivered into every sandbox) and the base
# template's image (what E2B's SDK starts by default).
WORKLOAD_IMAGES: dict[str, tuple[str, ...]] = {
    "embedded": ("warren-control", "warren-blockd", "seaweedfs", "postgres", "agent", "base"),
    "external": ("warren-control", "warren-blockd", "agent", "base"),
}


@dataclass(frozen=True)
class BundledImage:
    service: str  # warren-control, ...
    name: str  # the name it was built under: warren.dev/warren-control:0.1.0
    digest: str  # its manifest digest, sha256:...
    archive: Path  # the OCI archive in the extracted bundle
    archive_sha256: str  # the archive file's own checksum, as the manifest records it


def _split(name: str) -> tuple[str, str]:
    """(last path component, tag) of an image name: warren.dev/x:1 -> (x, 1)."""
    repository, _, tag = name.rpartition(":")
    if "/" in tag or not repository:
        return name.rsplit("/", 1)[-1], ""
    return repository.rsplit("/", 1)[-1], tag


def read_manifest(bundle: Path) -> Manifest:
    """The extracted bundle's manifest, its own checksum checked."""
    try:
        return Manifest.from_json((bundle / MANIFEST).read_bytes())
    except OSError as exc:
        raise BundleError(
            f"cannot read {bundle / MANIFEST} ({exc.strerror}): extract the bundle there first "
            "(`warren bundle extract`)"
        ) from None
    except ManifestError as exc:
        raise BundleError(f"{bundle}: {exc}") from None


def service_images(bundle: Path, tag: str, services: Sequence[str]) -> list[BundledImage]:
    """Each of `services` at `tag` as the extracted `bundle` carries it; BundleError names
    what is missing and how to get it."""
    manifest = read_manifest(bundle)
    pinned = manifest.pins.get("images") or {}
    files = manifest.by_path()
    found = []
    for service in services:
        matches = [(name, digest) for name, digest in pinned.items() if _split(name) == (service, tag)]
        if len(matches) != 1:
            carried = sorted(f"{s}:{t}" for s, t in map(_split, pinned) if s == service)
            if carried:
                raise BundleError(
                    f"the bundle at {bundle} carries {', '.join(carried)}, not {service}:{tag}: set "
                    f"services.image_tag to the bundle's version, or install from the bundle built "
                    f"for {tag}"
                )
            raise BundleError(
                f"the bundle at {bundle} carries no image of {service}: build it again with "
                "`warren bundle build` (it builds Warren's service images as root)"
            )
        name, digest = matches[0]
        entry = files.get(f"images/{service}.tar")
        if entry is None:
            raise BundleError(
                f"the bundle at {bundle} pins {name} but lists no images/{service}.tar: "
                "build it again with `warren bundle build`"
            )
        found.append(BundledImage(service, name, digest, bundle / entry.path, entry.sha256))
    return found


def workload_images(bundle: Path, tag: str, stores: str) -> list[BundledImage]:
    """The images the workloads of a configuration with these `stores` run."""
    if stores not in WORKLOAD_IMAGES:
        raise BundleError(f"stores must be one of {', '.join(WORKLOAD_IMAGES)}, not {stores!r}")
    return service_images(bundle, tag, WORKLOAD_IMAGES[stores])
