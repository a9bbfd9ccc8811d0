"""What the workloads tests share: the cluster tier's cluster (tests/cluster/run.sh deploys
the platform and names its kubeconfig in WARREN_KUBECONFIG) and a bounded wait."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from kubernetes import client, config

T = TypeVar("T")
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
