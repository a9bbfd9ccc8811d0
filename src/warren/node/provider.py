"""The local node: containerd (runc and gVisor), CNI bridge, kubelet, kube-proxy, CoreDNS."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from warren_common.pki import CLIENT, SERVER, Leaf

from warren.ansible import PlaybookError, run_playbook
from warren.cluster.components import Component, Health
from warren.cluster.local import ClusterContext, ClusterError, write_kubeconfig
from warren.cluster.process import ProcessSpec
from warren.config import WarrenConfig
from warren.node import claim, images, teardown
from warren.node.files import render, write, write_keeping_block
from warren.node.layout import CNI_BIN_DIR, FLOOR_TABLE, NETWORK_NAME, NodeLayout
from warren.node.workloads import first_node_name

# The markers of the block the gvisor role appends to containerd's configuration.
GVISOR_BLOCK_BEGIN = "# BEGIN warren gvisor runtime (managed by Ansible)"
GVISOR_BLOCK_END = "# END warren gvisor runtime (managed by Ansible)"
NODE_BINARIES = (
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "kubelet",
    "kube-proxy",
    "kubectl",
    "runsc",
    "containerd-shim-runsc-v1",
    "crictl",
    "coredns",
)
HOST_TOOLS = {  # what the node runs from the host, and the Debian package it comes in
    "runc": "runc",
    "nft": "nftables",
    "ip": "iproute2",
}


CAP_SYS_RESOURCE = 24


def _has_capability(bit: int) -> bool:
    """Whether this process may use a capability (its bounding set can lack it even as root)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return bool(int(line.split()[1], 16) >> bit & 1)
    return False


NETNS_DIR = Path("/run/netns")


def _shared_netns_dir() -> None:
    """Make /run/netns a shared mount before containerd puts pod network namespaces there.
    `ip netns add` does this on first use by bind-mounting the directory onto itself; done
    after pods exist, that bind would hide their namespace mounts from containerd, which
    could then never remove them."""
    NETNS_DIR.mkdir(parents=True, exist_ok=True)
    mounted = any(
        line.split()[4] == str(NETNS_DIR) for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )
    if not mounted:
        subprocess.run(["mount", "--bind", str(NETNS_DIR), str(NETNS_DIR)], check=True)
    subprocess.run(["mount", "--make-shared", str(NETNS_DIR)], check=True)


def _mount_options(directory: Path) -> set[str] | None:
    """The options of the mount at `directory`, or None if none is there."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(directory):
            return set(fields[5].split(","))
    return None


def _own_mount(directory: Path) -> None:
    """`directory` as a mount of its own (bound over itself), so its propagation can be set."""
    directory.mkdir(parents=True, exist_ok=True)
    if _mount_options(directory) is None:
        subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)


def _nosuid_nodev(directory: Path) -> None:
    """Keep every pod volume on a nosuid,nodev mount: the kernel keeps those flags on the
    bind mounts a container gets, and runsc carries them into the sandbox (patch 0002), so
    /workspace and every other volume refuse set-user-ID programs and device files."""
    _own_mount(directory)
    if {"nosuid", "nodev"} <= (_mount_options(directory) or set()):
        return
    subprocess.run(["mount", "-o", "remount,bind,nosuid,nodev", str(directory)], check=True)


def _sysctl(key: str, value: str) -> None:
    path = Path("/proc/sys") / key.replace(".", "/")
    if not path.exists():
        raise ClusterError(f"sysctl {key} is missing: load the kernel module that provides it")
    if path.read_text().strip() != value:
        path.write_text(value)


def _digest(*paths: Path) -> str:
    """Changes when any of these configuration files does, so `up` restarts the daemon."""
    h = hashlib.sha256()
    for path in paths:
        h.update(path.read_bytes() if path.is_file() else b"-")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Seat:
    """What tells a joined node (joined.py: its own network and mount namespaces) from the
    first one, which sits in the host's: its name, its address, where it reaches the API
    server, its pod range, its cgroup root and the names of its own certificates."""

    name: str
    address: str
    api_address: str
    pod_subnet: str
    cgroup_root: str
    host_address: str  # the host's end of its link, also closed to its sandboxes

    @property
    def kubelet_leaf(self) -> str:
        return f"kubelet-{self.name}"


class LocalNode:
    name = "node"

    def __init__(
        self,
        config: WarrenConfig,
        progress: Callable[[str], None] = lambda _m: None,
        seat: Seat | None = None,
    ) -> None:
        self.config = config
        self.progress = progress
        self.seat = seat

    # -- identity -----------------------------------------------------------------------

    def node_name(self, ctx: ClusterContext) -> str:
        if self.seat is not None:
            return self.seat.name
        return first_node_name(self.config)

    def node_address(self, ctx: ClusterContext) -> str:
        return self.seat.address if self.seat is not None else ctx.advertise_address

    def _api_address(self, ctx: ClusterContext) -> str:
        return self.seat.api_address if self.seat is not None else "127.0.0.1"

    def _kubelet_leaf(self) -> str:
        return self.seat.kubelet_leaf if self.seat is not None else "kubelet"

    @staticmethod
    def layout(ctx: ClusterContext) -> NodeLayout:
        return NodeLayout(ctx.layout.state_dir / "node")

    def leaves(self, ctx: ClusterContext) -> Sequence[Leaf]:
        name, kubelet = self.node_name(ctx), self._kubelet_leaf()
        return [
            Leaf(f"{kubelet}-client", "ca", f"system:node:{name}", organizations=("system:nodes",)),
            Leaf(
                f"{kubelet}-server",
                "ca",
                f"system:node:{name}",
                usages=(SERVER,),
                dns_names=(name, "localhost"),
                ips=tuple(dict.fromkeys(("127.0.0.1", self.node_address(ctx)))),
            ),
            Leaf("kube-proxy", "ca", "system:kube-proxy", usages=(CLIENT,)),
            Leaf("egress-floor", "ca", "warren:egress-floor", usages=(CLIENT,)),
        ]

    # -- claim --------------------------------------------------------------------------

    def host_claim(self, ctx: ClusterContext) -> claim.Claim:
        return claim.Claim(
            state_dir=str(ctx.layout.state_dir.resolve()),
            bridge=ctx.config.node.bridge,
            network=NETWORK_NAME,
            floor_table=FLOOR_TABLE,
        )

    def claim(self, ctx: ClusterContext) -> None:
        running = any(ctx.supervisor.running(name) for name in ("containerd", "kubelet"))
        try:
            note = claim.acquire(self.host_claim(ctx), running_here=running)
        except claim.ClaimError as exc:
            raise ClusterError(str(exc)) from None
        if note:
            self.progress(note)

    # -- prepare ------------------------------------------------------------------------

    def prepare(self, ctx: ClusterContext) -> None:
        self._check_host(ctx)
        layout = self.layout(ctx)
        _prepare_host(layout)
        server = f"https://{self._api_address(ctx)}:{ctx.config.api_port}"
        self._write_runtime_configs(ctx, layout, server)
        self._write_node_configs(ctx, layout, server)
        self._run_floor_playbook(ctx, layout, server)

    def _write_runtime_configs(self, ctx: ClusterContext, layout: NodeLayout, server: str) -> None:
        """containerd's configuration (keeping the gvisor role's block) and the CNI network
        with the egress floor's plugin."""
        cfg = ctx.config
        pki = ctx.layout
        write_keeping_block(
            layout.containerd_config,
            render(
                "containerd.toml.j2",
                layout=layout,
                pause_image=images.PAUSE,
                cni_bin_dir=layout.cni_bin_dir,
                oci_runtime=shutil.which(cfg.node.oci_runtime) or cfg.node.oci_runtime,
                restrict_oom=not _has_capability(CAP_SYS_RESOURCE),
            ),
            begin=GVISOR_BLOCK_BEGIN,
            end=GVISOR_BLOCK_END,
        )
        floor = {
            "table": FLOOR_TABLE,
            "state_dir": layout.floor_dir / "pods",
            "server": server,
            "ca": pki.crt("ca"),
            "cert": pki.crt("egress-floor"),
            "key": pki.key("egress-floor"),
        }
        write(
            layout.cni_conf_dir / "10-warren.conflist",
            render(
                "cni.conflist.j2",
                network=NETWORK_NAME,
                bridge=cfg.node.bridge,
                subnet=self.seat.pod_subnet if self.seat is not None else cfg.node_pod_cidr,
                floor=floor,
            ),
        )

    def _write_node_configs(self, ctx: ClusterContext, layout: NodeLayout, server: str) -> None:
        """The kubelet's and kube-proxy's kubeconfigs and configurations."""
        cfg = ctx.config
        pki = ctx.layout
        kubelet = self._kubelet_leaf()
        write_kubeconfig(
            pki.kubeconfig("kubelet"),
            server,
            pki.crt("ca"),
            pki.crt(f"{kubelet}-client"),
            pki.key(f"{kubelet}-client"),
            user=f"system:node:{self.node_name(ctx)}",
        )
        write_kubeconfig(
            pki.kubeconfig("kube-proxy"),
            server,
            pki.crt("ca"),
            pki.crt("kube-proxy"),
            pki.key("kube-proxy"),
            user="system:kube-proxy",
        )
        write(
            layout.kubelet_config,
            render(
                "kubelet-config.yaml.j2",
                node=cfg.node,
                cluster=cfg,
                layout=layout,
                node_ip=self.node_address(ctx),
                cgroup_root=self.seat.cgroup_root if self.seat is not None else "",
                ca=pki.crt("ca"),
                serving_cert=pki.crt(f"{kubelet}-server"),
                serving_key=pki.key(f"{kubelet}-server"),
            ),
        )
        write(
            layout.kube_proxy_config,
            render(
                "kube-proxy-config.yaml.j2",
                node=cfg.node,
                cluster=cfg,
                node_name=self.node_name(ctx),
                kubeconfig=pki.kubeconfig("kube-proxy"),
            ),
        )

    def _check_host(self, ctx: ClusterContext) -> None:
        missing = {pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None}
        if not (CNI_BIN_DIR / "bridge").exists():
            missing.add("containernetworking-plugins")
        if missing:
            raise ClusterError(
                f"the node needs host packages that are missing: {', '.join(sorted(missing))} "
                "(tools/check-host.sh installs them)"
            )
        for binary in NODE_BINARIES:
            if not (ctx.layout.bin_dir / binary).is_file():
                raise ClusterError(
                    f"{ctx.layout.bin_dir / binary} is missing: rebuild with tools/build-cluster-binaries.sh"
                )

    def _run_floor_playbook(self, ctx: ClusterContext, layout: NodeLayout, server: str) -> None:
        """The gvisor and egress_floor roles, exactly as operators run them, on this host."""
        pki = ctx.layout
        extra_vars = {
            "gvisor_source_dir": str(pki.bin_dir),
            "gvisor_install_dir": str(layout.bin_dir),
            "gvisor_platform": ctx.config.node.runsc_platform,
            "gvisor_containerd_config": str(layout.containerd_config),
            "gvisor_config_dir": str(layout.gvisor_config_dir),
            "gvisor_root_dir": str(layout.root / "runsc"),
            "gvisor_log_dir": str(layout.root / "logs" / "runsc"),
            "gvisor_kubeconfig": str(pki.admin_kubeconfig),
            "gvisor_kubectl": str(pki.bin_dir / "kubectl"),
            "egress_floor_table": FLOOR_TABLE,
            "egress_floor_dns_ip": ctx.config.dns_ip,
            "egress_floor_gateway_ip": ctx.config.gateway_ip,
            "egress_floor_node_addresses": self._closed_addresses(ctx),
            "egress_floor_api_addresses": [self.seat.api_address if self.seat else ctx.advertise_address],
            "egress_floor_config_dir": str(layout.floor_dir),
            "egress_floor_state_dir": str(layout.floor_dir / "pods"),
            "egress_floor_cni_bin_dir": str(layout.cni_bin_dir),
            "egress_floor_python": sys.executable,
            "egress_floor_api_server": server,
            "egress_floor_api_ca": str(pki.crt("ca")),
            "egress_floor_api_cert": str(pki.crt("egress-floor")),
            "egress_floor_api_key": str(pki.key("egress-floor")),
        }
        try:
            run_playbook(
                "node.yml",
                extra_vars,
                vars_file=layout.root / "ansible-vars.json",
                log=ctx.supervisor.log_path("ansible-node"),
            )
        except PlaybookError as exc:
            raise ClusterError(str(exc)) from None
        self.progress("node floor: gvisor and egress_floor roles applied")

    def _closed_addresses(self, ctx: ClusterContext) -> list[str]:
        """The node addresses its sandboxes must never reach: its own, and a joined node's
        link to the host and the host's address too."""
        if self.seat is None:
            return [ctx.advertise_address]
        return list(dict.fromkeys((self.seat.address, self.seat.host_address, self.seat.api_address)))

    # -- components ---------------------------------------------------------------------

    def components(self, ctx: ClusterContext) -> Sequence[Component]:
        layout = self.layout(ctx)
        bins = ctx.layout.bin_dir
        crictl = (str(bins / "crictl"), "--runtime-endpoint", layout.endpoint, "--timeout", "2s")
        # containerd finds containerd-shim-runsc-v1 (installed by the gvisor role) on its PATH,
        # and restarts when its configuration or the gVisor binaries change.
        path = f"{layout.bin_dir}:{bins}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        configs = _digest(
            layout.containerd_config,
            layout.gvisor_config_dir / "runsc.toml",
            layout.bin_dir / "runsc",
            layout.bin_dir / "containerd-shim-runsc-v1",
        )
        containerd = ProcessSpec(
            "containerd",
            (str(bins / "containerd"), "--config", str(layout.containerd_config)),
            env={"PATH": path, "WARREN_CONFIG_DIGEST": configs},
        )
        kubelet = ProcessSpec(
            "kubelet",
            (
                str(bins / "kubelet"),
                f"--config={layout.kubelet_config}",
                f"--kubeconfig={ctx.layout.kubeconfig('kubelet')}",
                f"--root-dir={layout.kubelet_root}",
                f"--hostname-override={self.node_name(ctx)}",
                f"--node-ip={self.node_address(ctx)}",
                "--v=1",
            ),
        )
        kube_proxy = ProcessSpec(
            "kube-proxy", (str(bins / "kube-proxy"), f"--config={layout.kube_proxy_config}")
        )
        node = ctx.config.node
        return [
            Component(
                containerd,
                Health(command=(*crictl, "version")),
                after_healthy=lambda: images.ensure_imported(ctx, layout, self.progress),
            ),
            Component(kubelet, Health(f"http://127.0.0.1:{node.kubelet_healthz_port}/healthz")),
            Component(kube_proxy, Health(f"http://127.0.0.1:{node.kube_proxy_healthz_port}/healthz")),
        ]

    # -- after up -----------------------------------------------------------------------

    def after_up(self, ctx: ClusterContext) -> None:
        from warren.node import addons

        addons.ensure_floor_identity(ctx, self.config)
        addons.ensure_node_ready(ctx, self.node_name(ctx), self.progress)
        addons.ensure_cluster_dns(ctx, self.progress)

    # -- teardown -----------------------------------------------------------------------

    def teardown(self, ctx: ClusterContext, wipe: bool) -> list[str]:
        return teardown.run(ctx, self.layout(ctx), self.host_claim(ctx), self.progress)


def _prepare_host(layout: NodeLayout) -> None:
    """What the node needs of the host: forwarding and bridge netfilter on, the kubelet's
    root nosuid, nodev and shared, the runtime's directories, the host's CNI plugins linked."""
    _shared_netns_dir()
    _sysctl("net.ipv4.ip_forward", "1")
    _sysctl("net.bridge.bridge-nf-call-iptables", "1")
    _sysctl("net.bridge.bridge-nf-call-ip6tables", "1")
    _nosuid_nodev(layout.kubelet_root)
    # Shared, as a systemd host's / is: a CSI node plugin in a pod (warren-blockd's
    # DaemonSet) mounts workspaces with Bidirectional propagation, which containerd
    # refuses on a private mount.
    subprocess.run(["mount", "--make-rshared", str(layout.kubelet_root)], check=True)
    # Shared too: warren-blockd binds a fork's workspace beneath a running container's root
    # file system, which the shim mounts under the runtime's state directory; only from a
    # shared mount does that bind reach the host, and from there the container's gofer.
    _own_mount(layout.containerd_state)
    subprocess.run(["mount", "--make-rshared", str(layout.containerd_state)], check=True)
    for directory in (
        layout.containerd_root,
        layout.kubelet_root,
        layout.images,
        layout.cni_bin_dir,
    ):
        directory.mkdir(parents=True, exist_ok=True)
    # containerd reads one CNI plugin directory: the host's plugins, linked, plus ours.
    for plugin in CNI_BIN_DIR.iterdir():
        link = layout.cni_bin_dir / plugin.name
        if not link.is_symlink():
            link.symlink_to(plugin)
