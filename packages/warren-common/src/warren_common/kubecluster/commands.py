"""The command lines, configuration files and objects of a throw-away control plane: pure
functions of its directory layout, ports and options, so they can be checked without starting
anything."""

from __future__ import annotations

import base64
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Obj = dict[str, Any]

KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
# Fake addresses, only ever written into objects (no kubelet is behind them). The node IP is
# loopback so that even a stray `kubectl logs` stays on this machine.
NODE_IP = "127.0.0.1"
POD_NETWORK = ipaddress.ip_network("10.64.0.0/10")
SERVICE_NETWORK = "10.96.0.0/16"


@dataclass(frozen=True)
class Layout:
    """Every file of one control plane, under one temporary directory."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def scheduler_settings(self) -> Path:
        return self.root / "scheduler.json"

    def kubeconfig(self, user: str) -> Path:
        return self.root / f"{user}.kubeconfig"

    def cert(self, name: str) -> Path:
        return self.pki / f"{name}.crt"

    def key(self, name: str) -> Path:
        return self.pki / f"{name}.key"


def etcd_argv(bin_dir: Path, layout: Layout, client: int, peer: int, metrics: int) -> list[str]:
    client_url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=test",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=test={peer_url}",
        f"--listen-metrics-urls=http://127.0.0.1:{metrics}",
        # A store thrown away after the test: waiting for a shared disk's fsync would measure
        # the disk, not what is tested.
        "--unsafe-no-fsync",
        "--quota-backend-bytes=8589934592",  # thousands of objects (the scale test)
        "--log-level=warn",
    ]


def apiserver_argv(bin_dir: Path, layout: Layout, port: int, etcd_url: str) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={layout.root / 'apiserver'}",
        f"--etcd-servers={etcd_url}",
        f"--client-ca-file={layout.cert('ca')}",
        f"--tls-cert-file={layout.cert('apiserver')}",
        f"--tls-private-key-file={layout.key('apiserver')}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={layout.pki / 'sa.pub'}",
        f"--service-account-signing-key-file={layout.key('sa')}",
        f"--service-cluster-ip-range={SERVICE_NETWORK}",
        "--authorization-mode=Node,RBAC",
        # It taints every new node not-ready, and only the controller manager's node lifecycle
        # controller (never run here: kwok's nodes would soon look lost to it) lifts the taint.
        "--disable-admission-plugins=TaintNodesByCondition",
        # As on any real cluster: warren-blockd's DaemonSet is privileged (the admission floor,
        # not this flag, keeps sandbox pods from being so).
        "--allow-privileged=true",
        "--profiling=false",
    ]


def controller_manager_argv(bin_dir: Path, layout: Layout, controllers: Sequence[str]) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={layout.kubeconfig('controller-manager')}",
        f"--controllers={','.join(controllers)}",
        f"--service-account-private-key-file={layout.key('sa')}",
        f"--root-ca-file={layout.cert('ca')}",
        "--leader-elect=false",
        "--secure-port=0",  # no health endpoint: nothing listens but the API server
        "--profiling=false",
    ]


def scheduler_settings(layout: Layout) -> Obj:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        # The default 50 requests/s would make binding, not the controller, the limit on how
        # fast thousands of pods start.
        "clientConnection": {"kubeconfig": str(layout.kubeconfig("scheduler")), "qps": 500, "burst": 1000},
        "leaderElection": {"leaderElect": False},
    }


def scheduler_argv(bin_dir: Path, layout: Layout) -> list[str]:
    return [str(bin_dir / "kube-scheduler"), f"--config={layout.scheduler_settings}", "--secure-port=0"]


def kwok_argv(bin_dir: Path, layout: Layout, stages: Sequence[Path], node_lease_seconds: int) -> list[str]:
    key, value = KWOK_ANNOTATION
    return [
        str(bin_dir / "kwok"),
        *(f"--config={path}" for path in stages),
        f"--kubeconfig={layout.kubeconfig('admin')}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={key}={value}",
        f"--node-ip={NODE_IP}",
        f"--node-lease-duration-seconds={node_lease_seconds}",
        "-v=WARN",  # at INFO it logs every lease renewal
    ]


def kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> Obj:
    """A kubeconfig with every credential inline. Written as JSON, which every Kubernetes
    client reads as the YAML it is."""

    def data(path: Path) -> str:
        return base64.b64encode(path.read_bytes()).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "warren-test", "cluster": {"server": server, "certificate-authority-data": data(ca)}}
        ],
        "users": [
            {"name": user, "user": {"client-certificate-data": data(cert), "client-key-data": data(key)}}
        ],
        "contexts": [{"name": f"{user}@warren-test", "context": {"cluster": "warren-test", "user": user}}],
        "current-context": f"{user}@warren-test",
    }


def pod_cidr(index: int) -> str:
    """The index-th node's pod range: kwok hands out pod IPs from it (strings, never dialled)."""
    if not 0 <= index < 2 ** (24 - POD_NETWORK.prefixlen):
        raise ValueError(f"no /24 number {index} in {POD_NETWORK}")
    return str(ipaddress.ip_network((int(POD_NETWORK.network_address) + index * 256, 24)))


def node_names(count: int, first: int = 0, prefix: str = "kwok-node-") -> list[str]:
    return [f"{prefix}{i:04d}" for i in range(first, first + count)]


def fake_node(name: str, index: int, labels: Mapping[str, str], taints: Sequence[Obj]) -> Obj:
    """A Node that kwok takes (by its annotation) and makes Ready."""
    key, value = KWOK_ANNOTATION
    cidr = pod_cidr(index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value},
            "labels": {
                **labels,
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr], "taints": list(taints)},
    }


def is_ready(node: Obj) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
