"""The images a sandbox is made of: the in-sandbox agent alone, and the base template.

  agent   one layer: /warren/agent, the static agent (agent/, Go, no cgo) and nothing
          else, not even a libc. Its entrypoint is the agent: a sandbox pod's init
          container runs `/warren/agent -install DIR` to copy it into a volume the
          sandbox's own container mounts, so the agent reaches any image without hostPath.
  base    the template E2B code assumes: a Debian userland (bash, coreutils, python3, git,
          curl, ca-certificates, procps) with the user `user` (uid and gid 1000, home
          /home/user, shell bash) as the image's default user, plus the agent's layer, so a
          template built on it has the agent at the same path without delivery.

The base image's second layer is the agent image's only layer, the same blob: a node that
holds both stores the agent once. The Debian userland is made by mmdebstrap (debian.py)
and cached, compressed, under the images cache keyed by every input, as the service
images' layers are; the agent is built afresh each time (Go's own build cache makes that a
matter of seconds) without VCS stamping, so the same sources and the same Go toolchain give
the same binary, hence the same digests.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from warren.images import (
    DEFAULT_PATH,
    Built,
    ImageSpec,
    Layer,
    build_layered_archive,
    compress_layer,
    debian,
    layer_tar,
    prune_beside,
)
from warren.images.rootfs import ImageError

IMAGES = ("agent", "base")
AGENT_PATH = "/warren/agent"
USER = "user"  # E2B's templates run their commands as this user
UID = 1000
HOME = f"/home/{USER}"
PACKAGES = ("bash", "coreutils", "findutils", "procps", "python3", "git", "curl", "ca-certificates")
HOOKS = (
    f'chroot "$1" groupadd --gid {UID} {USER}',
    f'chroot "$1" useradd --uid {UID} --gid {UID} --create-home --home-dir {HOME} --shell /bin/bash {USER}',
)
# Keeps the container alive with no terminal attached: commands arrive through the agent.
BASE_CMD = ("sleep", "infinity")
GO_BUILD = ("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w")
KEEP_USERLANDS = 2  # a new mirror snapshot makes a new userland (~60 MB): keep the newest


def image_name(image: str, version: str, registry: str = "warren.dev") -> str:
    return f"{registry}/{image}:{version}"


def build_agent(agent_dir: Path, out: Path) -> Path:
    """The agent from its sources in `agent_dir`: static (no cgo), for linux/amd64, without
    paths or VCS state in it, so that it depends on the sources and the toolchain alone."""
    if not (agent_dir / "go.mod").is_file():
        raise ImageError(f"{agent_dir} holds no go.mod: name the repository's agent/ directory")
    if shutil.which("go") is None:
        raise ImageError("go is missing: the agent image builds the agent from agent/ with Go")
    env = {
        **os.environ,
        "CGO_ENABLED": "0",
        "GOOS": "linux",
        "GOARCH": "amd64",
        "GOTOOLCHAIN": "local",
        "GOFLAGS": "-mod=mod",
    }
    result = subprocess.run(
        [*GO_BUILD, "-o", str(out), "."], cwd=agent_dir, env=env, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ImageError(f"building the agent failed (exit {result.returncode}):\n{result.stderr.strip()}")
    return out


def _agent_layer(agent_dir: Path, staging: Path) -> Layer:
    """One layer holding /warren/agent (root's, mode 0755) and its directory."""
    root = staging / "agent-rootfs"
    binary = root / AGENT_PATH.lstrip("/")
    binary.parent.mkdir(parents=True)
    build_agent(agent_dir, binary)
    binary.parent.chmod(0o755)
    binary.chmod(0o755)
    raw = staging / "agent-layer.tar"
    raw.write_bytes(layer_tar(root))
    layer = compress_layer(raw, staging / "agent-layer.tar.gz")
    raw.unlink()
    return layer


def _userland(
    cache: Path, staging: Path, progress: Callable[[str], None], apt_sources: Sequence[Path] | None
) -> Layer:
    """The base image's Debian userland as one compressed layer, made once per key. The
    record written last says the directory is complete."""
    key = debian.inputs_key(PACKAGES, HOOKS, apt_sources=apt_sources)
    directory = cache / f"base-userland-{key}"
    record = directory / "layer.json"
    if not record.is_file():
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        tarball = debian.build_tarball(staging / "base-rootfs.tar", PACKAGES, HOOKS, progress, apt_sources)
        progress("compressing the base image's userland")
        layer = compress_layer(tarball, directory / "userland.tar.gz")
        tarball.unlink()
        entry = {"diff_id": layer.diff_id, "digest": layer.digest, "size": layer.size}
        record.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
        prune_beside(directory, KEEP_USERLANDS)
    else:
        progress(f"base image userland from the cache ({directory.name})")
    entry = json.loads(record.read_text())
    return Layer(entry["diff_id"], entry["digest"], entry["size"], directory / "userland.tar.gz")


def build(
    agent_dir: Path,
    version: str,
    cache: Path,
    out_dir: Path,
    *,
    registry: str = "warren.dev",
    only: Sequence[str] = (),
    progress: Callable[[str], None] = lambda _: None,
    apt_sources: Sequence[Path] | None = None,
) -> list[Built]:
    """The agent and base images (or those `only` names) as OCI archives in `out_dir`
    (agent.tar, base.tar). The base's userland is cached under `cache`; the caller holds
    the cache's lock. `apt_sources` names the Debian mirror's apt source files; None: the
    host's own."""
    unknown = set(only) - set(IMAGES)
    if unknown:
        names = ", ".join(sorted(unknown))
        raise ImageError(f"unknown sandbox image {names}: choose from {', '.join(IMAGES)}")
    wanted = [image for image in IMAGES if not only or image in only]
    labels = {"org.opencontainers.image.version": version}
    built = []
    with tempfile.TemporaryDirectory(prefix="warren-sandbox-images-") as tmp:
        agent = _agent_layer(agent_dir, Path(tmp))
        for image in wanted:
            spec = ImageSpec(
                name=image_name(image, version, registry),
                rootfs=Path("/nonexistent"),  # the layers are made already
                labels={"org.opencontainers.image.title": image, **labels},
            )
            if image == "agent":
                spec, stack = replace(spec, entrypoint=(AGENT_PATH,)), [agent]
            else:
                spec = replace(
                    spec,
                    cmd=BASE_CMD,
                    workdir=HOME,
                    # Numeric, so that a pod's runAsNonRoot can check it: it is `user`.
                    user=f"{UID}:{UID}",
                    env=(f"PATH={DEFAULT_PATH}", "LANG=C.UTF-8"),
                )
                stack = [_userland(cache, Path(tmp), progress, apt_sources), agent]
            built.append(build_layered_archive(spec, stack, out_dir / f"{image}.tar"))
            progress(f"image {spec.name}: {built[-1].manifest_digest[:19]}")
    return built


def build_from_checkout(
    repo: Path,
    out_dir: Path,
    cache_root: Path,
    *,
    registry: str = "warren.dev",
    only: Sequence[str] = (),
    images_cache: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
    apt_sources: Sequence[Path] | None = None,
) -> list[Built]:
    """The images from the checkout's agent/, under the cache's lock (the userland cached
    under `images_cache`, by default `cache_root`/images), tagged with the warren package's
    version as the service images are."""
    from warren.bundle import cache
    from warren.images.services import project_version

    with cache.locked(cache_root, progress):
        return build(
            repo / "agent",
            project_version(repo),
            images_cache or cache_root / "images",
            out_dir,
            registry=registry,
            only=only,
            progress=progress,
            apt_sources=apt_sources,
        )
