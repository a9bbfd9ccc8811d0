"""Where the local deployment's workspace layer lives (the object_store and blockd roles run
it: playbooks/site.yml with the local inventory), for the tools and tests that talk to it.

    warren-objects      SeaweedFS (`weed mini`) on loopback, its data in workspaces/objects
    warren-blockd       the workspace daemon, its node state in workspaces/blockd
    warren-blockd-csi   the CSI node plugin, registered with the node's kubelet

They come from warren-blockd's own environment (its pins cannot share one with the
platform's Kubernetes client): WARREN_BLOCKD_ENV, else packages/warren-blockd/.venv beside
this repository.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

OBJECTS = "warren-objects"
BLOCKD = "warren-blockd"
CSI = "warren-blockd-csi"
STATE = "workspaces"


def blockd_env() -> Path:
    """warren-blockd's environment: WARREN_BLOCKD_ENV, else the repository's packages/warren-blockd/.venv."""
    if named := os.environ.get("WARREN_BLOCKD_ENV"):
        return Path(named)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "packages" / "warren-blockd" / ".venv"
        if candidate.is_dir():
            return candidate
    return Path(sys.prefix)


@dataclass(frozen=True)
class Layout:
    root: Path  # <cluster state>/workspaces

    @property
    def objects(self) -> Path:
        return self.root / "objects"

    @property
    def blockd_state(self) -> Path:
        return self.root / "blockd"

    @property
    def blockd_socket(self) -> Path:
        return self.root / "blockd.sock"

    @property
    def credentials(self) -> Path:
        """The object store's S3 credentials (an environment file, 0600)."""
        return self.root / "object-store" / "credentials.env"


def layout(cluster_state: Path) -> Layout:
    return Layout(cluster_state / STATE)
