"""The local node: containerd (runc and gVisor), CNI bridge, kubelet, kube-proxy, CoreDNS."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import jinja2

from warren.cluster.components import Component, Health
from warren.cluster.local import ClusterContext, ClusterError, write_kubeconfig
from warren.cluster.pki import CLIENT, SERVER, Leaf
from warren.cluster.process import ProcessSpec
from warren.node import images, teardown
from warren.node.layout import CNI_BIN_DIR, NETWORK_NAME, NodeLayout

TEMPLATES = Path(__file__).with_name("templates")
HOST_TOOLS = {  # what the node runs from the host, and the Debian package it comes in
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "runc": "runc",
    "nft": "nftables",
    "ip": "iproute2",
}


def _render(template: str, **context: object) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701  # TOML, YAML and JSON, not HTML
    )
    return env.get_template(template).render(**context)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _sysctl(key: str, value: str) -> None:
    path = Path("/proc/sys") / key.replace(".", "/")
    if not path.exists():
        raise ClusterError(f"sysctl {key} is missing: load the kernel module that provides it")
    if path.read_text().strip() != value:
        path.write_text(value)


def runsc_platform(choice: str) -> str:
    """kvm only where /dev/kvm really runs a guest; this picks systrap for VMs by default,
    since a nested /dev/kvm can open yet never run one."""
    if choice != "auto":
        return choice
    return "systrap"


class LocalNode:
    name = "node"

    def __init__(self, progress: Callable[[str], None] = lambda _m: None) -> None:
        self.progress = progress

    # -- identity -----------------------------------------------------------------------

    @staticmethod
    def node_name(ctx: ClusterContext) -> str:
        return ctx.config.node.name or socket.gethostname().lower().split(".")[0]

    @staticmethod
    def layout(ctx: ClusterContext) -> NodeLayout:
        return NodeLayout(ctx.layout.state_dir / "node")

    def leaves(self, ctx: ClusterContext) -> Sequence[Leaf]:
        name = self.node_name(ctx)
        return [
            Leaf("kubelet-client", "ca", f"system:node:{name}", organizations=("system:nodes",)),
            Leaf(
                "kubelet-server",
                "ca",
                f"system:node:{name}",
                usages=(SERVER,),
                dns_names=(name, "localhost"),
                ips=tuple(dict.fromkeys(("127.0.0.1", ctx.advertise_address))),
            ),
            Leaf("kube-proxy", "ca", "system:kube-proxy", usages=(CLIENT,)),
        ]

    # -- prepare ------------------------------------------------------------------------

    def prepare(self, ctx: ClusterContext) -> None:
        missing = {pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None}
        if not (CNI_BIN_DIR / "bridge").exists():
            missing.add("containernetworking-plugins")
        if missing:
            raise ClusterError(
                f"the node needs host packages that are missing: {', '.join(sorted(missing))} "
                "(tools/check-host.sh installs them)"
            )
        for binary in ("kubelet", "kube-proxy", "runsc", "containerd-shim-runsc-v1", "crictl", "coredns"):
            if not (ctx.layout.bin_dir / binary).is_file():
                raise ClusterError(
                    f"{ctx.layout.bin_dir / binary} is missing: rebuild with tools/build-cluster-binaries.sh"
                )
        _sysctl("net.ipv4.ip_forward", "1")
        _sysctl("net.bridge.bridge-nf-call-iptables", "1")
        _sysctl("net.bridge.bridge-nf-call-ip6tables", "1")
        layout = self.layout(ctx)
        cfg = ctx.config
        bins = ctx.layout.bin_dir
        for directory in (
            layout.containerd_root,
            layout.containerd_state,
            layout.runsc_logs,
            layout.runsc_root,
            layout.kubelet_root,
            layout.images,
        ):
            directory.mkdir(parents=True, exist_ok=True)
        _write(
            layout.containerd_config,
            _render(
                "containerd.toml.j2",
                layout=layout,
                pause_image=images.PAUSE,
                handler="runsc",
                cni_bin_dir=CNI_BIN_DIR,
            ),
        )
        _write(
            layout.runsc_config,
            _render(
                "runsc.toml.j2",
                layout=layout,
                runsc=bins / "runsc",
                platform=runsc_platform(cfg.node.runsc_platform),
            ),
        )
        _write(
            layout.cni_conf_dir / "10-warren.conflist",
            _render(
                "cni.conflist.j2",
                network=NETWORK_NAME,
                bridge=cfg.node.bridge,
                subnet=cfg.node_pod_cidr,
            ),
        )
        pki = ctx.layout
        server = f"https://127.0.0.1:{cfg.api_port}"
        write_kubeconfig(
            pki.kubeconfig("kubelet"),
            server,
            pki.crt("ca"),
            pki.crt("kubelet-client"),
            pki.key("kubelet-client"),
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
        _write(
            layout.kubelet_config,
            _render(
                "kubelet-config.yaml.j2",
                node=cfg.node,
                cluster=cfg,
                layout=layout,
                node_ip=ctx.advertise_address,
                ca=pki.crt("ca"),
                serving_cert=pki.crt("kubelet-server"),
                serving_key=pki.key("kubelet-server"),
            ),
        )
        _write(
            layout.kube_proxy_config,
            _render(
                "kube-proxy-config.yaml.j2",
                node=cfg.node,
                cluster=cfg,
                node_name=self.node_name(ctx),
                kubeconfig=pki.kubeconfig("kube-proxy"),
            ),
        )

    # -- components ---------------------------------------------------------------------

    def components(self, ctx: ClusterContext) -> Sequence[Component]:
        layout = self.layout(ctx)
        bins = ctx.layout.bin_dir
        crictl = (str(bins / "crictl"), "--runtime-endpoint", layout.endpoint, "--timeout", "2s")
        # containerd finds containerd-shim-runsc-v1 on its PATH.
        path = f"{bins}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        containerd = ProcessSpec(
            "containerd", ("containerd", "--config", str(layout.containerd_config)), env={"PATH": path}
        )
        kubelet = ProcessSpec(
            "kubelet",
            (
                str(bins / "kubelet"),
                f"--config={layout.kubelet_config}",
                f"--kubeconfig={ctx.layout.kubeconfig('kubelet')}",
                f"--root-dir={layout.kubelet_root}",
                f"--hostname-override={self.node_name(ctx)}",
                f"--node-ip={ctx.advertise_address}",
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

        addons.ensure_node_ready(ctx, self.node_name(ctx), self.progress)
        addons.ensure_cluster_dns(ctx, self.progress)

    # -- teardown -----------------------------------------------------------------------

    def teardown(self, ctx: ClusterContext, wipe: bool) -> None:
        teardown.run(ctx, self.layout(ctx), self.progress)


def crictl_json(ctx: ClusterContext, *args: str) -> object:
    layout = LocalNode.layout(ctx)
    out = subprocess.run(
        [str(ctx.layout.bin_dir / "crictl"), "--runtime-endpoint", layout.endpoint, *args, "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)
