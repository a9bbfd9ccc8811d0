"""Files only their owner may read: keys, kubeconfigs, tokens, database URLs."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_private(path: Path, data: str | bytes) -> bool:
    """Write `data` to `path` (mode 0600) unless it holds exactly that already; True if it
    was written. The new content is made 0600 beside it, never readable by others for a
    moment, synced, then renamed into place: a reader sees the old file or the new one, and a
    crash leaves one of them whole."""
    content = data.encode() if isinstance(data, str) else data
    with contextlib.suppress(OSError):
        if path.is_file() and path.read_bytes() == content:
            return False
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True
