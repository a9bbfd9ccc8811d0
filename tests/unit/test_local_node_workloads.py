"""Warren's services on the local node (`warren apply --local-node`): the node's own paths,
images never pulled and pinned by the digests the node holds, what the configuration sets
explicitly kept, and a node without the images refused with the command that fixes it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from warren.config import SERVICE_IMAGES, WarrenConfig, parse_config
from warren.images import sandbox
from warren.images.services import SERVICES
from warren.node.workloads import LocalNodeError, for_local_node
from warren.render import render

STATE = Path("/srv/warren-home/cluster")
HELD = {f"warren.dev/{name}:0.1.0": "sha256:" + f"{i:02x}" * 32 for i, name in enumerate(SERVICE_IMAGES)}


def test_the_configuration_knows_every_service_image_the_build_makes() -> None:
    assert set(SERVICE_IMAGES) == {s.name for s in SERVICES} | set(sandbox.IMAGES)


def test_the_local_node_gets_its_own_paths_and_pinned_never_pulled_images() -> None:
    services = for_local_node(parse_config({}), STATE, HELD).services
    assert services.kubelet_root == str(STATE / "node" / "kubelet")
    assert services.stores_host_path == str(STATE / "stores")
    assert services.blockd_state_host_path == str(STATE / "node" / "blockd")
    assert services.image_pull_policy == "Never"
    # The gateway where this node's egress floor lets sandboxes reach it.
    assert services.gateway_cluster_ip == "10.96.0.11"
    assert parse_config({"cluster": {"service_cidr": "10.100.0.0/16"}}).cluster.gateway_ip == "10.100.0.11"
    for name in SERVICE_IMAGES:
        assert services.image(name) == f"warren.dev/{name}:0.1.0@{HELD[f'warren.dev/{name}:0.1.0']}"


def test_what_the_configuration_sets_wins() -> None:
    config = parse_config({"services": {"kubelet_root": "/var/lib/kubelet", "image_pull_policy": "Always"}})
    services = for_local_node(config, STATE, HELD).services
    assert services.kubelet_root == "/var/lib/kubelet"
    assert services.image_pull_policy == "Always"
    assert services.stores_host_path == str(STATE / "stores")


def test_a_node_without_the_images_is_refused_naming_the_build() -> None:
    held = {k: v for k, v in HELD.items() if "postgres" not in k}
    with pytest.raises(LocalNodeError, match=r"lacks the image\(s\) warren.dev/postgres:0.1.0") as refused:
        for_local_node(parse_config({}), STATE, held)
    assert "warren image build postgres --import" in str(refused.value)


def test_without_services_nothing_changes() -> None:
    config = parse_config({"services": {"enabled": False}})
    assert for_local_node(config, STATE, {}) == config


def test_the_embedded_stores_stay_on_the_first_node() -> None:
    """Their host paths are that node's disk: with joined nodes beside it, they never move."""
    joined = {"joined_nodes": [{"name": "b"}]}
    named = for_local_node(parse_config({"cluster": {"node": {"name": "a"}, **joined}}), STATE, HELD)
    assert named.services.stores_node_selector == {"kubernetes.io/hostname": "a"}
    alone = parse_config({"cluster": {"node": {"enabled": False}, **joined}})
    assert for_local_node(alone, STATE, HELD).services.stores_node_selector == {"kubernetes.io/hostname": "b"}
    chosen = parse_config({"services": {"stores_node_selector": {"disk": "fast"}}})
    assert for_local_node(chosen, STATE, HELD).services.stores_node_selector == {"disk": "fast"}
    rendered = named_objects(for_local_node(chosen, STATE, HELD))
    for name in ("warren-objects", "warren-postgres"):
        assert rendered[("StatefulSet", name)]["spec"]["template"]["spec"]["nodeSelector"] == {"disk": "fast"}


def named_objects(config: WarrenConfig) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in render(config)}
