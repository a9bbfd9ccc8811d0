"""The kind workflow (.github/workflows/conformance-kind.yml) cannot run here (no Docker), so
it must not drift from what runs here: the configuration it applies
(tests/conformance/kind/warren-kind.yaml) renders the same objects as the local cluster tier's
(tests/cluster/warren-test.yaml, applied to the local node with `--local-node`) apart from the
host-specific settings docs/conformance.md lists; and the workflow builds, loads, applies,
waits for and tests exactly that."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from warren.config import SERVICE_IMAGES, WarrenConfig, load_config, parse_config
from warren.images import sandbox
from warren.images.services import SERVICES
from warren.node.workloads import for_local_node
from warren.render import render

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "conformance-kind.yml"
KIND = REPO / "tests" / "conformance" / "kind"
KIND_CONFIG = KIND / "warren-kind.yaml"
LOCAL_TIER_CONFIG = REPO / "tests" / "cluster" / "warren-test.yaml"
# Settings that name the host the platform runs on, and nothing about the platform: the local
# cluster's own ports, the node's directories, how images reach the node, and who administers
# the cluster (docs/conformance.md lists them).
HOST_SPECIFIC = (
    "cluster.api_port",
    "cluster.etcd_client_port",
    "cluster.etcd_peer_port",
    "cluster.etcd_metrics_port",
    "cluster.controller_manager_port",
    "cluster.scheduler_port",
    "cluster.joined_nodes",
    "services.kubelet_root",
    "services.stores_host_path",
    "services.blockd_state_host_path",
    "services.runsc_host_path",
    "services.runsc_root_host_path",
    # The local node makes its containerd state a shared mount; a kind node is left as it is.
    "services.containerd_state_host_path",
    "services.image_pull_policy",
    "services.image_digests",
    "services.gateway_cluster_ip",  # fixed where the node floor is ours, to let the gateway in
    "services.stores_node_selector",
    "isolation.platform_groups",
)
# A local node as the cluster tier's: its state directory, the digests its containerd holds.
LOCAL_STATE = Path("/srv/warren-cluster-tier/cluster")
HELD = {f"warren.dev/{name}:0.1.0": "sha256:" + f"{i + 1:02x}" * 32 for i, name in enumerate(SERVICE_IMAGES)}


def _get(data: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        data = data[part]
    return data


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *sections, key = dotted.split(".")
    for part in sections:
        data = data[part]
    data[key] = value


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf by its path: `a.b`, `a.list[0].c`."""
    if isinstance(data, dict):
        return {k: v for key, value in data.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    if isinstance(data, list | tuple) and data:
        return {
            k: v
            for i, value in enumerate(data)
            for k, v in _flat(value, f"{prefix.rstrip('.')}[{i}].").items()
        }
    return {prefix.rstrip("."): data}


def local_tier() -> WarrenConfig:
    """What the local cluster tier applies: its configuration as the local node needs it."""
    return for_local_node(load_config(LOCAL_TIER_CONFIG), LOCAL_STATE, HELD)


def differences(kind: WarrenConfig, local: WarrenConfig) -> dict[str, tuple[Any, Any]]:
    """Settings (key: (local, kind)) in which the two differ beyond the host-specific ones."""
    aligned = local.model_dump()
    for key in HOST_SPECIFIC:
        _set(aligned, key, _get(kind.model_dump(), key))
    ours, theirs = _flat(aligned), _flat(kind.model_dump())
    return {
        key: (ours.get(key), theirs.get(key)) for key in ours | theirs if ours.get(key) != theirs.get(key)
    }


def test_kind_renders_the_local_tiers_objects_but_for_the_host_specific_settings() -> None:
    kind, local = load_config(KIND_CONFIG), local_tier()
    assert kind.services.enabled and local.services.enabled
    differing = differences(kind, local)
    assert not differing, (
        f"{KIND_CONFIG.name} and the local tier's configuration differ beyond the host-specific "
        f"settings (key: (local, kind)): {differing}"
    )
    aligned = local.model_dump()
    for key in HOST_SPECIFIC:
        _set(aligned, key, _get(kind.model_dump(), key))
    assert render(parse_config(aligned)) == render(kind)
    # Even before aligning them, both make the same objects: the host shows in what they say,
    # and the install Job's name in the warren-control digest that only the local tier pins.
    pinned = local.services.install_job
    assert pinned.startswith(kind.services.install_job + "-")

    def identity(config: WarrenConfig) -> list[tuple[str, str]]:
        return [
            (
                o["kind"],
                kind.services.install_job if o["metadata"]["name"] == pinned else o["metadata"]["name"],
            )
            for o in render(config)
        ]

    assert identity(kind) == identity(local)


@pytest.mark.parametrize(
    ("drift", "key"),
    [
        ({"services": {"control_replicas": 3}}, "services.control_replicas"),
        ({"isolation": {"extra_namespaces": []}}, "isolation.extra_namespaces"),
        ({"services": {"image_tag": "9.9.9"}}, "services.image_tag"),
        (
            {"cluster": {"workspaces": {"replicate_wait_seconds": 5}}},
            "cluster.workspaces.replicate_wait_seconds",
        ),
    ],
)
def test_a_drift_is_named(drift: dict[str, Any], key: str) -> None:
    data = yaml.safe_load(KIND_CONFIG.read_text())
    for section, values in drift.items():
        data.setdefault(section, {}).update(values)
    assert any(found.startswith(key) for found in differences(parse_config(data), local_tier()))


def test_the_host_specific_settings_are_documented() -> None:
    docs = (REPO / "docs" / "conformance.md").read_text()
    for key in HOST_SPECIFIC:
        named = (f"`{key}`", f"`{key.rsplit('.', 1)[1]}`")
        assert any(name in docs for name in named), f"docs/conformance.md does not name {key}"


# -- the workflow --------------------------------------------------------------------------------


def _workflow() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(WORKFLOW.read_text())
    return data


def _steps() -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = _workflow()["jobs"]["kind"]["steps"]
    return steps


def _commands() -> list[tuple[int, list[str]]]:
    """Every command line of every `run` step (continuations joined), split as a shell would
    split its words, with the step's index."""
    found = []
    for index, step in enumerate(_steps()):
        script = re.sub(r"\\\n\s*", " ", step.get("run", ""))
        for raw in script.splitlines():
            line = raw.strip()
            if line and not line.startswith("#"):
                found.append((index, shlex.split(line, comments=True)))
    return found


def _command(*words: str) -> tuple[int, list[str]]:
    """The one command whose words include `words` in order (e.g. "warren", "apply")."""
    matches = [
        (index, argv)
        for index, argv in _commands()
        if any(argv[i : i + len(words)] == list(words) for i in range(len(argv)))
        or any(
            w.endswith(f"/{words[0]}") and argv[i + 1 : i + len(words)] == list(words[1:])
            for i, w in enumerate(argv)
        )
    ]
    assert len(matches) == 1, f"expected one `{' '.join(words)}` in the workflow, found {matches}"
    return matches[0]


def _option(argv: list[str], name: str) -> str:
    (value,) = [argv[i + 1] for i, word in enumerate(argv) if word == name]
    return value


def _env() -> dict[str, str]:
    env: dict[str, str] = _workflow()["env"]
    return env


def test_the_workflow_applies_and_tests_the_kind_configuration() -> None:
    assert _env()["WARREN_CONFIG"] == str(KIND_CONFIG.relative_to(REPO))
    apply_at, apply = _command("warren", "apply")
    assert _option(apply, "--config") == "$WARREN_CONFIG"
    ready_at, ready = _command("warren", "platform", "ready")
    assert _option(ready, "--config") == "$WARREN_CONFIG"
    key_dir = _option(ready, "--record")
    conformance = [
        (i, argv) for i, argv in _commands() if "conformance" in argv and "warren" in " ".join(argv)
    ]
    assert len(conformance) == 2, conformance
    (floor_at, floor), (platform_at, platform) = conformance
    for argv in (floor, platform):
        assert _option(argv, "--config") == "$WARREN_CONFIG"
    assert "--runtime-tests" in floor and "-k" not in floor
    assert _option(platform, "-k") == "platform"
    assert _option(platform, "--api-key-file") == f"{key_dir}/api-key"  # what --record writes
    forward_at, forward = _command("kubectl", "-n", "warren-system", "port-forward")
    port = forward[forward.index("port-forward") + 2].split(":")[0]
    assert _option(platform, "--api-url") == f"http://127.0.0.1:{port}"
    assert apply_at < ready_at < floor_at < platform_at and forward_at == platform_at


def test_the_workflow_builds_and_loads_exactly_the_service_images() -> None:
    build_at, build = _command("warren", "image", "build")
    built = [word for word in build[build.index("build") + 1 :] if not word.startswith("-")]
    built = built[: len(SERVICE_IMAGES)]
    made_here = [s.name for s in SERVICES] + list(sandbox.IMAGES)
    assert sorted(built) == sorted(SERVICE_IMAGES) == sorted(made_here)
    # The registry the images are named with is the one the configuration names.
    assert "--registry" not in build
    assert load_config(KIND_CONFIG).services.image_registry == "warren.dev"
    sources = REPO / _option(build, "--apt-sources")
    assert sources.is_file() and "bookworm" in sources.read_text()
    out = _option(build, "--out")
    (loop_at, loop), (load_at, load) = [
        (i, argv)
        for i, argv in _commands()
        if argv[:2] == ["for", "image"] or argv[:3] == ["kind", "load", "image-archive"]
    ]
    loaded = loop[loop.index("in") + 1 : loop.index("do")] if "do" in loop else loop[loop.index("in") + 1 :]
    assert sorted(w.rstrip(";") for w in loaded) == sorted(SERVICE_IMAGES)
    assert load[3] == f"{out}/$image.tar"
    assert _option(load, "--name") == "$KIND_CLUSTER"
    create_at, _ = _command("kind", "create", "cluster")
    apply_at, _ = _command("warren", "apply")
    assert create_at < build_at < load_at < apply_at and loop_at == load_at


def test_the_kind_cluster_is_the_one_the_workflow_loads_into_and_matches_the_configuration() -> None:
    cluster = yaml.safe_load((KIND / "cluster.yaml").read_text())
    assert cluster["name"] == _env()["KIND_CLUSTER"]
    # The node's kubelet keeps kubeadm's root, which the configuration names.
    patches = "\n".join(cluster.get("kubeadmConfigPatches") or [])
    assert "root-dir" not in patches
    assert load_config(KIND_CONFIG).services.kubelet_root == "/var/lib/kubelet"
    # The node runs the Kubernetes minor the project pins.
    pinned = re.search(r"k8s\.io/kubernetes v(\d+\.\d+)\.", (REPO / "tools/kubernetes/go.mod").read_text())
    assert pinned
    (node,) = cluster["nodes"]
    assert node["image"].startswith(f"kindest/node:v{pinned.group(1)}.")
    # Images are loaded, busybox pulled: a policy that never pulls would starve the sandboxes.
    assert load_config(KIND_CONFIG).services.image_pull_policy == "IfNotPresent"


@pytest.mark.parametrize("step", ["Build the service images", "Install the platform"])
def test_each_named_step_exists(step: str) -> None:
    assert step in [s.get("name") for s in _steps()]
