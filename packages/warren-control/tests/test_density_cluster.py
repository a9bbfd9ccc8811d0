"""Density on the real gVisor test node: 100 idle sandboxes of the default size (1 CPU,
1 GiB), each with its agent, run side by side on the one 2-core node, and every one answers
a command through its agent. A sandbox reserves a share of its size (the deployed platform's
defaults, 1% of its CPU and 10% of its memory; docs/configuration.md), so the node holds
them; the kubelet admits more than its default 110 pods (node.max_pods). What an idle
sandbox costs in memory (gVisor's processes and the shim, by proportional set size) is
measured from the node's processes and printed; it must stay below what the sandbox
reserves, or the reservation would be a promise the node cannot keep."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from k8s_helpers import Controller, sandbox_body, serving_controller
from kubernetes.utils import parse_quantity
from warren_common.testing import gvisor_pss_kib, wait_for
from warren_control import agentclient
from warren_control.kube import Kube, Obj
from warren_control.podspec import CONTAINER

pytest_plugins = ["k8s_fixtures"]
pytestmark = pytest.mark.cluster

SANDBOXES = 100
START_TIMEOUT = 900  # 100 cold gVisor starts on two cores shared with the other lanes


@pytest.fixture
def dense_controller(
    kube: Kube, kubeconfig: str, namespace: str, agent_image: str, tmp_path: Path
) -> Iterator[Controller]:
    # The shares the deployed platform uses (services.sandbox_*_request_percent).
    shares = ("--cpu-request-percent", "1", "--memory-request-percent", "10")
    with serving_controller(
        kube,
        kubeconfig,
        namespace,
        tmp_path,
        extra_args=("--agent-image", agent_image, *shares),
        delete_timeout=600,
    ) as process:
        yield process


async def answer_all(addresses: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Each sandbox's answer to `echo <its name>`, through its own agent and token."""
    limit = asyncio.Semaphore(16)

    async def one(http: Any, name: str, address: str, token: str) -> tuple[str, str]:
        async with limit:
            started = await agentclient.start(http, agentclient.Agent(address, token), ["echo", name])
            out = b""
            async for item in started.outputs():
                if isinstance(item, agentclient.Exit):
                    assert item.code == 0, (name, item)
                elif item[0] == agentclient.STDOUT:
                    out += item[1]
            return name, out.decode().strip()

    async with agentclient.client() as http:
        answers = await asyncio.gather(*(one(http, n, a, t) for n, (a, t) in addresses.items()))
    return dict(answers)


def test_a_hundred_idle_sandboxes_run_and_answer(
    kube: Kube, namespace: str, image: str, dense_controller: Controller
) -> None:
    before_count, before_kib = gvisor_pss_kib()
    tokens = {f"idle-{i:03d}": secrets.token_hex(16) for i in range(SANDBOXES)}
    for i, (name, token) in enumerate(tokens.items()):
        body = sandbox_body(name, image, agentTokenSha256=hashlib.sha256(token.encode()).hexdigest())
        del body["spec"]["resources"]  # the default size
        if i % 4 == 0:  # an organization's own share (admin set-reservation), through the CRD
            body["spec"]["reservation"] = {"memoryPercent": 20}
        kube.create_sandbox(namespace, body)

    def all_running() -> list[Obj] | None:
        sandboxes = kube.list_sandboxes(namespace)
        running = [s for s in sandboxes if (s.get("status") or {}).get("phase") == "Running"]
        return running if len(running) == SANDBOXES else None

    try:
        running = wait_for(all_running, START_TIMEOUT, f"{SANDBOXES} Sandboxes to be Running", interval=2)
    except AssertionError:
        phases: dict[str, int] = {}
        for sandbox in kube.list_sandboxes(namespace):
            phase = (sandbox.get("status") or {}).get("phase", "none")
            phases[phase] = phases.get(phase, 0) + 1
        raise AssertionError(f"not all {SANDBOXES} Sandboxes are Running: {phases}") from None

    pods = {p["metadata"]["name"]: p for p in kube.list_pods(namespace, "warren.dev/sandbox=true")}
    addresses = {}
    for sandbox in running:
        pod = pods[sandbox["status"]["podName"]]
        name = sandbox["metadata"]["name"]
        addresses[name] = (pod["status"]["podIP"], tokens[name])
        # Each reserves a share of its size: 1% of 1 CPU, 10% of 1 GiB (20% for an
        # organization's own).
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == CONTAINER]
        resources = container["resources"]
        own = (sandbox["spec"].get("reservation") or {}).get("memoryPercent")
        assert parse_quantity(resources["limits"]["cpu"]) == 1
        assert parse_quantity(resources["requests"]["cpu"]) == parse_quantity("10m")
        assert resources["requests"]["memory"] == ("205Mi" if own else "103Mi")
    assert len({a for a, _ in addresses.values()}) == SANDBOXES  # one pod each, one address each

    answers = asyncio.run(answer_all(addresses))
    assert answers == {name: name for name in tokens}

    after_count, after_kib = gvisor_pss_kib()
    per_sandbox_mib = (after_kib - before_kib) / SANDBOXES / 1024
    request_mib = 103  # the smaller reservation, 10% of 1 GiB
    print(
        f"density: {SANDBOXES} idle sandboxes answered; gVisor processes {before_count} -> "
        f"{after_count}; proportional set size per idle sandbox {per_sandbox_mib:.1f} MiB "
        f"(it reserves {request_mib:.0f} MiB)"
    )
    assert 0 < per_sandbox_mib < request_mib
