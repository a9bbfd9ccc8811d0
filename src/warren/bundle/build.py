"""`warren bundle build`: gather every part, write the manifest, pack one archive.

Parts come from their caches where they can (Go binaries from the build scripts' cache,
dependency wheels and Debian packages from $WARREN_CACHE/bundle keyed by their pins); what
depends on the checkout (Warren's own wheels, the resolved requirements, the images) is
made fresh each time. Large files are packed from where they lie, never copied.
"""

from __future__ import annotations

import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from warren.bundle import SUMS, BundleError, archive, binaries, cache, debs, wheels
from warren.bundle.manifest import FileEntry, Manifest, entries, hash_file, sha256sums
from warren.bundle.verify import beside

PARTS = ("wheels", "debs", "bin", "images")


@dataclass(frozen=True)
class Result:
    archive: Path
    manifest: Manifest
    archive_size: int
    seconds: dict[str, float] = field(default_factory=dict)  # step -> wall time

    def parts(self) -> dict[str, tuple[int, int]]:
        """Top-level directory -> (files, bytes before compression)."""
        out: dict[str, tuple[int, int]] = {}
        for entry in self.manifest.files:
            top = entry.path.split("/", 1)[0] if "/" in entry.path else "(top)"
            files, size = out.get(top, (0, 0))
            out[top] = (files + 1, size + entry.size)
        return dict(sorted(out.items()))


def find_repo(start: Path) -> Path:
    """The Warren checkout at or above `start` (the bundle is built from its sources)."""
    for candidate in (start.resolve(), *start.resolve().parents):
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file() and (candidate / binaries.CLUSTER_SCRIPT).is_file():
            with pyproject.open("rb") as handle:
                if tomllib.load(handle).get("project", {}).get("name") == "warren":
                    return candidate
    raise BundleError(f"no Warren checkout at or above {start}: run `warren bundle build` inside one")


def default_output(repo: Path) -> Path:
    with (repo / "pyproject.toml").open("rb") as handle:
        version = tomllib.load(handle)["project"]["version"]
    return repo / "dist" / f"warren-bundle-{version}.tar.gz"


@contextmanager
def _step(name: str, seconds: dict[str, float], progress: Callable[[str], None]) -> Iterator[None]:
    start = time.monotonic()
    yield
    seconds[name] = time.monotonic() - start
    progress(f"{name}: {seconds[name]:.1f} s")


@dataclass
class _Parts:
    """What the build has gathered so far."""

    sources: dict[str, Path] = field(default_factory=dict)  # bundle path -> file
    pins: dict[str, dict[str, str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    environments: dict[str, tuple[str, ...]] = field(default_factory=dict)
    binary_sets: list[binaries.BinarySet] = field(default_factory=list)

    def add_binaries(self, found: binaries.BinarySet | str, progress: Callable[[str], None]) -> None:
        if isinstance(found, str):
            self.notes.append(found)
            progress(found)
            return
        self.sources |= found.files()
        self.pins[f"{found.name}-binaries"] = found.pins
        self.binary_sets.append(found)

    def add_debs(self, deb_set: debs.DebSet, release: debs.Release) -> None:
        self.sources |= deb_set.files
        self.pins["debian"] = {
            "codename": release.codename,
            "version": release.version,
            "architecture": release.architecture,
        }
        self.pins["debian-packages"] = {p: deb_set.versions[p] for p in debs.package_list()}
        # Shipped, not installed: the guest kernel warren-forkd unpacks.
        self.pins["debian-files"] = {
            p: v for p, v in deb_set.versions.items() if p in debs.SHIP_ONLY or debs.KERNEL.match(p)
        }

    def checksums(self, staging: Path) -> tuple[FileEntry, ...]:
        """Every file's entry, SHA256SUMS added; the build scripts' own sums must agree."""
        files = entries(self.sources)
        by_path = {e.path: e for e in files}
        for binary_set in self.binary_sets:
            for name, digest in binary_set.sums.items():
                entry = by_path.get(f"bin/{binary_set.name}/{name}")
                if entry is None or entry.sha256 != digest:
                    raise BundleError(f"{binary_set.directory / name} does not match its SHA256SUMS")
        sums = staging / SUMS
        sums.write_bytes(sha256sums(files))
        self.sources[SUMS] = sums
        return tuple(sorted((*files, *entries({SUMS: sums})), key=lambda e: e.path))


def build(
    repo: Path,
    output: Path,
    cache_root: Path,
    progress: Callable[[str], None] = lambda _: None,
    with_pulumi: bool = True,
) -> Result:
    wheels.check_interpreter()
    seconds: dict[str, float] = {}
    parts = _Parts()
    built = datetime.now(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
    started = time.monotonic()
    with (
        cache.locked(cache_root, progress),
        tempfile.TemporaryDirectory(prefix="staging-", dir=cache_root) as tmp,
    ):
        staging = Path(tmp)
        with _step("cluster binaries", seconds, progress):
            cluster = binaries.cluster(repo, progress)
            parts.add_binaries(cluster, progress)
        with _step("pulumi binaries", seconds, progress):
            skipped = "Pulumi binaries not included: --no-pulumi"
            parts.add_binaries(binaries.pulumi(repo, progress) if with_pulumi else skipped, progress)
        with _step("wheels", seconds, progress):
            wheel_set = wheels.collect(repo, cache_root, staging / "wheels", progress)
            parts.sources |= wheel_set.files
            parts.pins |= wheel_set.pins
            parts.environments = wheel_set.environments
        with _step("debian packages", seconds, progress):
            parts.add_debs(*debs.collect(cache_root, progress))
        with _step("images", seconds, progress):
            from warren.images import sandbox, services
            from warren.images.rootfs import ImageError
            from warren.node.images import build_all

            made = build_all(cluster.directory, staging / "images")
            # Warren's own services, from the very wheels the bundle carries.
            flat = staging / "service-wheels"
            flat.mkdir()
            for bundle_path, source in wheel_set.files.items():
                (flat / Path(bundle_path).name).symlink_to(source.absolute())
            try:
                made += services.build(
                    flat,
                    services.project_version(repo),
                    cache_root / "images",
                    staging / "images",
                    progress=progress,
                )
                # The agent and the base template, which every sandbox node runs too.
                made += sandbox.build(
                    repo / "agent",
                    services.project_version(repo),
                    cache_root / "images",
                    staging / "images",
                    progress=progress,
                )
            except ImageError as exc:
                raise BundleError(str(exc)) from None
            for image in made:
                parts.sources[f"images/{image.archive.name}"] = image.archive
                parts.pins.setdefault("images", {})[image.name] = image.manifest_digest
        with _step("checksums", seconds, progress):
            files = parts.checksums(staging)
        manifest = Manifest(built, files, parts.pins, parts.environments, tuple(parts.notes))
        with _step("archive", seconds, progress):
            progress(f"writing {output} ({len(files)} files, {sum(e.size for e in files) >> 20} MiB)")
            archive.write(output, manifest, parts.sources, progress)
    side_manifest, side_sum = beside(output)
    side_manifest.write_bytes(manifest.to_json())
    _, digest = hash_file(output)
    side_sum.write_text(f"{digest}  {output.name}\n")
    seconds["total"] = time.monotonic() - started
    return Result(output, manifest, output.stat().st_size, seconds)
