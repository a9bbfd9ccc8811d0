"""Scale: 1,000 simulated nodes and 5,000 Sandboxes reconciled to Running, each
into exactly one pod, and all of them deleted again through the finalizer. The nodes are
kwok's (tests/kwok_cluster.py); the controller is the real one, as a subprocess with its
own ServiceAccount. tests/run-scale.sh runs this; WARREN_SCALE_NODES and
WARREN_SCALE_SANDBOXES shrink it for a quick look."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
from kwok_cluster import (
    CONTROLLER_WRITES,
    NAMESPACE,
    KwokCluster,
    api_requests,
    controller_reads,
    controller_writes,
    delete_all,
    list_all,
    reconcile,
    sandboxes_path,
)
from warren_control.kube import Obj
from warren_control.podspec import SANDBOX_UID_LABEL, controller_uid, pod_name

pytestmark = pytest.mark.scale

NODES = int(os.environ.get("WARREN_SCALE_NODES", "1000"))
SANDBOXES = int(os.environ.get("WARREN_SCALE_SANDBOXES", "5000"))
# Handler threads: enough that API round trips, not the pool, bound the controller.
WORKERS = 32


def assert_one_running_pod_each(cluster: KwokCluster, sandboxes: list[Obj], pods: list[Obj]) -> None:
    """Each Sandbox owns exactly its one pod, Running on a kwok node; the pods are spread."""
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


def test_sandboxes_on_kwok_nodes_reconcile_and_delete(kwok: KwokCluster, tmp_path: Path) -> None:
    started = time.monotonic()
    kwok.add_nodes(NODES)
    print(f"{NODES} kwok nodes Ready after {time.monotonic() - started:.1f} s")
    kube = kwok.kube
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"

    with kwok.controller(tmp_path, WORKERS) as controller:
        try:
            before = api_requests(kube)
            result = reconcile(kwok, controller, SANDBOXES, workers=WORKERS)
            created = api_requests(kube)
            print(result.summary())
            assert not result.create_errors, result.create_errors[:10]
            # A create costs the controller its pod and its Running status when the pod runs
            # within the quiet start (a slower one gets a Pending status first): the
            # finalizer comes with the Sandbox.
            writes = controller_writes(before, created)
            print(f"controller writes per create: {writes / SANDBOXES:.2f}")
            # Its passes read the watches' memory: a GET is the exception (a create that met
            # AlreadyExists), not a part of every pass.
            reads = controller_reads(before, created)
            print(f"single-object reads per create: {reads / SANDBOXES:.2f}")
            assert reads <= SANDBOXES // 100, f"{reads} GETs of single pods and Sandboxes"
            assert writes <= 3 * SANDBOXES, {k: created[k] - before[k] for k in CONTROLLER_WRITES}

            sandboxes = list_all(kube, sandboxes_path())
            phases = Counter((s.get("status") or {}).get("phase") for s in sandboxes)
            assert phases == {"Running": SANDBOXES}, phases

            assert_one_running_pod_each(kwok, sandboxes, list_all(kube, pods_path))

            delete_seconds = delete_all(kwok)
            deleted = api_requests(kube)
            per_delete = controller_writes(created, deleted) / SANDBOXES
            # The Terminating status, once per delete; then the removal of the finalizer, one
            # write unless the Sandbox's finalizers changed meanwhile.
            print(f"controller writes per delete, besides its pod's: {per_delete:.2f}")
            by_request = {f"{v} {r}": deleted[v, r] - created[v, r] for v, r in CONTROLLER_WRITES}
            print(f"by request: {by_request}")
            assert by_request["PATCH sandboxes/status"] <= SANDBOXES, by_request
            assert by_request["PATCH sandboxes"] <= 1.1 * SANDBOXES, by_request
            reads = controller_reads(created, deleted)
            print(f"single-object reads per delete: {reads / SANDBOXES:.2f}")
            assert reads <= SANDBOXES // 100, f"{reads} GETs of single pods and Sandboxes"
            print(
                f"deleted {SANDBOXES} Sandboxes in {delete_seconds:.1f} s "
                f"({SANDBOXES / delete_seconds:.1f}/s, finalizers included)"
            )
            assert not list_all(kube, sandboxes_path())
            assert not list_all(kube, pods_path), "pods outlived their Sandboxes"
        except BaseException:
            print(controller.logs())
            raise
    for name, usage in kwok.usage().items():
        print(f"{name} at the end: cpu {usage.cpu_seconds:.0f} s, peak rss {usage.peak_rss_mib:.0f} MiB")
    print(f"the whole test: {time.monotonic() - started:.1f} s")
