"""The control-plane components of the local cluster and how each is started and checked."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from warren_common.pki import CLIENT, SERVER, Leaf

from warren.cluster.process import ProcessSpec
from warren.config import ClusterConfig


@dataclass(frozen=True)
class Health:
    """How to tell a component is healthy: an HTTP(S) endpoint that answers 200, or a
    command that exits 0 (for daemons that speak only gRPC on a unix socket)."""

    url: str = ""
    ca: Path | None = None
    client_cert: tuple[Path, Path] | None = None
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class Component:
    spec: ProcessSpec
    health: Health
    # Runs after the component is healthy, on every `up` (must be idempotent): e.g. import
    # images into containerd before the kubelet starts pods.
    after_healthy: Callable[[], None] | None = None

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class Layout:
    """Where the cluster keeps its files, all under one state directory."""

    state_dir: Path
    bin_dir: Path

    @property
    def pki(self) -> Path:
        return self.state_dir / "pki"

    def crt(self, name: str) -> Path:
        return self.pki / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.pki / f"{name}.key"

    def kubeconfig(self, user: str) -> Path:
        return self.state_dir / f"{user}.kubeconfig"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig("admin")

    def binary(self, name: str) -> str:
        return str(self.bin_dir / name)


def leaves(config: ClusterConfig, advertise: str) -> list[Leaf]:
    """Every certificate the control plane needs, issued by the CA named in each."""
    api_names = (
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        f"kubernetes.default.svc.{config.cluster_domain}",
        "localhost",
    )
    return [
        Leaf(
            "apiserver",
            "ca",
            "kube-apiserver",
            usages=(SERVER,),
            dns_names=api_names,
            ips=tuple(dict.fromkeys(("127.0.0.1", advertise, config.service_ip))),
        ),
        Leaf(
            "apiserver-kubelet-client",
            "ca",
            "kube-apiserver-kubelet-client",
            organizations=("system:masters",),
        ),
        Leaf("apiserver-etcd-client", "etcd-ca", "kube-apiserver-etcd-client"),
        Leaf(
            "etcd-server",
            "etcd-ca",
            "etcd",
            usages=(SERVER, CLIENT),
            dns_names=("localhost",),
            ips=("127.0.0.1",),
        ),
        Leaf("front-proxy-client", "front-proxy-ca", "front-proxy-client"),
        # The admin belongs to warren:platform too, so the floor guard lets it manage the floor.
        Leaf("admin", "ca", "warren-admin", organizations=("system:masters", "warren:platform")),
        Leaf("controller-manager", "ca", "system:kube-controller-manager"),
        Leaf(
            "controller-manager-server",
            "ca",
            "kube-controller-manager",
            usages=(SERVER,),
            dns_names=("localhost",),
            ips=("127.0.0.1",),
        ),
        Leaf("scheduler", "ca", "system:kube-scheduler"),
        Leaf(
            "scheduler-server",
            "ca",
            "kube-scheduler",
            usages=(SERVER,),
            dns_names=("localhost",),
            ips=("127.0.0.1",),
        ),
    ]


def control_plane(config: ClusterConfig, layout: Layout, advertise: str) -> list[Component]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler: in start order."""
    c = config
    ca = layout.crt("ca")
    return [
        Component(_etcd(c, layout), Health(f"http://127.0.0.1:{c.etcd_metrics_port}/health")),
        Component(_apiserver(c, layout, advertise), Health(f"https://127.0.0.1:{c.api_port}/readyz", ca=ca)),
        Component(
            _controller_manager(c, layout),
            Health(f"https://127.0.0.1:{c.controller_manager_port}/healthz", ca=ca),
        ),
        Component(_scheduler(c, layout), Health(f"https://127.0.0.1:{c.scheduler_port}/healthz", ca=ca)),
    ]


def _etcd(config: ClusterConfig, layout: Layout) -> ProcessSpec:
    """etcd, one member, clients with certificates only."""
    c = config
    etcd_url = f"https://127.0.0.1:{c.etcd_client_port}"
    peer_url = f"http://127.0.0.1:{c.etcd_peer_port}"
    return ProcessSpec(
        "etcd",
        (
            layout.binary("etcd"),
            "--name=warren",
            f"--data-dir={layout.state_dir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=warren={peer_url}",
            f"--listen-metrics-urls=http://127.0.0.1:{c.etcd_metrics_port}",
            f"--cert-file={layout.crt('etcd-server')}",
            f"--key-file={layout.key('etcd-server')}",
            f"--trusted-ca-file={layout.crt('etcd-ca')}",
            "--client-cert-auth=true",
            "--snapshot-count=10000",
            "--log-level=warn",
        ),
    )


def _apiserver(config: ClusterConfig, layout: Layout, advertise: str) -> ProcessSpec:
    """kube-apiserver, with kubeadm's certificate layout and admission plugins."""
    c = config
    etcd_url = f"https://127.0.0.1:{c.etcd_client_port}"
    return ProcessSpec(
        "kube-apiserver",
        (
            layout.binary("kube-apiserver"),
            f"--advertise-address={advertise}",
            f"--bind-address={c.bind_address}",
            f"--secure-port={c.api_port}",
            f"--etcd-servers={etcd_url}",
            f"--etcd-cafile={layout.crt('etcd-ca')}",
            f"--etcd-certfile={layout.crt('apiserver-etcd-client')}",
            f"--etcd-keyfile={layout.key('apiserver-etcd-client')}",
            f"--client-ca-file={layout.crt('ca')}",
            f"--tls-cert-file={layout.crt('apiserver')}",
            f"--tls-private-key-file={layout.key('apiserver')}",
            f"--kubelet-client-certificate={layout.crt('apiserver-kubelet-client')}",
            f"--kubelet-client-key={layout.key('apiserver-kubelet-client')}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-issuer=https://kubernetes.default.svc.{c.cluster_domain}",
            f"--service-account-key-file={layout.pki / 'sa.pub'}",
            f"--service-account-signing-key-file={layout.pki / 'sa.key'}",
            f"--service-cluster-ip-range={c.service_cidr}",
            "--authorization-mode=Node,RBAC",
            # The default admission plugins stay on; NodeRestriction is the one kubeadm adds.
            "--enable-admission-plugins=NodeRestriction",
            # System pods (kube-proxy, CNI) need privilege; sandbox pods are refused by policy.
            "--allow-privileged=true",
            "--anonymous-auth=true",  # only /healthz, /livez, /readyz, /version via RBAC
            "--profiling=false",
            f"--requestheader-client-ca-file={layout.crt('front-proxy-ca')}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-username-headers=X-Remote-User",
            f"--proxy-client-cert-file={layout.crt('front-proxy-client')}",
            f"--proxy-client-key-file={layout.key('front-proxy-client')}",
        ),
    )


def _controller_manager(config: ClusterConfig, layout: Layout) -> ProcessSpec:
    """kube-controller-manager: every controller, node CIDRs allocated, no leader election."""
    c = config
    return ProcessSpec(
        "kube-controller-manager",
        (
            layout.binary("kube-controller-manager"),
            f"--kubeconfig={layout.kubeconfig('controller-manager')}",
            f"--authentication-kubeconfig={layout.kubeconfig('controller-manager')}",
            f"--authorization-kubeconfig={layout.kubeconfig('controller-manager')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={c.controller_manager_port}",
            f"--tls-cert-file={layout.crt('controller-manager-server')}",
            f"--tls-private-key-file={layout.key('controller-manager-server')}",
            f"--client-ca-file={layout.crt('ca')}",
            f"--requestheader-client-ca-file={layout.crt('front-proxy-ca')}",
            f"--cluster-signing-cert-file={layout.crt('ca')}",
            f"--cluster-signing-key-file={layout.key('ca')}",
            f"--root-ca-file={layout.crt('ca')}",
            f"--service-account-private-key-file={layout.pki / 'sa.key'}",
            "--use-service-account-credentials=true",
            "--controllers=*,bootstrapsigner,tokencleaner",
            f"--service-cluster-ip-range={c.service_cidr}",
            f"--cluster-cidr={c.pod_cidr}",
            "--allocate-node-cidrs=true",
            "--leader-elect=false",
            "--profiling=false",
        ),
    )


def _scheduler(config: ClusterConfig, layout: Layout) -> ProcessSpec:
    """kube-scheduler, no leader election."""
    c = config
    return ProcessSpec(
        "kube-scheduler",
        (
            layout.binary("kube-scheduler"),
            f"--kubeconfig={layout.kubeconfig('scheduler')}",
            f"--authentication-kubeconfig={layout.kubeconfig('scheduler')}",
            f"--authorization-kubeconfig={layout.kubeconfig('scheduler')}",
            "--bind-address=127.0.0.1",
            f"--secure-port={c.scheduler_port}",
            f"--tls-cert-file={layout.crt('scheduler-server')}",
            f"--tls-private-key-file={layout.key('scheduler-server')}",
            "--leader-elect=false",
            "--profiling=false",
        ),
    )
