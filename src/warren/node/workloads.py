"""Warren's services as workloads on the local node: what their objects must say there.

The local node (`warren cluster up`) keeps everything under the cluster's state directory,
has no registry and imports its images. So for it the rendered workloads need the node's
own kubelet directory, host paths under the state directory, images that are never pulled,
and each image pinned by the digest the node holds: a rebuild under the same tag then changes
the pod templates and rolls the workloads, and nothing else can run in their place.

What the configuration file sets explicitly wins; everything else is filled in here, the one
place that knows the local node's layout (`warren apply --local-node`, used by the local
inventory's admission role and the Pulumi `local` stack).
"""

from __future__ import annotations

import socket
from pathlib import Path

from warren.config import SERVICE_IMAGES, ServicesConfig, WarrenConfig
from warren.node.layout import NodeLayout

NODE_DIR = "node"  # the node's directory in the cluster's state (NodeLayout's root)


class LocalNodeError(RuntimeError):
    """The local node cannot run the workloads as configured; the message names the fix."""


def host_paths(state: Path) -> dict[str, str]:
    """The node-side directories of the workloads, under the cluster's state directory."""
    node = NodeLayout(state / NODE_DIR)
    return {
        "kubelet_root": str(node.kubelet_root),
        "stores_host_path": str(state / "stores"),
        # Under the node's root: its teardown unmounts and detaches what warren-blockd left.
        "blockd_state_host_path": str(node.root / "blockd"),
        "runsc_host_path": str(node.bin_dir / "runsc"),
        "runsc_root_host_path": str(node.runsc_root),
        "containerd_state_host_path": str(node.containerd_state),  # a shared mount (provider.py)
    }


def first_node_name(config: WarrenConfig) -> str:
    """The node in the host's own network: node.name, else the host's name."""
    return config.cluster.node.name or socket.gethostname().lower().split(".")[0]


def for_local_node(config: WarrenConfig, state: Path, held: dict[str, str]) -> WarrenConfig:
    """`config` as the local node needs it. `held` maps image references (registry/name:tag)
    to the manifest digests the node's containerd holds; every service image must be there."""
    services = config.services
    if not services.enabled:
        return config
    explicit = services.model_fields_set
    updates: dict[str, object] = {k: v for k, v in host_paths(state).items() if k not in explicit}
    if "stores_node_selector" not in explicit:
        # The stores' data is the first node's disk: with joined nodes, they stay on it.
        cluster = config.cluster
        first = first_node_name(config) if cluster.node.enabled or not cluster.joined_nodes else None
        updates["stores_node_selector"] = {"kubernetes.io/hostname": first or cluster.joined_nodes[0].name}
    if "gateway_cluster_ip" not in explicit:
        # This node's egress floor lets sandboxes reach the gateway at this address only.
        updates["gateway_cluster_ip"] = config.cluster.gateway_ip
    if "image_pull_policy" not in explicit:
        updates["image_pull_policy"] = "Never"  # no registry here: a missing image must say so
    if "image_digests" not in explicit:
        missing = [name for name in SERVICE_IMAGES if _unpinned(services, name) not in held]
        if missing:
            raise LocalNodeError(
                f"the local node lacks the image(s) {', '.join(_unpinned(services, m) for m in missing)}: "
                f"build and import them with `warren image build {' '.join(missing)} --import "
                f"{NodeLayout(state / NODE_DIR).containerd_socket}`"
            )
        updates["image_digests"] = {name: held[_unpinned(services, name)] for name in SERVICE_IMAGES}
    merged = services.model_dump() | updates
    return config.model_copy(update={"services": ServicesConfig.model_validate(merged)})


def _unpinned(services: ServicesConfig, name: str) -> str:
    return f"{services.image_registry}/{name}:{services.image_tag}"
