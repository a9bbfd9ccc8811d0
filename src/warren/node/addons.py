"""What the local node needs in the cluster once it runs: its Ready condition, cluster DNS."""

from __future__ import annotations

import time
from collections.abc import Callable

import yaml
from kubernetes import client

from warren import kube
from warren.cluster.local import ClusterContext, ClusterError
from warren.config import WarrenConfig
from warren.node import images
from warren.node.files import render
from warren.render import render as render_platform


def _api(ctx: ClusterContext) -> client.ApiClient:
    return kube.api_client(ctx.layout.admin_kubeconfig)


def _wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(1)


def ensure_node_ready(ctx: ClusterContext, name: str, progress: Callable[[str], None]) -> None:
    core = client.CoreV1Api(_api(ctx))

    def ready() -> bool:
        try:
            node = core.read_node(name)
        except client.ApiException:
            return False
        conditions = (node.status.conditions if node.status else None) or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    _wait(ready, ctx.config.ready_timeout_seconds, f"node {name} to be Ready (see logs/kubelet.log)")
    progress(f"node {name}: Ready")


def ensure_floor_identity(ctx: ClusterContext, config: WarrenConfig) -> None:
    """The egress floor's CNI plugin reads namespace labels; until its RBAC exists it
    treats every pod as a sandbox pod (fail closed), cluster DNS included. Apply those
    objects, rendered from the platform's one source, before any pod starts."""
    objects = [o for o in render_platform(config) if o["metadata"]["name"] == "warren:egress-floor"]
    kube.apply(_api(ctx), objects)


def ensure_cluster_dns(ctx: ClusterContext, progress: Callable[[str], None]) -> None:
    api = _api(ctx)
    image = images.coredns_image(images.coredns_version(ctx.layout.bin_dir))
    objects = [
        o for o in yaml.safe_load_all(render("cluster-dns.yaml.j2", cluster=ctx.config, image=image)) if o
    ]
    kube.apply(api, objects)
    apps = client.AppsV1Api(api)

    def available() -> bool:
        status = apps.read_namespaced_deployment("coredns", "kube-system").status
        return (
            status is not None
            and bool(status.available_replicas)
            and status.updated_replicas == status.replicas
        )

    _wait(
        available,
        ctx.config.ready_timeout_seconds,
        "CoreDNS to be available (kubectl -n kube-system get pods)",
    )
    progress(f"cluster DNS: ready at {ctx.config.dns_ip}")
