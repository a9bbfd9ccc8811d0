"""A joined node: a further kubelet of the local cluster on this same machine.

Each joined node (cluster.joined_nodes) has a network namespace of its own, linked to the
host by a veth pair (a /30 of cluster.link_cidr) with its pod range routed through it, and
a mount namespace of its own in which the cluster state's `node/` directory is the joined
node's own directory. Inside those namespaces the same code as the first node's runs
(provider.LocalNode with a Seat): containerd with runsc, the CNI bridge and the egress
floor's nftables table, the kubelet (its pods under a cgroup root of its own) and
kube-proxy. Warren's DaemonSets find their host paths there unchanged, and everything the
node mounts stays in its mount namespace, which goes away with it.

The host runs this module's `up` and `down` inside the namespaces (nsenter), so that every
process the node starts inherits them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from warren_common.pki import Leaf

from warren.cluster.components import Component, Layout
from warren.cluster.local import (
    BIN_DIR_RECORD,
    ClusterContext,
    ClusterError,
    ensure_running,
    write_kubeconfig,
)
from warren.cluster.process import Supervisor
from warren.config import JOINED_LINK_PREFIX, WarrenConfig
from warren.node.provider import LocalNode, Seat
from warren.node.workloads import NODE_DIR

MOUNT_NS_DIR = Path("/run/warren/mountns")  # a private mount: namespaces are bound to files here
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Host paths a node keeps state in that are not under the cluster state: each joined node
# gets its own, private to its mount namespace (directory, or None for an empty tmpfs).
# /run/netns too: another node's teardown deletes the pod namespaces it finds there unused.
PRIVATE = {
    "/run/warren": None,
    "/run/containerd": None,
    "/run/netns": None,
    "/var/lib/cni": "cni",
    "/var/log/pods": "pod-logs",
}


def _run(*argv: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(map(str, argv))} failed: {result.stderr.strip()}")
    return result


@dataclass(frozen=True)
class JoinedLayout(Layout):
    """The cluster's layout as a joined node sees it: its own kubeconfigs (which reach the
    API server at the host's address, not at loopback)."""

    node: str = ""

    def kubeconfig(self, user: str) -> Path:
        return self.state_dir / "nodes" / self.node / f"{user}.kubeconfig"


@dataclass(frozen=True)
class Site:
    """Where one joined node lives on the host."""

    state: Path
    name: str
    host_address: str
    address: str
    pod_subnet: str

    @classmethod
    def of(cls, config: WarrenConfig, state: Path, index: int) -> Site:
        host, address, pods = config.cluster.joined_node_site(index)
        return cls(state.resolve(), config.cluster.joined_nodes[index].name, host, address, pods)

    @property
    def netns(self) -> str:
        return f"warren-{self.name}"

    @property
    def link(self) -> str:
        return f"{JOINED_LINK_PREFIX}{self.name}"

    @property
    def mount_ns(self) -> Path:
        state = hashlib.sha256(str(self.state).encode()).hexdigest()[:12]
        return MOUNT_NS_DIR / f"{self.name}-{state}"

    @property
    def root(self) -> Path:
        """Its own files: `node/` (seen as the state's `node/` inside), logs, records."""
        return self.state / "nodes" / self.name

    @property
    def cgroup(self) -> str:
        return f"warren-{self.name}"

    def enter(self) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.netns}", f"--mount={self.mount_ns}", "--"]

    def seat(self, api_address: str) -> Seat:
        return Seat(
            name=self.name,
            address=self.address,
            api_address=api_address,
            pod_subnet=self.pod_subnet,
            cgroup_root=f"/{self.cgroup}",
            host_address=self.host_address,
        )


# -- on the host ---------------------------------------------------------------------------


class JoinedNode:
    """The NodeProvider the host's LocalCluster drives for one joined node."""

    def __init__(
        self, config: WarrenConfig, index: int, progress: Callable[[str], None] = lambda _m: None
    ) -> None:
        self.config = config
        self.index = index
        self.progress = progress
        self.node_name = config.cluster.joined_nodes[index].name
        self.name = f"node {self.node_name}"

    def _site(self, ctx: ClusterContext) -> Site:
        return Site.of(self.config, ctx.layout.state_dir, self.index)

    def claim(self, ctx: ClusterContext) -> None:
        """Its network is its own namespace's: nothing on the host to claim but its names."""
        site = self._site(ctx)
        link = _run("ip", "-j", "link", "show", site.link, check=False)
        netns = Path(f"/run/netns/{site.netns}")
        if link.returncode == 0 and not netns.exists():
            raise ClusterError(
                f"a network link {site.link} exists but no namespace {site.netns}: another "
                f"program made it. Remove it (ip link delete {site.link}) or rename the joined node."
            )

    def leaves(self, ctx: ClusterContext) -> Sequence[Leaf]:
        site = self._site(ctx)
        return LocalNode(self.config, seat=site.seat(ctx.advertise_address)).leaves(ctx)

    def prepare(self, ctx: ClusterContext) -> None:
        site = self._site(ctx)
        _link(site)
        _mount_namespace(site)
        _cgroups(site)
        (site.root / "config.json").write_text(self.config.model_dump_json())
        self._inside(site, "up", "--api-address", ctx.advertise_address)

    def components(self, ctx: ClusterContext) -> Sequence[Component]:
        return []  # its processes are its own supervisor's (started inside its namespaces)

    def after_up(self, ctx: ClusterContext) -> None:
        pass

    def teardown(self, ctx: ClusterContext, wipe: bool) -> list[str]:
        site = self._site(ctx)
        stopped: list[str] = []
        if site.mount_ns.exists() and Path(f"/run/netns/{site.netns}").exists():
            with contextlib.suppress(ClusterError):
                out = self._inside(site, "down")
                stopped = [line.split(": ", 1)[0] for line in out if line.endswith(": stopped")]
        _remove(site, self.progress)
        _forget_node(ctx, site.name)
        return [f"{self.node_name}/{name}" for name in stopped]

    def _inside(self, site: Site, command: str, *args: str) -> list[str]:
        """Run this module's `command` inside the node's namespaces, relaying its progress."""
        argv = [
            *site.enter(),
            sys.executable,
            "-m",
            "warren.node.joined",
            command,
            "--state",
            str(site.state),
            "--index",
            str(self.index),
            "--name",
            site.name,
            "--bin-dir",
            str(self._bin_dir(site)),
            *args,
        ]
        lines: list[str] = []
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            for line in proc.stdout or ():
                lines.append(line.rstrip("\n"))
                self.progress(f"{self.node_name}: {lines[-1]}")
        if proc.returncode != 0:
            raise ClusterError(f"joined node {site.name}: `{command}` failed: {lines[-1] if lines else ''}")
        return lines

    @staticmethod
    def _bin_dir(site: Site) -> Path:
        return Path((site.state / BIN_DIR_RECORD).read_text().strip())


def joined_nodes(
    config: WarrenConfig, state: Path, progress: Callable[[str], None], *, leftovers: bool
) -> list[JoinedNode]:
    """The configuration's joined nodes; with `leftovers`, also those that ran before under
    this state and are no longer configured (so that `down` takes them down too)."""
    nodes = [JoinedNode(config, i, progress) for i in range(len(config.cluster.joined_nodes))]
    if leftovers:
        named = {n.node_name for n in nodes}
        for saved in sorted((state / "nodes").glob("*/config.json")):
            if saved.parent.name not in named:
                earlier = WarrenConfig.model_validate_json(saved.read_text())
                index = [n.name for n in earlier.cluster.joined_nodes].index(saved.parent.name)
                nodes.append(JoinedNode(earlier, index, progress))
    return nodes


def _forget_node(ctx: ClusterContext, name: str) -> None:
    """Its Node object, so that the cluster does not wait for it to come back."""
    from kubernetes import client

    from warren import kube

    if not ctx.layout.admin_kubeconfig.exists():
        return
    with contextlib.suppress(client.ApiException, OSError, ValueError):
        client.CoreV1Api(kube.api_client(ctx.layout.admin_kubeconfig)).delete_node(name)


def _link(site: Site) -> None:
    """Its network namespace, the veth pair to the host, and the route to its pods (the host
    forwards between nodes)."""
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
    if not Path(f"/run/netns/{site.netns}").exists():
        _run("ip", "netns", "add", site.netns)
    inside = ("ip", "-n", site.netns)
    if _run("ip", "link", "show", site.link, check=False).returncode != 0:
        _run("ip", "link", "add", site.link, "type", "veth", "peer", "name", "eth0", "netns", site.netns)
    _run("ip", "addr", "replace", f"{site.host_address}/30", "dev", site.link)
    _run("ip", "link", "set", site.link, "up")
    _run(*inside, "addr", "replace", f"{site.address}/30", "dev", "eth0")
    _run(*inside, "link", "set", "eth0", "up")
    _run(*inside, "link", "set", "lo", "up")
    _run(*inside, "route", "replace", "default", "via", site.host_address)
    _run("ip", "route", "replace", site.pod_subnet, "via", site.address, "dev", site.link)


def _is_mount_point(path: Path) -> bool:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return any(line.split()[4] == str(path) for line in lines)


def _mount_namespace(site: Site) -> None:
    """A mount namespace bound to a file, in which the state's node/ is the node's own and
    the host paths in PRIVATE are its own; host mounts still reach it (a slave), its own
    mounts never leave it."""
    if (
        site.mount_ns.exists()
        and _run("nsenter", f"--mount={site.mount_ns}", "true", check=False).returncode == 0
    ):
        return  # made by an earlier `up`, and still alive
    MOUNT_NS_DIR.mkdir(parents=True, exist_ok=True)
    if not _is_mount_point(MOUNT_NS_DIR):
        _run("mount", "--bind", MOUNT_NS_DIR, MOUNT_NS_DIR)
    _run("mount", "--make-private", MOUNT_NS_DIR)
    site.mount_ns.touch()
    shared = site.state / NODE_DIR
    own = site.root / NODE_DIR
    # The first node's mounts under node/ (its kubelet directory, its pods' volumes) were
    # copied in: drop them, deepest first, so that nothing of them shadows the node's own.
    script = [
        f"awk -v p={shared} '$5 == p || index($5, p \"/\") == 1 {{print $5}}' /proc/self/mountinfo"
        " | sort -r | xargs -r -n1 umount -l",
        f"mount --bind {own} {shared}",
    ]
    for path, name in PRIVATE.items():
        Path(path).mkdir(parents=True, exist_ok=True)  # a mount point must exist
        if name is None:
            script.append(f"mount -t tmpfs -o mode=0755 tmpfs {path}")
        else:
            (site.root / name).mkdir(parents=True, exist_ok=True)
            script.append(f"mount --bind {site.root / name} {path}")
    shared.mkdir(parents=True, exist_ok=True)
    own.mkdir(parents=True, exist_ok=True)
    _run("unshare", f"--mount={site.mount_ns}", "--propagation", "slave", "sh", "-ec", "; ".join(script))


def _cgroups(site: Site) -> None:
    """The node's cgroup root in every hierarchy (the kubelet wants it to exist)."""
    for hierarchy in _hierarchies():
        path = hierarchy / site.cgroup
        path.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):  # an empty cpuset admits no task
            mine, parent = path / name, hierarchy / name
            if mine.exists() and not mine.read_text().strip():
                mine.write_text(parent.read_text())


def _hierarchies() -> list[Path]:
    mounted = {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    if str(CGROUP_ROOT) in mounted and (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]  # cgroup v2 alone
    return [p for p in CGROUP_ROOT.iterdir() if str(p) in mounted and p.is_dir()]


def _remove(site: Site, progress: Callable[[str], None]) -> None:
    """Whatever of the node is left on the host after its own teardown ran inside."""
    netns = Path(f"/run/netns/{site.netns}")
    if netns.exists():
        pids = _run("ip", "netns", "pids", site.netns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _run("ip", "netns", "delete", site.netns, check=False)
        progress(f"{site.name}: removed network namespace {site.netns} and link {site.link}")
    _run("ip", "route", "delete", site.pod_subnet, check=False)
    if site.mount_ns.exists():
        _run("umount", site.mount_ns, check=False)
        site.mount_ns.unlink(missing_ok=True)
    for hierarchy in _hierarchies():
        _remove_cgroup(hierarchy / site.cgroup)


def _remove_cgroup(path: Path) -> None:
    if not path.is_dir():
        return
    for child in (p for p in path.iterdir() if p.is_dir()):
        _remove_cgroup(child)
    for _ in range(50):  # a cgroup whose last task just died empties a moment later
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)


# -- inside the node's namespaces ------------------------------------------------------------


def _inner(args: argparse.Namespace) -> tuple[LocalNode, ClusterContext]:
    root = args.state / "nodes" / args.name
    config = WarrenConfig.model_validate_json((root / "config.json").read_text())
    site = Site.of(config, args.state, args.index)
    api_address = args.api_address or json.loads((root / "seat.json").read_text())["api_address"]
    (root / "seat.json").write_text(json.dumps({"api_address": api_address}))
    layout = JoinedLayout(state_dir=args.state, bin_dir=args.bin_dir, node=site.name)
    ctx = ClusterContext(config.cluster, layout, api_address, Supervisor(site.root))
    return LocalNode(config, progress=_say, seat=site.seat(api_address)), ctx


def _say(message: str) -> None:
    print(message, flush=True)


def _up(node: LocalNode, ctx: ClusterContext) -> None:
    pki = ctx.layout
    write_kubeconfig(
        pki.admin_kubeconfig,
        f"https://{ctx.advertise_address}:{ctx.config.api_port}",
        pki.crt("ca"),
        pki.crt("admin"),
        pki.key("admin"),
        user="admin",
    )
    node.claim(ctx)
    node.prepare(ctx)
    for component in node.components(ctx):
        ensure_running(ctx.supervisor, component, ctx.config.ready_timeout_seconds, _say)
    # As the first node's: the floor's identity, this node Ready, cluster DNS (which a
    # cluster of joined nodes alone gets from here).
    node.after_up(ctx)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m warren.node.joined")
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("--api-address")
    args = parser.parse_args(argv)
    node, ctx = _inner(args)
    try:
        if args.command == "up":
            _up(node, ctx)
        else:
            node.teardown(ctx, wipe=False)
    except ClusterError as exc:
        _say(str(exc))
        sys.exit(1)


if __name__ == "__main__":
    main()
