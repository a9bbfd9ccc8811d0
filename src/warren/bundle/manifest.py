"""The bundle's manifest: what every file must be, what it was built from, and its own checksum.

The checksum covers a canonical form of everything else in the manifest (sorted keys, no
whitespace), so a manifest re-indented by an editor still checks, and any changed value,
added or removed file entry does not. Standard library only (see the package docstring).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from warren.bundle import FORMAT_VERSION, MANIFEST

FORMAT = "warren-bundle"
CHECKSUM_KEY = "manifest_sha256"
_CHUNK = 1 << 20


class ManifestError(ValueError):
    """The manifest is unreadable, malformed or altered."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, '/'-separated, normalised
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    built: str  # UTC, ISO 8601
    files: tuple[FileEntry, ...]
    # section -> name -> version (or value): the components' versions, the Debian release,
    # the Python version and platform, the images' digests.
    pins: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # environment -> the top-level requirements installed into it (wheels/requirements-<env>.txt
    # holds the whole pinned, hashed set).
    environments: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    format_version: int = FORMAT_VERSION

    def by_path(self) -> dict[str, FileEntry]:
        return {entry.path: entry for entry in self.files}

    def body(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "built": self.built,
            "pins": {section: dict(sorted(values.items())) for section, values in sorted(self.pins.items())},
            "environments": {name: list(reqs) for name, reqs in sorted(self.environments.items())},
            "notes": list(self.notes),
            "files": [
                {"path": e.path, "size": e.size, "sha256": e.sha256}
                for e in sorted(self.files, key=lambda e: e.path)
            ],
        }

    def checksum(self) -> str:
        return _canonical_sha256(self.body())

    def to_json(self) -> bytes:
        document = {**self.body(), CHECKSUM_KEY: self.checksum()}
        return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: bytes) -> Manifest:
        """Parse and check a manifest; ManifestError says what is wrong with it."""
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ManifestError(f"{MANIFEST} is not valid JSON ({exc})") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise ManifestError(f"{MANIFEST} is not a Warren bundle manifest")
        recorded = document.pop(CHECKSUM_KEY, None)
        if not isinstance(recorded, str):
            raise ManifestError(f"{MANIFEST} carries no {CHECKSUM_KEY}")
        if _canonical_sha256(document) != recorded:
            raise ManifestError(
                f"{MANIFEST} was altered after the bundle was built: its content does not match "
                f"its own checksum ({CHECKSUM_KEY} {recorded[:16]}...)"
            )
        version = document.get("format_version")
        if version != FORMAT_VERSION:
            raise ManifestError(
                f"bundle format version {version!r} is not the one this warren reads ({FORMAT_VERSION}): "
                "use the warren release the bundle was built with"
            )
        try:
            manifest = cls(
                built=_str(document["built"]),
                files=tuple(_entry(item) for item in _list(document["files"])),
                pins={
                    _str(section): {_str(k): _str(v) for k, v in _dict(values).items()}
                    for section, values in _dict(document["pins"]).items()
                },
                environments={
                    _str(name): tuple(_str(r) for r in _list(reqs))
                    for name, reqs in _dict(document["environments"]).items()
                },
                notes=tuple(_str(n) for n in _list(document["notes"])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{MANIFEST} is malformed ({exc})") from None
        seen: set[str] = set()
        for entry in manifest.files:
            if entry.path in seen:
                raise ManifestError(f"{MANIFEST} lists {entry.path} twice")
            seen.add(entry.path)
        return manifest


def _canonical_sha256(document: object) -> str:
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _str(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, found {value!r}")
    return value


def _list(value: object) -> list[object]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, found {type(value).__name__}")
    return cast(list[object], value)


def _dict(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, found {type(value).__name__}")
    return cast(dict[str, object], value)


def _entry(item: object) -> FileEntry:
    raw = _dict(item)
    path, size, sha = _str(raw["path"]), raw["size"], _str(raw["sha256"])
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ValueError(f"size of {path} is not a byte count")
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):  # noqa: PLR2004
        raise ValueError(f"sha256 of {path} is not a hex digest")
    if not is_safe_path(path) or path == MANIFEST:
        raise ValueError(f"unsafe or reserved path {path!r}")
    return FileEntry(path, size, sha)


def is_safe_path(path: str) -> bool:
    """A relative, normalised path that stays inside the bundle (no '..', no absolute path)."""
    return (
        bool(path)
        and not path.startswith("/")
        and "\\" not in path
        and "\x00" not in path
        and posixpath.normpath(path) == path
        and not any(part in ("", ".", "..") for part in path.split("/"))
    )


def hash_file(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def entries(sources: Mapping[str, Path]) -> tuple[FileEntry, ...]:
    """Manifest entries for bundle path -> file on disk."""
    result = []
    for rel in sorted(sources):
        if not is_safe_path(rel):
            raise ManifestError(f"refusing unsafe bundle path {rel!r}")
        size, sha = hash_file(sources[rel])
        result.append(FileEntry(rel, size, sha))
    return tuple(result)


def sha256sums(files: Iterable[FileEntry]) -> bytes:
    """The entries in `sha256sum` format, for checking with coreutils alone."""
    return "".join(f"{e.sha256}  {e.path}\n" for e in sorted(files, key=lambda e: e.path)).encode()
