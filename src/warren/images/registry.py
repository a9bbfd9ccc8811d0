"""Pushing OCI image archives to an operator's registry, with skopeo (Debian's package).

The archive's own name (io.containerd.image.name) gives the repository and tag; the
registry argument replaces its registry part, so `warren.dev/warren-control:0.1.0` pushed
to `registry.example:5000/warren` becomes `registry.example:5000/warren/warren-control:0.1.0`.
The digest pushed is the archive's manifest digest: what was built is what the registry
serves. An image the registry already serves under that reference with that digest is not
pushed again, so an installer that pushes on every run changes nothing the second time.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

REGISTRY = re.compile(r"^[a-z0-9.-]+(:[0-9]{1,5})?(/[a-z0-9._/-]+)?$")


class RegistryError(RuntimeError):
    pass


@dataclass(frozen=True)
class Pushed:
    reference: str
    digest: str
    changed: bool = True  # False: the registry served it already


def archive_image(archive: Path) -> tuple[str, str]:
    """(image name, manifest digest) from an OCI archive's index."""
    try:
        with tarfile.open(archive) as tar:
            member = tar.extractfile("index.json")
            if member is None:
                raise KeyError("index.json")
            index = json.load(member)
        manifest = index["manifests"][0]
        return manifest["annotations"]["io.containerd.image.name"], manifest["digest"]
    except (KeyError, IndexError, ValueError, tarfile.TarError) as exc:
        raise RegistryError(f"{archive} is not an OCI image archive of warren image build ({exc})") from None


def target(name: str, registry: str) -> str:
    if not REGISTRY.match(registry):
        raise RegistryError(
            f"{registry!r} is not a registry: give HOST[:PORT][/PATH] in lowercase, "
            "e.g. registry.example:5000/warren"
        )
    repository_and_tag = name.split("/", 1)[1] if "/" in name else name
    return f"{registry.rstrip('/')}/{repository_and_tag}"


def _skopeo() -> str:
    skopeo = shutil.which("skopeo")
    if skopeo is None:
        raise RegistryError("skopeo is missing: install Debian's skopeo package (tools/check-host.sh does)")
    return skopeo


def served_digest(reference: str, *, tls_verify: bool = True, authfile: Path | None = None) -> str | None:
    """The digest of the manifest the registry serves for `reference`, or None when it serves
    none (skopeo cannot tell "not there" from other failures by exit status, so any failure
    to read it means "push it"; the push then reports a real error itself)."""
    argv = [
        _skopeo(),
        "inspect",
        "--raw",
        f"--tls-verify={'true' if tls_verify else 'false'}",
        *(["--authfile", str(authfile)] if authfile else []),
        f"docker://{reference}",
    ]
    result = subprocess.run(argv, capture_output=True, check=False)
    if result.returncode != 0:
        return None
    return "sha256:" + hashlib.sha256(result.stdout).hexdigest()


def push(
    archive: Path,
    registry: str,
    *,
    tls_verify: bool = True,
    authfile: Path | None = None,
    dry_run: bool = False,
) -> Pushed:
    """Push `archive` below `registry` unless it serves it already; with `dry_run`, only say
    whether it would be pushed."""
    skopeo = _skopeo()
    name, digest = archive_image(archive)
    reference = target(name, registry)
    if served_digest(reference, tls_verify=tls_verify, authfile=authfile) == digest:
        return Pushed(reference, digest, changed=False)
    if dry_run:
        return Pushed(reference, digest)
    argv = [
        skopeo,
        "copy",
        "--quiet",
        f"--dest-tls-verify={'true' if tls_verify else 'false'}",
        # The archive's manifest as it is: no conversion, so the digest stays the one built.
        "--preserve-digests",
        *(["--dest-authfile", str(authfile)] if authfile else []),
        f"oci-archive:{archive}",
        f"docker://{reference}",
    ]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RegistryError(f"pushing {name} to {reference} failed: {result.stderr.strip()[-500:]}")
    return Pushed(reference, digest)
