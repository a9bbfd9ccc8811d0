"""Warren's own exec and files (/v1, its SDK and CLI) go through the sandbox's agent when its
pod has one: the real agent (agent/, built here) plays the pod at a loopback address, as in
test_e2b_api.py, and the API reaches it with the token it derives for the sandbox. Through
Kubernetes exec (a pod without an agent) the same calls are the control tier's
(test_api_cluster.py, against real gVisor pods)."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from api_stack import NAMESPACE, OrgHandle, Stack, StandIn, serve_stack
from test_e2b_api import RunningPod, agent_binary, run_pod
from warren_control import agentclient
from warren_control.podspec import AGENT_CONTAINER, AGENT_PORT, pod_name
from warren_control.sdk import WarrenError

pytest_plugins = ["api_fixtures"]
__all__ = ["agent_binary"]  # a fixture, used by name

MAX_FILE_BYTES = 1 << 20


@pytest.fixture(scope="module")
def agent_stack(stack_url: str, standin: StandIn) -> Iterator[Stack]:
    with serve_stack(stack_url, standin, max_file_bytes=MAX_FILE_BYTES) as served:
        yield served


@dataclass
class Box:
    org: OrgHandle
    id: str
    home: Path  # where the agent runs, so where its files land


@pytest.fixture
def box(agent_stack: Stack, standin: StandIn, agent_binary: Path, tmp_path: Path) -> Iterator[Box]:
    """A sandbox whose pod runs the agent (its init container is what says so)."""
    org = agent_stack.org()
    sandbox = org.client.create("warren.dev/base:test", cpu_millis=100, memory_mib=128)
    pod: RunningPod = run_pod(agent_stack, standin, agent_binary, tmp_path, sandbox.id.removeprefix("sbx_"))
    name = pod_name(standin.get(agent_stack.object_name(sandbox.id))["metadata"]["uid"])
    standin.pods[(NAMESPACE, name)]["spec"] = {"initContainers": [{"name": AGENT_CONTAINER}]}
    try:
        yield Box(org, sandbox.id, tmp_path)
    finally:
        pod.process.terminate()
        pod.process.wait(timeout=10)


def test_exec_streams_through_the_agent(agent_stack: Stack, box: Box) -> None:
    sandbox_id, home, client = box.id, box.home, box.org.client
    result = client.run(sandbox_id, ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr) == (3, b"out\n", b"err\n")
    # The agent ran it: in the pod's (here: the agent's) home, as its process.
    assert client.run(sandbox_id, ["sh", "-c", 'echo "$HOME"']).stdout == f"{home}\n".encode()
    # Bytes that are not UTF-8 arrive intact; so does a lot of output.
    assert client.run(sandbox_id, ["printf", "\\377\\376ok"]).stdout == b"\xff\xfeok"
    big = client.run(sandbox_id, ["sh", "-c", "head -c 3000000 /dev/zero | tr '\\0' x"])
    assert big.stdout == b"x" * 3_000_000
    # Standard input, binary, larger than a pipe holds, while the command also writes.
    data = os.urandom(700_000)
    echoed = client.run(sandbox_id, ["sh", "-c", "cat; echo done >&2"], stdin=data)
    assert (echoed.exit_code, echoed.stdout, echoed.stderr) == (0, data, b"done\n")
    assert client.run(sandbox_id, ["wc", "-c"], stdin=b"").stdout.strip() == b"0"
    # A program that does not exist, one killed by a signal, one past its time.
    with pytest.raises(WarrenError) as missing:
        client.run(sandbox_id, ["/no/such/program"])
    assert missing.value.code == "exec_failed"
    with pytest.raises(WarrenError) as killed:
        client.run(sandbox_id, ["sh", "-c", "kill -9 $$"])
    assert (killed.value.code, "killed" in killed.value.message) == ("exec_failed", True)
    with pytest.raises(WarrenError) as slow:
        client.run(sandbox_id, ["sleep", "30"], timeout=1)
    assert slow.value.code == "timeout"


def test_stdin_that_is_not_base64_or_too_large_is_refused(agent_stack: Stack, box: Box) -> None:
    sandbox_id = box.id
    url = f"{agent_stack.edge}/v1/sandboxes/{sandbox_id}/exec"
    headers = {"Authorization": f"Bearer {box.org.token}"}
    bad = httpx.post(url, json={"command": ["cat"], "stdin_base64": "not base64!"}, headers=headers)
    assert (bad.status_code, bad.json()["error"]) == (400, "invalid_request")
    assert "stdin_base64" in bad.json()["message"]
    large = base64.b64encode(b"x" * (MAX_FILE_BYTES + 1)).decode()
    too_large = httpx.post(url, json={"command": ["cat"], "stdin_base64": large}, headers=headers)
    assert (too_large.status_code, too_large.json()["error"]) == (413, "too_large")


def test_files_go_through_the_agent(agent_stack: Stack, box: Box) -> None:
    sandbox_id, home, client = box.id, box.home, box.org.client
    blob = os.urandom(300_000) + b"\x00\xff" * 10
    target = f"{home}/deep/er/blob.bin"
    assert client.write_file(sandbox_id, target, blob) == len(blob)
    assert (home / "deep" / "er" / "blob.bin").read_bytes() == blob  # where the agent wrote it
    assert client.read_file(sandbox_id, target) == blob
    assert client.write_file(sandbox_id, f"{home}/empty", b"") == 0
    assert client.read_file(sandbox_id, f"{home}/empty") == b""
    with pytest.raises(WarrenError) as absent:
        client.read_file(sandbox_id, f"{home}/never-written")
    assert (absent.value.status, absent.value.code) == (404, "file_not_found")
    (home / "huge").write_bytes(b"y" * (MAX_FILE_BYTES + 1))
    with pytest.raises(WarrenError) as huge:
        client.read_file(sandbox_id, f"{home}/huge")
    assert (huge.value.status, huge.value.code) == (413, "too_large")
    with pytest.raises(WarrenError) as directory:
        client.read_file(sandbox_id, str(home))
    assert directory.value.status == 400


def test_another_organization_reaches_nothing(agent_stack: Stack, box: Box) -> None:
    sandbox_id, home = box.id, box.home
    stranger = agent_stack.org().client
    for attempt in (
        lambda: stranger.run(sandbox_id, ["true"]),
        lambda: stranger.read_file(sandbox_id, f"{home}/x"),
        lambda: stranger.write_file(sandbox_id, f"{home}/x", b"x"),
    ):
        with pytest.raises(WarrenError) as refused:
            attempt()
        assert refused.value.code == "not_found"
    assert not (home / "x").exists()


def test_wait_healthy_answers_once_a_starting_agent_listens(agent_binary: Path, tmp_path: Path) -> None:
    """What the controller asks of a fork-pool pod's new container: nothing listens at first
    (its port refuses), then the agent does."""
    address = "127." + ".".join(str(b) for b in secrets.token_bytes(2)) + f".{2 + secrets.randbelow(250)}"
    assert not agentclient.wait_healthy(address, 0.3)  # nothing listens: false at the deadline
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "WARREN_AGENT_ACCESS_TOKEN": "t"}
    started: list[subprocess.Popen[bytes]] = []
    later = threading.Timer(
        0.3,
        lambda: started.append(
            subprocess.Popen(
                [str(agent_binary), "-listen", f"{address}:{AGENT_PORT}"], env=env, stderr=subprocess.DEVNULL
            )
        ),
    )
    later.start()
    try:
        assert agentclient.wait_healthy(address, 20)
    finally:
        later.join()
        for process in started:
            process.terminate()
            process.wait(timeout=10)
