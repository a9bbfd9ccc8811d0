"""The platform tier: with an API URL and a key (--api-url, --api-key-file), the installed
platform itself, through its API as an agent uses it: create, exec, a file in /workspace,
three forks that each see it and diverge on their own, stop and start with the file kept,
/workspace nosuid,nodev, delete. It talks to the API only, so it proves any install: the
local deployment, kind, an existing cluster."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

WAIT_S = 400.0  # a cold gVisor start on a busy two-core machine
FILE = "/workspace/conformance.txt"


@pytest.fixture(scope="module")
def made(platform: Any) -> Iterator[list[str]]:
    """Every sandbox the tier makes, deleted at the end whatever happened."""
    ids: list[str] = []
    yield ids
    for sandbox_id in ids:
        try:
            platform.delete(sandbox_id)
            platform.wait_until(sandbox_id, "Deleted", timeout=WAIT_S)
        except Exception as exc:  # keep deleting the rest; say what stayed
            print(f"could not delete {sandbox_id}: {exc}")


@pytest.fixture(scope="module")
def parent(platform: Any, image: str, made: list[str]) -> str:
    created = platform.create(image, command=["sleep", "86400"], cpu_millis=100, memory_mib=128)
    made.append(created.id)
    running = platform.wait_until(created.id, "Running", timeout=WAIT_S)
    assert running.phase == "Running"
    return str(created.id)


def run(platform: Any, sandbox_id: str, *command: str) -> str:
    result = platform.run(sandbox_id, list(command), timeout=120)
    assert result.exit_code == 0, (command, result.stderr)
    return str(result.stdout.decode())


def test_exec_runs_in_the_sandbox(platform: Any, parent: str) -> None:
    assert run(platform, parent, "echo", "hi") == "hi\n"


def test_the_workspace_is_nosuid_and_nodev(platform: Any, parent: str) -> None:
    mounts = [line.split() for line in run(platform, parent, "cat", "/proc/mounts").splitlines()]
    (workspace,) = [m for m in mounts if m[1] == "/workspace"]
    options = set(workspace[3].split(","))
    assert {"nosuid", "nodev"} <= options, workspace


def test_forks_see_the_file_and_diverge_alone(platform: Any, parent: str, made: list[str]) -> None:
    content = f"written before the fork {uuid.uuid4()}\n".encode()
    assert platform.write_file(parent, FILE, content) == len(content)
    assert platform.read_file(parent, FILE) == content

    results = platform.fork(parent, 3)
    assert [r.ok for r in results] == [True, True, True], [(r.error, r.message) for r in results]
    children = [str(r.sandbox.id) for r in results]
    made.extend(children)
    assert len(set(children)) == 3 and parent not in children
    for child in children:
        assert platform.wait_until(child, "Running", timeout=WAIT_S).phase == "Running"
        assert platform.read_file(child, FILE) == content, child

    changed = b"only in the first child\n"
    platform.write_file(children[0], FILE, changed)
    assert platform.read_file(children[0], FILE) == changed
    for other in (parent, *children[1:]):
        assert platform.read_file(other, FILE) == content, other


def test_stop_and_start_keep_the_workspace(platform: Any, parent: str) -> None:
    content = f"kept across a stop {uuid.uuid4()}\n".encode()
    platform.write_file(parent, "/workspace/kept.txt", content)
    platform.stop(parent)
    assert platform.wait_until(parent, "Stopped", timeout=WAIT_S).phase == "Stopped"
    platform.start(parent)
    assert platform.wait_until(parent, "Running", timeout=WAIT_S).phase == "Running"
    assert platform.read_file(parent, "/workspace/kept.txt") == content


def test_delete_makes_it_gone(platform: Any, image: str) -> None:
    created = platform.create(image, command=["sleep", "86400"], cpu_millis=100, memory_mib=128)
    platform.wait_until(created.id, "Running", timeout=WAIT_S)
    platform.delete(created.id)
    assert platform.wait_until(created.id, "Deleted", timeout=WAIT_S).phase == "Deleted"
