"""Where the local deployment's control plane keeps its state: `warren platform ready
--record` (the workloads role of playbooks/site.yml with the local inventory) or, for
services run on hosts, the control_plane role makes it; `warren sandbox` reads it. It is one
directory of the cluster's state, 0700, kept across runs:

    records.db             the records, when SQLite holds them (the service migrates them)
    stamp.key              the edge's identity-stamp key (0600), made once
    api-key                the first API key, of the organization `default` (0600), made once
    controller.kubeconfig  the warren-controller ServiceAccount's kubeconfig (0600)
    url                    where the edge listens, for `warren sandbox`
With Warren's services as workloads only `api-key` and `url` are here: the rest lives in
Secrets in warren-system.
    control.env            the records' database URL (0600), read by the service
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from warren_common.files import write_private

PROCESS = "warren-control"
STATE = "control-plane"


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def control_env(self) -> Path:
        return self.root / "control.env"

    @property
    def database_url(self) -> str:
        """The records' URL the service was given (PostgreSQL's, or the SQLite file's)."""
        for line in self.control_env.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "WARREN_DATABASE_URL":
                return value.strip()
        raise ValueError(f"{self.control_env} names no WARREN_DATABASE_URL: run playbooks/site.yml")

    @property
    def stamp_key(self) -> Path:
        return self.root / "stamp.key"

    @property
    def api_key(self) -> Path:
        return self.root / "api-key"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "controller.kubeconfig"

    @property
    def url(self) -> Path:
        return self.root / "url"


def layout(cluster_state: Path) -> Layout:
    return Layout(cluster_state / STATE)


def local_url(cluster_state: Path) -> str | None:
    """The edge's URL of the control plane deployed here, if one was."""
    found = layout(cluster_state).url
    return found.read_text().strip() if found.is_file() else None


def local_api_key(cluster_state: Path) -> str | None:
    """The deployment's first API key, if this user may read it."""
    try:
        return layout(cluster_state).api_key.read_text().strip() or None
    except OSError:
        return None


def record(root: Path, url: str, api_key: str | None) -> bool:
    """Write where the edge answers and, when given, the first API key; True if either
    changed. The directory is made 0700 (it holds a credential)."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    root.chmod(0o700)
    changed = write_private(root / "url", f"{url}\n")
    if api_key is not None:
        changed = write_private(root / "api-key", f"{api_key}\n") or changed
    return changed
