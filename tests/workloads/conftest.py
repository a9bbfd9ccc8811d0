"""What the workloads tests share: the cluster tier's cluster (tests/cluster/run.sh deploys
the platform and names its kubeconfig in WARREN_KUBECONFIG), a bounded wait, and the API
through the edge."""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client, config

T = TypeVar("T")
SYSTEM = "warren-system"
WAIT_S = 600.0  # images start from the node's store; cold gVisor starts on a busy two-core machine


@pytest.fixture(scope="module")
def api() -> client.ApiClient:
    kubeconfig = os.environ.get("WARREN_KUBECONFIG")
    if not kubeconfig:
        pytest.fail("WARREN_KUBECONFIG is not set: run the tier through tests/cluster/run.sh")
    return config.new_client_from_config(config_file=kubeconfig)


def wait_for(what: str, check: Callable[[], T | None], timeout: float = WAIT_S) -> T:
    """`check()`'s first truthy answer, polled every 2 s; a failed assertion after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(2)


def blockd_rolled_out(apps: client.AppsV1Api) -> bool:
    daemonset = apps.read_namespaced_daemon_set("warren-blockd", SYSTEM)
    status = daemonset.status
    return bool(
        status.observed_generation == daemonset.metadata.generation
        and status.desired_number_scheduled
        and status.updated_number_scheduled == status.desired_number_scheduled
        and status.number_available == status.desired_number_scheduled
        and status.number_ready == status.desired_number_scheduled
    )


def blockd_pods(core: client.CoreV1Api) -> list[Any]:
    return list(core.list_namespaced_pod(SYSTEM, label_selector="app.kubernetes.io/name=warren-blockd").items)


@pytest.fixture(scope="module")
def platform(api: client.ApiClient) -> Iterator[Any]:
    """The API through the edge's Service, with the install Job's first key."""
    from warren_control.sdk import Client

    core = client.CoreV1Api(api)
    wait_for("DaemonSet warren-blockd", lambda: blockd_rolled_out(client.AppsV1Api(api)))
    service = core.read_namespaced_service("warren-control", SYSTEM)
    port = next(p.port for p in service.spec.ports if p.port == 8080)  # the edge
    secret = wait_for(
        "Secret warren-first-key", lambda: core.read_namespaced_secret("warren-first-key", SYSTEM)
    )
    key = base64.b64decode(secret.data["key"]).decode()
    with Client(f"http://{service.spec.cluster_ip}:{port}", key, timeout=60.0) as sdk:
        yield sdk
