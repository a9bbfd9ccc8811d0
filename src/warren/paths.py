"""Where Warren keeps its state on this machine (one documented place, see docs/)."""

from __future__ import annotations

import os
from pathlib import Path


def warren_home() -> Path:
    """$WARREN_HOME, else /var/lib/warren for root, else $XDG_STATE_HOME/warren."""
    if env := os.environ.get("WARREN_HOME"):
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/warren")
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "warren"


def cluster_state_dir() -> Path:
    return warren_home() / "cluster"


def admin_kubeconfig() -> Path:
    """The local cluster's admin kubeconfig: $WARREN_HOME/cluster/admin.kubeconfig."""
    return cluster_state_dir() / "admin.kubeconfig"


def cache_dir() -> Path:
    """Build cache (Go modules, Go build cache, built binaries): $WARREN_CACHE."""
    return Path(os.environ.get("WARREN_CACHE") or Path.home() / ".cache" / "warren")
