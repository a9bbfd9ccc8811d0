"""The E2B SDK, unchanged, against the platform site.yml deployed: a program written for E2B
(e2b_program.py) run with only E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL set creates a
sandbox of the template `base` (a gVisor pod with the agent delivered into it), runs
commands, reads and writes files, forks, pauses and resumes, and kills it. Another
organization's key sees and touches none of it, and a call to the sandbox's agent without
the sandbox's token is refused at the edge."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import AuthenticationException, SandboxNotFoundException
from test_control_plane import admin, ok

pytestmark = pytest.mark.cluster

PROGRAM = Path(__file__).with_name("e2b_program.py")
AGENT_PORT = "49983"


def e2b_env(url: str, key: str) -> dict[str, str]:
    """The only configuration an E2B program gets: its three variables (and a PATH)."""
    return {"PATH": os.environ["PATH"], "E2B_API_KEY": key, "E2B_API_URL": url, "E2B_SANDBOX_URL": url}


@pytest.fixture(scope="module")
def edge(state: Path) -> str:
    return (state / "control-plane" / "url").read_text().strip()


@pytest.fixture(scope="module")
def keys(env: dict[str, str], state: Path) -> Iterator[tuple[str, str]]:
    """An e2b_ key of the first organization and one of an organization of its own."""
    mine = ok(admin(env, state, "issue-key", "default", "e2b-program", "--e2b")).strip()
    strangers = f"e2b-strangers-{secrets.token_hex(4)}"  # new on every run, records kept or not
    ok(admin(env, state, "create-org", strangers))
    theirs = ok(admin(env, state, "issue-key", strangers, "stranger", "--e2b")).strip()
    yield mine, theirs
    for key in (mine, theirs):
        ok(admin(env, state, "revoke-key", key))


def test_an_e2b_program_runs_unchanged(edge: str, keys: tuple[str, str]) -> None:
    program = [sys.executable, str(PROGRAM)]
    env = e2b_env(edge, keys[0])
    done = subprocess.run(program, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    failed = {k: v for k, v in report.items() if isinstance(v, str) and v.startswith("FAILED")}
    assert not failed, failed
    assert report["outputs"] == [0, "hi\nuser\n/home/user\n", "to-stderr\n"]
    assert report["exit_code"] == 3
    assert report["envs_and_cwd"] == "1\n/tmp\n"
    assert report["streaming"] == "1\n2\n3\n"
    assert report["large_output"] == 3_000_000
    assert report["background_and_kill"] == [True, True, False]
    assert report["stdin"] == "typed in\n"
    assert report["text_and_binary"] == ["hello", True]
    assert report["listing_and_info"] == [["a.txt"], True, 256, False]
    assert report["mkdir_rename_remove"] == [True, "hello", False]
    assert report["watch"] is True
    assert report["listing_by_metadata"] is True
    assert report["timeout"] is True
    assert report["fork"] == [["from-the-parent\n", "in-memory\n"]] * 2
    assert report["pause_and_connect"] == [True, True, "kept\n"]
    assert report["metrics"] == [True, True, True]
    assert report["snapshot"] == ["in-the-snapshot\n", True, True]
    assert report["kill"] == [True, False]


def test_another_organization_and_a_missing_token_are_refused(edge: str, keys: tuple[str, str]) -> None:
    mine, theirs = ({"api_key": key, "api_url": edge, "sandbox_url": edge} for key in keys)
    sandbox = Sandbox.create(timeout=300, **mine)
    try:
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(sandbox.sandbox_id, **theirs)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sandbox.sandbox_id, **theirs)
        assert Sandbox.kill(sandbox.sandbox_id, **theirs) is False
        assert sandbox.sandbox_id not in [s.sandbox_id for s in Sandbox.list(**theirs).next_items()]
        # The stranger's own sandbox's token does not open this one, nor does no token.
        other = Sandbox.create(timeout=300, **theirs)
        route = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": AGENT_PORT}
        for headers in ({}, {"X-Access-Token": other._envd_access_token or ""}):
            answer = httpx.post(
                f"{edge}/process.Process/List", json={}, headers={**route, **headers}, timeout=30
            )
            assert answer.status_code == 401, headers
        other.kill()
        # The owner's SDK, with its token, gets through; the sandbox still runs.
        assert sandbox.commands.run("echo still here").stdout == "still here\n"
        with pytest.raises(AuthenticationException):
            Sandbox.create(api_key="e2b_" + "0" * 64, api_url=edge)
    finally:
        sandbox.kill()
