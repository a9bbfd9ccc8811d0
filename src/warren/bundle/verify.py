"""Check a bundle (the archive, or a directory it was extracted to) against its manifest.

Every problem is collected and named (changed, missing, extra, unsafe entries, a manifest
that fails its own checksum, a damaged archive) so the operator sees all of them at once.
Standard library only (see the package docstring).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from warren.bundle import MANIFEST, BundleError
from warren.bundle.archive import DAMAGE, Member, hash_stream, members
from warren.bundle.manifest import FileEntry, Manifest, ManifestError, hash_file, is_safe_path

FIX = (
    "Nothing from this bundle may be installed. Copy it again from the machine that built it "
    "(the archive together with the .manifest.json and .sha256 files beside it), or build it "
    "again there with `warren bundle build`."
)


@dataclass(frozen=True)
class Problem:
    kind: str  # changed | missing | extra | unsafe | manifest | archive
    path: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind:8} {self.path}: {self.detail}"


@dataclass(frozen=True)
class Report:
    source: Path
    manifest: Manifest | None
    problems: tuple[Problem, ...]
    checked_files: int = 0
    checked_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.manifest is not None and not self.problems

    def summary(self) -> str:
        if self.ok:
            return f"{self.source}: {self.checked_files} files, {self.checked_bytes} bytes match the manifest"
        lines = [f"{self.source} does not match its manifest ({len(self.problems)} problem(s)):"]
        lines += [f"  {problem}" for problem in self.problems]
        lines.append(FIX)
        return "\n".join(lines)


class VerificationError(BundleError):
    """The bundle did not verify; the report names every problem."""

    def __init__(self, report: Report) -> None:
        super().__init__(report.summary())
        self.report = report


def beside(archive: Path) -> tuple[Path, Path]:
    """The copy of the manifest and the archive's checksum file written beside an archive."""
    return archive.with_name(archive.name + ".manifest.json"), archive.with_name(archive.name + ".sha256")


def _compare(entry: FileEntry, size: int, sha256: str) -> Problem | None:
    if size == entry.size and sha256 == entry.sha256:
        return None
    return Problem(
        "changed",
        entry.path,
        f"{size} bytes with sha256 {sha256[:16]}..., the manifest says {entry.size} bytes "
        f"with sha256 {entry.sha256[:16]}...",
    )


def _missing(expected: Iterable[str], seen: set[str]) -> list[Problem]:
    return [
        Problem("missing", p, "is in the manifest but not in the bundle")
        for p in sorted(set(expected) - seen)
    ]


def _archive_sum(archive: Path) -> list[Problem]:
    """The archive against the .sha256 file beside it, when there is one."""
    _, side_sum = beside(archive)
    if not side_sum.is_file():
        return []
    recorded = (side_sum.read_text().split() or [""])[0]
    _, actual = hash_file(archive)
    if actual == recorded:
        return []
    return [
        Problem(
            "archive",
            archive.name,
            f"its sha256 is {actual[:16]}..., {side_sum.name} says {recorded[:16]}...",
        )
    ]


def _member(member: Member, expected: dict[str, FileEntry], seen: set[str]) -> tuple[Problem | None, int]:
    """Check one archive member (hashing its content); (problem or None, bytes read)."""
    if not is_safe_path(member.name) or member.name == MANIFEST:
        return Problem("unsafe", member.name, "path leaves the bundle or is reserved"), 0
    if member.kind != "file" or member.stream is None:
        return Problem("unsafe", member.name, f"is a {member.kind}, not a regular file"), 0
    if member.name in seen:
        return Problem("extra", member.name, "appears twice in the archive"), 0
    entry = expected.get(member.name)
    if entry is None:
        return Problem("extra", member.name, "is not in the manifest"), 0
    seen.add(member.name)
    size, sha = hash_stream(member.stream)
    return _compare(entry, size, sha), size


def verify_archive(archive: Path, progress: Callable[[str], None] = lambda _: None) -> Report:
    """Read the archive once, hashing every member; nothing is written anywhere."""
    if not archive.is_file():
        return Report(archive, None, (Problem("missing", str(archive), "no such file"),))
    problems = _archive_sum(archive)
    manifest: Manifest | None = None
    seen: set[str] = set()
    checked = 0
    try:
        with members(archive) as stream:
            first = next(stream, None)
            if first is None or first.name != MANIFEST or first.stream is None:
                problems.append(
                    Problem("manifest", MANIFEST, "is not the archive's first member: not a bundle")
                )
                return Report(archive, None, tuple(problems))
            raw = first.stream.read()
            try:
                manifest = Manifest.from_json(raw)
            except ManifestError as exc:
                problems.append(Problem("manifest", MANIFEST, str(exc)))
                return Report(archive, None, tuple(problems))
            expected = manifest.by_path()
            for member in stream:
                problem, size = _member(member, expected, seen)
                if problem is not None:
                    problems.append(problem)
                checked += size
                if size and len(seen) % 100 == 0:
                    progress(f"checked {len(seen)} of {len(expected)} files")
    except BundleError as exc:
        problems.append(Problem("archive", archive.name, str(exc)))
        return Report(archive, manifest, tuple(problems))
    except (*DAMAGE, OSError) as exc:
        problems.append(Problem("archive", archive.name, f"is damaged or truncated ({exc})"))
        return Report(archive, manifest, tuple(problems), len(seen), checked)
    problems += _missing(expected, seen)
    side_manifest, _ = beside(archive)
    if side_manifest.is_file() and side_manifest.read_bytes() != raw:
        problems.append(
            Problem("manifest", side_manifest.name, "differs from the manifest inside the archive")
        )
    return Report(archive, manifest, tuple(problems), len(seen), checked)


def verify_tree(root: Path) -> Report:
    """Check an extracted bundle: every listed file as recorded, nothing else in the tree."""
    held = root / MANIFEST
    if not held.is_file():
        return Report(
            root, None, (Problem("missing", MANIFEST, f"no {MANIFEST} in {root}: not an extracted bundle"),)
        )
    try:
        manifest = Manifest.from_json(held.read_bytes())
    except ManifestError as exc:
        return Report(root, None, (Problem("manifest", MANIFEST, str(exc)),))
    expected = manifest.by_path()
    problems: list[Problem] = []
    seen: set[str] = set()
    checked = 0
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        for name in sorted([*dirnames, *filenames]):
            path = here / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                problems.append(Problem("unsafe", rel, "is a symbolic link"))
            elif path.is_dir() or rel == MANIFEST:
                continue
            elif not path.is_file():
                problems.append(Problem("unsafe", rel, "is not a regular file"))
            elif (entry := expected.get(rel)) is None:
                problems.append(Problem("extra", rel, "is not in the manifest"))
            else:
                seen.add(rel)
                size, sha = hash_file(path)
                checked += size
                if (problem := _compare(entry, size, sha)) is not None:
                    problems.append(problem)
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
    problems += _missing(expected, seen)
    return Report(root, manifest, tuple(problems), len(seen), checked)


def verify(target: Path, progress: Callable[[str], None] = lambda _: None) -> Report:
    """An archive or an extracted directory, whichever `target` is."""
    return verify_tree(target) if target.is_dir() else verify_archive(target, progress)
