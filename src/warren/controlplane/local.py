"""warren-control as a process of the local deployment: `warren control-plane up|status|down`.

After `warren cluster up` and `warren apply`, `up` runs `warren-control serve --role all` (edge,
API, controller and whatever else `all` holds) under the cluster's own Supervisor, so its pid
record and log sit beside the cluster's and `warren cluster down` stops it too. Its state lives
in one directory of the cluster's state, created 0700 and kept across runs:

    records.db             the records (SQLite), migrated by every `up`
    stamp.key              the edge's identity-stamp key (0600), made once
    api-key                the first API key, of the organization `default` (0600), made once
    controller.kubeconfig  the warren-controller ServiceAccount's kubeconfig (0600)
    url                    where the edge listens, for `warren sandbox`

A second `up` with nothing changed leaves the process, the key and the records as they are.
"""

from __future__ import annotations

import secrets
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warren.cluster.components import Component, Health
from warren.cluster.local import ClusterError, ComponentStatus, ensure_running, probe
from warren.cluster.process import ProcessSpec, Supervisor
from warren.config import WarrenConfig
from warren.controlplane import access
from warren.workspaces.local import S3_ENV, LocalWorkspaces

PROCESS = "warren-control"
STATE = "control-plane"
ORG = "default"
USER = "admin"


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def database(self) -> Path:
        return self.root / "records.db"

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.database}"

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


def write_private(path: Path, text: str) -> bool:
    """Write a 0600 file unless it already holds exactly `text`; True if it was written."""
    from warren_control.admin import write_secret

    if path.is_file() and path.read_text() == text:
        return False
    write_secret(path, text)
    return True


def _answers(url: str) -> bool:
    """Whether anything speaks HTTP at `url` (the edge answers 401 without a key)."""
    try:
        with urllib.request.urlopen(url, timeout=3):  # noqa: S310  # our own loopback endpoint
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


class LocalControlPlane:
    def __init__(
        self,
        config: WarrenConfig,
        cluster_state: Path,
        progress: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.config = config
        self.settings = config.cluster.control_plane
        self.cluster_state = cluster_state
        self.layout = layout(cluster_state)
        self.supervisor = Supervisor(cluster_state)
        self.progress = progress

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.edge_port}"

    @property
    def log(self) -> Path:
        return self.supervisor.log_path(PROCESS)

    def component(self) -> Component:
        """The one process. Its command line holds paths only, never a secret."""
        s, files = self.settings, self.layout
        argv = [
            sys.executable,  # the environment `warren` runs in, which has warren-control installed
            "-m",
            "warren_control.cli",
            "serve",
            "--role=all",
            "--host=127.0.0.1",
            f"--port={s.edge_port}",
            f"--api-port={s.api_port}",
            f"--database-url={files.database_url}",
            f"--stamp-key-file={files.stamp_key}",
            f"--kubeconfig={files.kubeconfig}",
            f"--sandbox-namespace={self.config.isolation.default_namespace}",
            # The local node has no registry: its images are imported archives (node/images.py).
            "--image-pull-policy=Never",
        ]
        env = {"PYTHONUNBUFFERED": "1"}
        if self.config.cluster.sandbox_workspaces:
            # The API reads what the nodes proved to the object store with blockd's own tool.
            layer = LocalWorkspaces(self.config, self.cluster_state)
            argv += [
                "--workspaces",
                f"--workspace-store=s3://{layer.settings.bucket}",
                f"--workspace-store-endpoint={layer.s3_endpoint}",
                f"--workspace-store-tool={layer.tool_path('warren-blockd')}",
            ]
            env.update(S3_ENV)
        spec = ProcessSpec(PROCESS, tuple(argv), env=env)
        return Component(
            spec, Health(f"http://127.0.0.1:{s.api_port}/healthz"), after_healthy=self._wait_for_edge
        )

    def _wait_for_edge(self) -> None:
        # The API answers first; the edge comes up a moment later in the same process.
        deadline = time.monotonic() + 30
        while not _answers(f"{self.url}/v1/sandboxes"):
            if time.monotonic() > deadline or self.supervisor.running(PROCESS) is None:
                raise ClusterError(f"the edge does not answer at {self.url}; see {self.log}")
            time.sleep(0.5)

    def up(self) -> str | None:
        """Converge the control plane; returns the API key if this run made it (first run)."""
        admin_kubeconfig = self.cluster_state / "admin.kubeconfig"
        if not admin_kubeconfig.is_file():
            raise ClusterError("no local cluster: run `warren cluster up` and `warren apply` first")
        self.layout.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.layout.root.chmod(0o700)
        # The process reads these files when it starts: a new one means a restart.
        renewed = False
        if not self.layout.stamp_key.is_file():
            renewed = write_private(self.layout.stamp_key, secrets.token_urlsafe(48) + "\n")
            self.progress(f"made the identity stamp key {self.layout.stamp_key}")
        try:
            token = access.service_account_token(admin_kubeconfig)
        except (access.AccessError, OSError) as exc:
            raise ClusterError(str(exc)) from None
        kubeconfig = access.kubeconfig_for_token(admin_kubeconfig, token)
        if write_private(self.layout.kubeconfig, kubeconfig):
            renewed = True
            self.progress(f"wrote {self.layout.kubeconfig} ({access.NAMESPACE}/{access.SERVICE_ACCOUNT})")
        from warren_control.admin import bootstrap

        issued = bootstrap(self.layout.database_url, self.layout.api_key, org_name=ORG, subject=USER)
        if issued:
            self.progress(f"organization {ORG!r}, user {USER!r} and an API key made")
        elif not self.layout.api_key.is_file():
            self.progress(
                f"{self.layout.api_key} is gone (its key works until revoked); issue another with "
                f"`warren-control admin issue-key {ORG} {USER} --database-url {self.layout.database_url}`"
            )
        write_private(self.layout.url, self.url + "\n")
        if renewed and self.supervisor.stop(PROCESS):
            self.progress(f"{PROCESS}: stopped to start again with its new credentials")
        timeout = self.config.cluster.ready_timeout_seconds
        ensure_running(self.supervisor, self.component(), timeout, self.progress)
        return issued

    def status(self) -> ComponentStatus:
        component = self.component()
        record = self.supervisor.running(PROCESS)
        healthy, detail = probe(component.health) if record else (False, "not running")
        if record is not None and record.digest != component.spec.digest:
            detail = "running with another configuration: run `warren control-plane up`"
        return ComponentStatus(PROCESS, record.pid if record else None, healthy, detail, self.log)

    def down(self) -> bool:
        """Stop the process; its records, keys and kubeconfig stay for the next `up`."""
        return self.supervisor.stop(PROCESS)


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
