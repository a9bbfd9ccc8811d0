"""Scale: 1,000 simulated nodes and 5,000 Sandboxes reconciled to Running, each
into exactly one pod, and all of them deleted again through the finalizer. The nodes are
kwok's (tests/kwok_cluster.py); the controller is the real one, as a subprocess with its
own ServiceAccount. tests/run-scale.sh runs this; WARREN_SCALE_NODES and
WARREN_SCALE_SANDBOXES shrink it for a quick look."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kwok_cluster import (
    CONTROLLER_WRITES,
    NAMESPACE,
    KwokCluster,
    api_requests,
    controller_writes,
    delete_all,
    list_all,
    missing_binaries,
    reconcile,
    sandboxes_path,
    warren_cli,
)
from warren_control.podspec import SANDBOX_UID_LABEL, controller_uid, pod_name

pytestmark = pytest.mark.scale

NODES = int(os.environ.get("WARREN_SCALE_NODES", "1000"))
SANDBOXES = int(os.environ.get("WARREN_SCALE_SANDBOXES", "5000"))
# Handler threads: enough that API round trips, not the pool, bound the controller.
WORKERS = 32


def unavailable(reason: str) -> None:
    # CI runs this tier on purpose: there a missing prerequisite fails instead of skipping.
    (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)


@pytest.fixture(scope="module")
def cluster() -> Iterator[KwokCluster]:
    bin_dir = os.environ.get("WARREN_BIN_DIR")
    if not bin_dir:
        unavailable(
            "no cluster binaries: set WARREN_BIN_DIR to the directory tools/build-cluster-binaries.sh "
            "prints (tests/run-scale.sh does)"
        )
        raise AssertionError  # not reached: skip and fail raise
    if missing := missing_binaries(Path(bin_dir)):
        unavailable(f"WARREN_BIN_DIR={bin_dir} lacks {', '.join(missing)}")
    if not warren_cli().exists():
        unavailable(f"no {warren_cli()}: `make venv` installs the warren command that applies the floor")
    with KwokCluster(Path(bin_dir)) as made:
        yield made


def test_sandboxes_on_kwok_nodes_reconcile_and_delete(cluster: KwokCluster, tmp_path: Path) -> None:
    started = time.monotonic()
    cluster.add_nodes(NODES)
    print(f"{NODES} kwok nodes Ready after {time.monotonic() - started:.1f} s")
    kube = cluster.kube
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"

    with cluster.controller(tmp_path, WORKERS) as controller:
        try:
            before = api_requests(kube)
            result = reconcile(cluster, controller, SANDBOXES, workers=WORKERS)
            created = api_requests(kube)
            print(result.summary())
            assert not result.create_errors, result.create_errors[:10]
            # A create costs the controller its pod and two status writes (Pending, Running):
            # the finalizer comes with the Sandbox, and kopf's state stays in memory.
            writes = controller_writes(before, created)
            print(f"controller writes per create: {writes / SANDBOXES:.2f}")
            assert writes <= 3 * SANDBOXES, {k: created[k] - before[k] for k in CONTROLLER_WRITES}

            sandboxes = list_all(kube, sandboxes_path())
            phases = Counter((s.get("status") or {}).get("phase") for s in sandboxes)
            assert phases == {"Running": SANDBOXES}, phases

            pods = list_all(kube, pods_path)
            owned: dict[str, list[str]] = {}
            for pod in pods:
                uid = controller_uid(pod)
                assert uid is not None, f"pod {pod['metadata']['name']} has no Sandbox as controller"
                assert pod["metadata"]["labels"][SANDBOX_UID_LABEL] == uid
                owned.setdefault(uid, []).append(pod["metadata"]["name"])
            for sandbox in sandboxes:
                uid = sandbox["metadata"]["uid"]
                assert owned.pop(uid, []) == [pod_name(uid)], f"Sandbox {sandbox['metadata']['name']}"
            assert not owned, f"pods whose Sandbox is not in the namespace: {sorted(owned)[:10]}"
            assert len(pods) == SANDBOXES

            assert all(p["status"].get("phase") == "Running" for p in pods)
            per_node = Counter(p["spec"].get("nodeName") for p in pods)
            assert set(per_node) <= set(cluster.nodes), "a pod landed on a node that is not kwok's"
            assert len(per_node) >= min(NODES, SANDBOXES) // 2, f"pods crowd onto {len(per_node)} nodes"
            print(f"pods on {len(per_node)} nodes, at most {max(per_node.values())} on one")

            delete_seconds = delete_all(cluster)
            per_delete = controller_writes(created, api_requests(kube)) / SANDBOXES
            print(f"controller writes per delete, besides its pod's: {per_delete:.2f}")
            print(
                f"deleted {SANDBOXES} Sandboxes in {delete_seconds:.1f} s "
                f"({SANDBOXES / delete_seconds:.1f}/s, finalizers included)"
            )
            assert not list_all(kube, sandboxes_path())
            assert not list_all(kube, pods_path), "pods outlived their Sandboxes"
        except BaseException:
            print(controller.logs())
            raise
    for name, usage in cluster.usage().items():
        print(f"{name} at the end: cpu {usage.cpu_seconds:.0f} s, peak rss {usage.peak_rss_mib:.0f} MiB")
    print(f"the whole test: {time.monotonic() - started:.1f} s")
