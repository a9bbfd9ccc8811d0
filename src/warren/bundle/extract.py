"""Extract a bundle: verify the whole archive first, write nothing unless it verifies.

The files are written to a hidden sibling of the target directory, checked again as they
are written (the archive could change between the two reads), and moved into place in one
rename. A directory that already holds this same bundle, intact, is left as it is, so a
second run changes nothing. Standard library only (see the package docstring).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from enum import Enum
from pathlib import Path

from warren.bundle import MANIFEST, BundleError
from warren.bundle.archive import DAMAGE, hash_stream, members
from warren.bundle.manifest import Manifest, ManifestError
from warren.bundle.verify import Report, VerificationError, verify_archive, verify_tree


class Outcome(Enum):
    EXTRACTED = "extracted"
    ALREADY_PRESENT = "already present"


def _holds(dest: Path, manifest: Manifest) -> bool:
    try:
        return Manifest.from_json((dest / MANIFEST).read_bytes()).checksum() == manifest.checksum()
    except (OSError, ManifestError):
        return False


def extract(
    archive: Path, dest: Path, progress: Callable[[str], None] = lambda _: None
) -> tuple[Outcome, Report]:
    """Verify `archive`, then extract it to `dest` (new, empty, or already holding it)."""
    progress(f"verifying {archive}")
    report = verify_archive(archive, progress)
    if not report.ok or report.manifest is None:
        raise VerificationError(report)
    manifest = report.manifest
    if dest.exists() and not dest.is_dir():
        raise BundleError(f"{dest} exists and is not a directory: choose another target")
    if dest.is_dir() and any(dest.iterdir()):
        if not _holds(dest, manifest):
            raise BundleError(
                f"{dest} is not empty and does not hold this bundle: extract into a new or empty directory"
            )
        held = verify_tree(dest)
        if not held.ok:
            raise BundleError(
                f"{dest} holds this bundle but no longer matches it:\n"
                + "\n".join(f"  {p}" for p in held.problems)
                + f"\nRemove {dest} and extract again."
            )
        return Outcome.ALREADY_PRESENT, held

    partial = dest.parent / f".{dest.name}.partial"
    if partial.exists():
        shutil.rmtree(partial)  # left by an interrupted run of this command
    partial.mkdir(parents=True)
    try:
        _write(archive, partial, manifest, progress)
        if dest.is_dir():
            dest.rmdir()  # empty, checked above
        partial.rename(dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return Outcome.EXTRACTED, report


def _write(archive: Path, root: Path, manifest: Manifest, progress: Callable[[str], None]) -> None:
    expected = manifest.by_path()
    written: set[str] = set()
    changed = BundleError(f"{archive} changed while it was being extracted: verify it and extract again")
    try:
        with members(archive) as stream:
            for member in stream:
                if member.stream is None:
                    raise changed
                if member.name == MANIFEST:
                    data = member.stream.read()
                    if Manifest.from_json(data).checksum() != manifest.checksum():
                        raise changed
                    (root / MANIFEST).write_bytes(data)
                    continue
                entry = expected.get(member.name)
                if entry is None or member.name in written:
                    raise changed
                target = root / member.name
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as out:
                    size, sha = hash_stream(member.stream, out.write)
                if (size, sha) != (entry.size, entry.sha256):
                    raise changed
                target.chmod(0o755 if member.mode & 0o111 else 0o644)
                written.add(member.name)
                if len(written) % 100 == 0:
                    progress(f"extracted {len(written)} of {len(expected)} files")
    except (ManifestError, *DAMAGE) as exc:
        raise changed from exc
    if written != set(expected):
        raise changed
