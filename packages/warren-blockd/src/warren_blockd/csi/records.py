"""What is published where: one small JSON file per volume on node disk, written before the
first mount, so a restarted plugin still knows which workspace an unpublish is about."""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

# Kubelet names an inline volume `csi-<sha256>`; the id becomes a file name here.
VOLUME_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Publication:
    volume_id: str
    workspace: str
    target_path: str
    readonly: bool
    pod: str  # namespace/name, for the logs
    pod_uid: str = ""  # what a bind names the pod by
    # A bind into a running container's root file system (`<rootfs>/workspace`) instead of
    # the volume's target: where it is, so the unpublish takes it down if it is still there.
    bound_at: str = ""
    # A bindAtClaim volume not bound yet: its workspace is "" and nothing is mounted.

    @property
    def awaiting(self) -> bool:
        return not self.workspace


class Records:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)

    def _path(self, volume_id: str) -> Path:
        return self.dir / f"{volume_id}.json"

    def get(self, volume_id: str) -> Publication | None:
        try:
            return Publication(**json.loads(self._path(volume_id).read_text()))
        except FileNotFoundError:
            return None

    def all(self) -> list[Publication]:
        return [Publication(**json.loads(p.read_text())) for p in sorted(self.dir.glob("*.json"))]

    def save(self, publication: Publication) -> None:
        path = self._path(publication.volume_id)
        tmp = path.with_suffix(".tmp")
        with tmp.open("w") as f:
            json.dump(asdict(publication), f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)

    def delete(self, volume_id: str) -> None:
        self._path(volume_id).unlink(missing_ok=True)
