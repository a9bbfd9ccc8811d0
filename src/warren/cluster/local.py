"""The local cluster: `warren cluster up | down | status | kubeconfig`.

Control-plane components run as processes this module starts and records (process.py).
A node (kubelet, container runtime, ...) plugs in through the `NodeProvider` protocol:
its components start after the control plane is ready and stop before it goes down,
and its teardown removes whatever host state it made.
"""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml
from warren_common.files import write_private
from warren_common.pki import Leaf, Pki

from warren.cluster.components import Component, Health, Layout, control_plane, leaves
from warren.cluster.process import Supervisor
from warren.config import ClusterConfig

STATE_MARKER = ".warren-cluster"  # `down --wipe` deletes only a directory that carries this
BIN_DIR_RECORD = "bin-dir"  # which binaries `up` used, so `down` finds the same tools


class ClusterError(RuntimeError):
    pass


@dataclass(frozen=True)
class ClusterContext:
    config: ClusterConfig
    layout: Layout
    advertise_address: str
    supervisor: Supervisor


class NodeProvider(Protocol):
    """A node joining the local cluster: certificates it needs, host state it prepares,
    components that start after the control plane, work once all is up, and a teardown
    that removes every piece of host state it made."""

    name: str

    def claim(self, ctx: ClusterContext) -> None:
        """Before anything starts: take what the node shares with its host, or raise
        ClusterError naming who holds it."""
        ...

    def leaves(self, ctx: ClusterContext) -> Sequence[Leaf]: ...

    def prepare(self, ctx: ClusterContext) -> None: ...

    def components(self, ctx: ClusterContext) -> Sequence[Component]: ...

    def after_up(self, ctx: ClusterContext) -> None: ...

    def teardown(self, ctx: ClusterContext, wipe: bool) -> list[str]:
        """Undo what the node made on the host; returns the names of processes it stopped."""
        ...


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    pid: int | None
    healthy: bool
    detail: str
    log: Path


def primary_ipv4() -> str:
    """The address of the interface that carries the default route (read, nothing is sent)."""
    routes = json.loads(
        subprocess.run(
            ["ip", "-j", "-4", "route", "show", "default"], capture_output=True, text=True, check=True
        ).stdout
        or "[]"
    )
    if not routes:
        raise ClusterError(
            "no default IPv4 route to pick an advertise address from: set cluster.advertise_address"
        )
    if routes[0].get("prefsrc"):
        return str(routes[0]["prefsrc"])
    addrs = json.loads(
        subprocess.run(
            ["ip", "-j", "-4", "addr", "show", "dev", routes[0]["dev"]],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    for link in addrs:
        for info in link.get("addr_info", []):
            if info.get("family") == "inet":
                return str(info["local"])
    raise ClusterError(f"interface {routes[0]['dev']} has no IPv4 address: set cluster.advertise_address")


def probe(health: Health, timeout: float = 3.0) -> tuple[bool, str]:
    """Check a component's health: (healthy, short detail)."""
    if health.command:
        try:
            result = subprocess.run(
                health.command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return False, str(exc)
        lines = (result.stdout or result.stderr).strip().splitlines()
        return result.returncode == 0, lines[-1] if lines else f"exit {result.returncode}"
    context = None
    if health.url.startswith("https://"):
        context = ssl.create_default_context(cafile=str(health.ca) if health.ca else None)
        if health.client_cert:
            context.load_cert_chain(str(health.client_cert[0]), str(health.client_cert[1]))
    try:
        with urllib.request.urlopen(health.url, timeout=timeout, context=context) as response:  # noqa: S310  # our own loopback endpoints
            body = response.read(200).decode(errors="replace").strip()
            return response.status == 200, body or str(response.status)  # noqa: PLR2004
    except urllib.error.HTTPError as exc:
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, str(reason)


def ensure_running(
    supervisor: Supervisor, component: Component, timeout: int, progress: Callable[[str], None]
) -> None:
    """Leave a component alone if it runs with the same command line and is healthy; else
    (re)start it and wait until it is healthy. Also used for processes of the local
    deployment that are not part of the cluster's plan (the control plane)."""
    record = supervisor.running(component.name)
    if record is not None and record.digest == component.spec.digest:
        healthy, _ = probe(component.health)
        if healthy:
            progress(f"{component.name}: running (pid {record.pid})")
            if component.after_healthy:
                component.after_healthy()
            return
    binary = Path(shutil.which(component.spec.argv[0]) or component.spec.argv[0])
    if not binary.is_file():
        raise ClusterError(
            f"{binary} is missing: build the cluster binaries with tools/build-cluster-binaries.sh "
            "and pass the directory it prints with --bin-dir (or WARREN_BIN_DIR)"
        )
    if record is not None:
        progress(f"{component.name}: restarting (configuration changed or unhealthy)")
        supervisor.stop(component.name)
    record = supervisor.start(component.spec)
    progress(f"{component.name}: started (pid {record.pid}), waiting for health")
    wait_healthy(supervisor, component, timeout, progress)


def wait_healthy(
    supervisor: Supervisor, component: Component, timeout: int, progress: Callable[[str], None]
) -> None:
    deadline = time.monotonic() + timeout
    detail = ""
    while time.monotonic() < deadline:
        if supervisor.running(component.name) is None:
            raise ClusterError(
                f"{component.name} exited during start-up; last lines of "
                f"{supervisor.log_path(component.name)}:\n{tail(supervisor.log_path(component.name))}"
            )
        healthy, detail = probe(component.health)
        if healthy:
            progress(f"{component.name}: healthy")
            if component.after_healthy:
                component.after_healthy()
            return
        time.sleep(0.5)
    raise ClusterError(
        f"{component.name} not healthy after {timeout}s "
        f"({component.health.url}: {detail}); see {supervisor.log_path(component.name)}"
    )


EXTRAS_ORDER = {
    "warren-control": 0,
    "warren-blockd-csi": 1,
    "warren-blockd": 2,
    "warren-objects": 3,
    "warren-postgres": 4,
}
EXTRAS_STOP_TIMEOUT = {"warren-blockd": 180.0}


class LocalCluster:
    def __init__(
        self,
        config: ClusterConfig,
        state_dir: Path,
        bin_dir: Path,
        nodes: Sequence[NodeProvider] = (),
        progress: Callable[[str], None] = lambda _msg: None,
    ) -> None:
        self.config = config
        self.layout = Layout(state_dir=state_dir, bin_dir=bin_dir)
        self.supervisor = Supervisor(state_dir)
        self.nodes = list(nodes)
        self.progress = progress

    @property
    def kubeconfig(self) -> Path:
        return self.layout.admin_kubeconfig

    def _context(self) -> ClusterContext:
        advertise = self.config.advertise_address or primary_ipv4()
        return ClusterContext(self.config, self.layout, advertise, self.supervisor)

    def _components(self, ctx: ClusterContext) -> list[Component]:
        components = control_plane(self.config, self.layout, ctx.advertise_address)
        for node in self.nodes:
            components.extend(node.components(ctx))
        return components

    # -- up ---------------------------------------------------------------------------

    def up(self) -> None:
        """Bring every component to running and healthy; leave healthy ones alone."""
        ctx = self._context()
        state = self.layout.state_dir
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        (state / STATE_MARKER).touch()
        (state / BIN_DIR_RECORD).write_text(f"{self.layout.bin_dir.resolve()}\n")
        for node in self.nodes:
            node.claim(ctx)
        self._ensure_pki(ctx)
        self._write_kubeconfigs()
        for component in control_plane(self.config, self.layout, ctx.advertise_address):
            self._ensure_running(component)
        # Nodes join once the API server answers: their preparation may create objects.
        for node in self.nodes:
            node.prepare(ctx)
            for component in node.components(ctx):
                self._ensure_running(component)
            node.after_up(ctx)
        self.progress(f"cluster ready; admin kubeconfig: {self.kubeconfig}")

    def _ensure_pki(self, ctx: ClusterContext) -> None:
        pki = Pki(self.layout.pki)
        pki.ensure_ca("ca", "warren-ca")
        pki.ensure_ca("etcd-ca", "warren-etcd-ca")
        pki.ensure_ca("front-proxy-ca", "warren-front-proxy-ca")
        wanted = leaves(self.config, ctx.advertise_address)
        for node in self.nodes:
            wanted.extend(node.leaves(ctx))
        for leaf in wanted:
            pki.ensure_leaf(leaf)
        pki.ensure_keypair("sa")
        if pki.issued:
            self.progress(f"issued {', '.join(pki.issued)}")

    def _write_kubeconfigs(self) -> None:
        server = f"https://127.0.0.1:{self.config.api_port}"
        for user, cert in (
            ("admin", "admin"),
            ("controller-manager", "controller-manager"),
            ("scheduler", "scheduler"),
        ):
            write_kubeconfig(
                self.layout.kubeconfig(user),
                server,
                self.layout.crt("ca"),
                self.layout.crt(cert),
                self.layout.key(cert),
                user=user,
            )

    def _ensure_running(self, component: Component) -> None:
        ensure_running(self.supervisor, component, self.config.ready_timeout_seconds, self.progress)

    # -- down -------------------------------------------------------------------------

    def down(self, wipe: bool = False) -> list[str]:
        """Stop every process this cluster started, newest first; optionally wipe state."""
        stopped = []
        ctx = None
        try:
            ctx = self._context()
            names = [c.name for c in self._components(ctx)]
        except ClusterError:
            names = []
        # Anything with a record counts, even a component no longer in the plan. Processes
        # outside the plan (the control plane) use the cluster, so they stop before the node.
        run_dir = self.supervisor.run_dir
        recorded = sorted(p.stem for p in run_dir.glob("*.json")) if run_dir.is_dir() else []
        # Users before what they use: the control plane, the CSI plugin, the workspace daemon
        # (given time to flush what it holds to the object store), the object store.
        extras = sorted((n for n in recorded if n not in names), key=lambda n: EXTRAS_ORDER.get(n, 0))
        for name in extras:
            if self.supervisor.stop(name, timeout=EXTRAS_STOP_TIMEOUT.get(name, 20.0)):
                stopped.append(name)
                self.progress(f"{name}: stopped")
        for node in reversed(self.nodes):
            if ctx is not None:
                stopped += node.teardown(ctx, wipe)
        for name in reversed(names):
            if self.supervisor.stop(name):
                stopped.append(name)
                self.progress(f"{name}: stopped")
        if wipe:
            self.wipe()
        return stopped

    def wipe(self) -> None:
        state = self.layout.state_dir
        if not state.exists():
            return
        if not (state / STATE_MARKER).exists():
            raise ClusterError(f"refusing to wipe {state}: it does not look like a Warren cluster state")
        # Deleting through a live mount would delete what is mounted (a pod's host path,
        # an overlay's lower layer): refuse while anything under the state is mounted.
        mounted = mounts_under(state)
        if mounted:
            raise ClusterError(f"refusing to wipe {state}: still mounted: {', '.join(mounted[:5])}")
        shutil.rmtree(state)
        self.progress(f"wiped {state}")

    # -- status -----------------------------------------------------------------------

    def status(self) -> list[ComponentStatus]:
        ctx = self._context()
        result = []
        for component in self._components(ctx):
            record = self.supervisor.running(component.name)
            if record is None:
                healthy, detail = False, "not running"
            else:
                healthy, detail = probe(component.health)
            result.append(
                ComponentStatus(
                    component.name,
                    record.pid if record else None,
                    healthy,
                    detail,
                    self.supervisor.log_path(component.name),
                )
            )
        return result


def write_kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, *, user: str) -> None:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "warren", "cluster": {"server": server, "certificate-authority-data": b64(ca)}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}
        ],
        "contexts": [{"name": f"{user}@warren", "context": {"cluster": "warren", "user": user}}],
        "current-context": f"{user}@warren",
    }
    write_private(path, yaml.safe_dump(doc, sort_keys=False))


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first (the order to unmount them in)."""
    prefix = str(root.resolve())
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
