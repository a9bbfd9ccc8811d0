"""The mount table (/proc/self/mountinfo) and the bind mounts that put a workspace at a pod's
volume path."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_ESCAPE = re.compile(r"\\([0-7]{3})")  # mountinfo writes space, tab, newline, '\' as octal


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    device: str  # major:minor of the filesystem
    root: str  # the directory of that filesystem mounted here (a bind may mount a subtree)
    mount_point: str
    options: frozenset[str]  # per-mount: rw/ro, nosuid, nodev, noexec, ...
    fstype: str
    source: str

    @property
    def readonly(self) -> bool:
        return "ro" in self.options


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse(text: str) -> list[MountEntry]:
    entries = []
    for line in text.splitlines():
        fields = line.split(" ")
        sep = fields.index("-")  # optional fields (shared:N, master:N) come before it
        entries.append(
            MountEntry(
                mount_id=int(fields[0]),
                device=fields[2],
                root=_unescape(fields[3]),
                mount_point=_unescape(fields[4]),
                options=frozenset(fields[5].split(",")),
                fstype=fields[sep + 1],
                source=_unescape(fields[sep + 2]),
            )
        )
    return entries


def mount_at(path: Path) -> MountEntry | None:
    """The mount on top at exactly `path` (the last one mounted there), or None."""
    where = str(path.resolve())
    found = None
    for entry in parse(MOUNTINFO.read_text()):
        if entry.mount_point == where:
            found = entry
    return found


class MountError(RuntimeError):
    pass


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise MountError(f"{' '.join(cmd)} failed: {done.stderr.strip() or done.returncode}")


def bind(source: Path, target: Path, *, readonly: bool) -> MountEntry:
    """Bind `source` at `target` nosuid,nodev (and ro if asked), and prove it from the mount
    table: a bind that came up without those flags is taken down again."""
    options = "nosuid,nodev" + (",ro" if readonly else "")
    _run("mount", "--bind", "-o", options, str(source), str(target))
    entry = mount_at(target)
    wanted = {"nosuid", "nodev"} | ({"ro"} if readonly else set())
    if entry is None or not wanted <= entry.options:
        unmount(target)
        have = ",".join(sorted(entry.options)) if entry else "nothing"
        raise MountError(f"the bind mount at {target} came up with {have}, not {options}")
    return entry


def unmount(target: Path) -> None:
    _run("umount", str(target))
