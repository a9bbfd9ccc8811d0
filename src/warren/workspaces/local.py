"""The workspace layer as processes of the local deployment: `warren workspaces up|status|down`.

After `warren cluster up` and `warren apply` (which installs the CSIDriver object), `up` runs
three processes under the cluster's own Supervisor, so `warren cluster down` stops them too:

    warren-objects      SeaweedFS (`weed mini`) on loopback, its data in objects/
    warren-blockd       the workspace daemon, its node state in blockd/, storing in the bucket
    warren-blockd-csi   the CSI node plugin, registered with the node's kubelet

They come from warren-blockd's own environment (its pins cannot share one with the platform's
Kubernetes client), whose location `up` is told or finds beside this repository. The daemon
runs as root: FUSE, loop devices and mounts.

The workspaces outlive every process here: stopping the layer flushes them to the object
store, and the next `up` restores from there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warren.cluster.components import Component, Health
from warren.cluster.local import ClusterError, ComponentStatus, ensure_running, probe
from warren.cluster.process import ProcessSpec, Supervisor
from warren.config import WarrenConfig
from warren.node.layout import NodeLayout
from warren.render import WORKSPACE_DRIVER as DRIVER

OBJECTS = "warren-objects"
BLOCKD = "warren-blockd"
CSI = "warren-blockd-csi"
STATE = "workspaces"
# SeaweedFS mini's servers, in port order from the configured base.
SEAWEED_PORTS = ("master", "volume", "filer", "s3", "admin", "webdav")
# The object store listens on loopback only and takes any key; the daemon still signs its
# requests, so an S3 store that checks keys needs only these two values changed.
S3_ENV = {"AWS_ACCESS_KEY_ID": "warren", "AWS_SECRET_ACCESS_KEY": "warren-local-only"}


def default_blockd_env() -> Path:
    """warren-blockd's environment when none is named: the repository's packages/warren-blockd/.venv."""
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


class LocalWorkspaces:
    def __init__(
        self,
        config: WarrenConfig,
        cluster_state: Path,
        blockd_env: Path | None = None,
        progress: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.config = config
        self.settings = config.cluster.workspaces
        self.cluster_state = cluster_state
        self.layout = Layout(cluster_state / STATE)
        self.node = NodeLayout(cluster_state / "node")
        self.supervisor = Supervisor(cluster_state)
        self.env = blockd_env or Path(os.environ.get("WARREN_BLOCKD_ENV") or default_blockd_env())
        self.progress = progress

    # -- the processes ------------------------------------------------------------------

    def tool_path(self, name: str) -> Path:
        return self.env / "bin" / name

    def _tool(self, name: str) -> str:
        path = self.tool_path(name)
        if not path.is_file():
            raise ClusterError(
                f"{path} is missing: install warren-blockd's environment first "
                "(make packages/warren-blockd/.venv/.installed), or name it with WARREN_BLOCKD_ENV"
            )
        return str(path)

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.settings.s3_port}"

    def objects(self) -> Component:
        base = self.settings.base_port
        ports = [f"-{name}.port={base + i}" for i, name in enumerate(SEAWEED_PORTS)]
        # No anonymous usage reports: the store never calls out of the machine.
        argv = (
            self._tool("weed"),
            "mini",
            f"-dir={self.layout.objects}",
            "-ip=127.0.0.1",
            "-master.telemetry=false",
            *ports,
        )
        return Component(
            ProcessSpec(OBJECTS, argv),
            Health(f"http://127.0.0.1:{base}/cluster/status"),
            after_healthy=self._ensure_bucket,
        )

    def _ensure_bucket(self) -> None:
        # The S3 gateway answers before its filer is ready: the helper retries for a while.
        # Create and accept "already yours": a listing may not show a bucket to every key.
        script = (
            "import sys, time, boto3\n"
            "s3 = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1')\n"
            "mine = (s3.exceptions.BucketAlreadyOwnedByYou, s3.exceptions.BucketAlreadyExists)\n"
            "deadline = time.monotonic() + 60\n"
            "while True:\n"
            "    try:\n"
            "        s3.create_bucket(Bucket=sys.argv[2])\n"
            "        break\n"
            "    except mine:\n"
            "        break\n"
            "    except Exception:\n"
            "        if time.monotonic() > deadline:\n"
            "            raise\n"
            "        time.sleep(0.5)\n"
        )
        result = subprocess.run(
            [self._tool("python"), "-c", script, self.s3_endpoint, self.settings.bucket],
            capture_output=True,
            text=True,
            env={**os.environ, **S3_ENV},
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise ClusterError(f"cannot make bucket {self.settings.bucket}: {result.stderr.strip()[-500:]}")

    def blockd(self) -> Component:
        socket = str(self.layout.blockd_socket)
        argv = (
            self._tool("warren-blockd"),
            f"--socket={socket}",
            "serve",
            f"--store=s3://{self.settings.bucket}",
            f"--s3-endpoint={self.s3_endpoint}",
            f"--state-dir={self.layout.blockd_state}",
        )
        health = Health(command=(self._tool("warren-blockd"), f"--socket={socket}", "stats"))
        return Component(ProcessSpec(BLOCKD, argv, env=dict(S3_ENV)), health)

    @property
    def plugin_dir(self) -> Path:
        return self.node.kubelet_root / "plugins" / DRIVER

    @property
    def registration_dir(self) -> Path:
        return self.node.kubelet_root / "plugins_registry"

    def csi(self, node_name: str) -> Component:
        endpoint = self.plugin_dir / "csi.sock"
        argv = (
            self._tool("warren-blockd"),
            "csi",
            f"--endpoint=unix://{endpoint}",
            f"--registration-dir={self.registration_dir}",
            f"--node-id={node_name}",
            f"--blockd-socket={self.layout.blockd_socket}",
            f"--kubelet-plugin-dir={self.plugin_dir}",
            f"--replicate-wait={self.settings.replicate_wait_seconds}",
        )
        registration = self.registration_dir / f"{DRIVER}-reg.sock"
        health = Health(command=("sh", "-c", f'test -S "{endpoint}" && test -S "{registration}"'))
        return Component(ProcessSpec(CSI, argv), health)

    def components(self, node_name: str) -> list[Component]:
        return [self.objects(), self.blockd(), self.csi(node_name)]

    # -- up / status / down -------------------------------------------------------------

    def up(self, node_name: str) -> None:
        if not self.settings.enabled:
            raise ClusterError("the workspace layer is disabled (cluster.workspaces.enabled: false)")
        if not (self.cluster_state / "admin.kubeconfig").is_file():
            raise ClusterError("no local cluster: run `warren cluster up` and `warren apply` first")
        if not self.node.kubelet_root.is_dir():
            raise ClusterError("the local cluster has no node: the workspace layer serves the node's pods")
        for directory in (self.layout.root, self.layout.objects, self.layout.blockd_state):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.registration_dir.mkdir(parents=True, exist_ok=True)
        timeout = self.config.cluster.ready_timeout_seconds
        for component in self.components(node_name):
            ensure_running(self.supervisor, component, timeout, self.progress)

    def status(self, node_name: str) -> list[ComponentStatus]:
        rows = []
        for component in self.components(node_name):
            name = component.spec.name
            record = self.supervisor.running(name)
            healthy, detail = probe(component.health) if record else (False, "not running")
            rows.append(
                ComponentStatus(
                    name, record.pid if record else None, healthy, detail, self.supervisor.log_path(name)
                )
            )
        return rows

    def down(self) -> list[str]:
        """Stop the plugin, then the daemon (which flushes what it holds), then the store."""
        timeouts = {BLOCKD: 180.0}
        return [
            name
            for name in (CSI, BLOCKD, OBJECTS)
            if self.supervisor.stop(name, timeout=timeouts.get(name, 20.0))
        ]
