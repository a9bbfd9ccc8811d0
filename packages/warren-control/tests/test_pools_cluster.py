"""Warm pools on a real gVisor node: a SandboxPool's pods start with the agent unclaimed; a
Sandbox naming the pool claims one, and from then on its agent answers that Sandbox's token
alone and runs commands with that Sandbox's environment; nobody can claim it again; the pool
refills with new pods, and the claimed one goes with its Sandbox. The controller runs as a
subprocess with the ServiceAccount and RBAC `warren apply` gives it, and the agent image the
node imported (WARREN_AGENT_IMAGE; tests/cluster/run.sh sets it)."""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from k8s_helpers import SMALL, Controller, sandbox_body, serving_controller
from warren_common.testing import wait_for
from warren_control import agentclient
from warren_control.kube import Kube, Obj
from warren_control.podspec import AGENT_PORT, pool_of

pytest_plugins = ["k8s_fixtures"]
pytestmark = pytest.mark.cluster

START_TIMEOUT = 180  # cold gVisor starts on a small, busy test machine


@pytest.fixture
def pooled_controller(
    kube: Kube, kubeconfig: str, namespace: str, agent_image: str, tmp_path: Path
) -> Iterator[Controller]:
    with serving_controller(
        kube, kubeconfig, namespace, tmp_path, extra_args=("--agent-image", agent_image)
    ) as process:
        yield process


def ready_pool_pods(kube: Kube, namespace: str, size: int) -> list[Obj] | None:
    status = kube.request("GET", kube.pools_path(namespace, "base")).get("status") or {}
    pods = [p for p in kube.list_pods(namespace, "warren.dev/pool=base") if pool_of(p)]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live if status.get("ready") == size and len(live) == size else None


async def run(address: str, token: str, command: list[str]) -> tuple[str, agentclient.Exit]:
    async with agentclient.client() as http:
        started = await agentclient.start(http, agentclient.Agent(address, token), command)
        out, end = b"", agentclient.Exit(None, "no end")
        async for item in started.outputs():
            if isinstance(item, agentclient.Exit):
                end = item
            elif item[0] == agentclient.STDOUT:
                out += item[1]
        return out.decode(), end


def test_a_claimed_pool_pod_serves_its_sandbox_alone(
    kube: Kube, namespace: str, image: str, pooled_controller: Controller
) -> None:
    pool = {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": "base"},
        "spec": {"image": image, "command": ["sleep", "86400"], "resources": dict(SMALL), "size": 2},
    }
    kube.request("POST", kube.pools_path(namespace), body=pool)
    started = time.monotonic()
    before = wait_for(lambda: ready_pool_pods(kube, namespace, 2), START_TIMEOUT, "two ready pool pods")
    print(f"timing: pool of 2 ready: {time.monotonic() - started:.2f} s")
    for pod in before:  # the agent is there, and serves no one yet
        assert (
            httpx.post(f"http://{pod['status']['podIP']}:{AGENT_PORT}/process.Process/List").status_code
            == 401
        )

    token = secrets.token_hex(16)
    body = sandbox_body(
        "claimer",
        image,
        pool="base",
        agentTokenSha256=hashlib.sha256(token.encode()).hexdigest(),
        env={"GREETING": "from-the-claim"},
    )
    started = time.monotonic()
    kube.create_sandbox(namespace, body)

    def running() -> Obj | None:
        found = kube.read_sandbox(namespace, "claimer") or {}
        return found if (found.get("status") or {}).get("phase") == "Running" else None

    sandbox = wait_for(running, START_TIMEOUT, "the claiming Sandbox to be Running", interval=0.1)
    print(f"timing: create to Running from the pool: {time.monotonic() - started:.2f} s")
    (claimed,) = [c for c in sandbox["status"]["conditions"] if c["type"] == "PoolClaimed"]
    assert (claimed["status"], claimed["reason"]) == ("True", "Claimed"), claimed
    pod = kube.read_pod(namespace, sandbox["status"]["podName"])
    assert pod is not None and pod["metadata"]["uid"] in {p["metadata"]["uid"] for p in before}
    address = pod["status"]["podIP"]

    out, end = asyncio.run(run(address, token, ["sh", "-c", "echo $GREETING; dmesg | head -1"]))
    assert end.code == 0, end
    assert out.splitlines()[0] == "from-the-claim"
    assert "gVisor" in out
    with pytest.raises(agentclient.AgentError, match="refused the sandbox's token"):
        asyncio.run(run(address, secrets.token_hex(16), ["true"]))
    # Nobody claims it again, not with any token.
    again = {"accessTokenSha256": hashlib.sha256(b"x").hexdigest(), "envVars": {}}
    for claim_token in ("", token, secrets.token_hex(32)):
        answer = httpx.post(
            f"http://{address}:{AGENT_PORT}/claim", json=again, headers={"X-Claim-Token": claim_token}
        )
        assert answer.status_code in {401, 409}, answer.text

    # The pool refills with new pods; the claimed one goes with its Sandbox, never back.
    refilled = wait_for(lambda: ready_pool_pods(kube, namespace, 2), START_TIMEOUT, "the pool to refill")
    assert pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in refilled}
    kube.delete_sandbox(namespace, "claimer")
    wait_for(lambda: kube.read_pod(namespace, pod["metadata"]["name"]) is None, 120, "the claimed pod to go")
    left = wait_for(lambda: ready_pool_pods(kube, namespace, 2), START_TIMEOUT, "the pool after the delete")
    assert pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in left}
