"""The bundle's cache: slow parts kept under $WARREN_CACHE/bundle, each keyed by its pins.

A part is built into `<name>-<key>.partial` and renamed to `<name>-<key>` when complete, so
an interrupted build never leaves a half-filled directory that a later build would trust.
A changed pin gives a new key, hence a new directory; old ones stay until removed by hand.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from warren import paths


def default_root() -> Path:
    return paths.cache_dir() / "bundle"


def key(*parts: bytes | str) -> str:
    """16 hex digits over the parts (length-prefixed, so ("ab", "c") != ("a", "bc"))."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(f"{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()[:16]


def start(final: Path) -> Path:
    """A fresh `.partial` directory to build `final` in."""
    partial = final.with_name(final.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    return partial


def finish(partial: Path, final: Path) -> Path:
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    return final


@contextmanager
def locked(root: Path, progress: Callable[[str], None]) -> Iterator[None]:
    """One build at a time per cache: a second waits for the first instead of sharing its parts."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"another bundle build is using {root}: waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
