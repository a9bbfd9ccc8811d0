"""The `warren-control` program: the OpenAPI document it prints (and the committed copy in
docs/), and the sandbox commands against the API behind the real edge."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_stack import Stack
from warren_common.testing import free_port
from warren_control import cli, sdk, store
from warren_control.api.app import document
from warren_control.db import make_engine, session_factory

pytest_plugins = ["api_fixtures"]

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"
IMAGE = "registry.example/tools/busybox:1.36"


def test_the_committed_openapi_document_is_the_apps() -> None:
    # Regenerate with: warren-control openapi --output docs/openapi.json
    assert json.loads(COMMITTED.read_text()) == document()


def test_openapi_command_prints_the_document(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["openapi"]) == 0
    assert json.loads(capsys.readouterr().out) == document()


def run(stack: Stack, token: str, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["sandbox", "--url", stack.edge, "--api-key", token, *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_sandbox_commands(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    org = stack.org()
    code, out, _ = run(stack, org.token, capsys, "create", "--no-wait", IMAGE, "--", "sleep", "infinity")
    assert code == 0
    sandbox_id = out.strip()
    assert sandbox_id.startswith("sbx_")
    obj = stack.standin.get(stack.object_name(sandbox_id))
    assert obj is not None
    assert obj["spec"]["command"] == ["sleep", "infinity"]

    code, out, _ = run(stack, org.token, capsys, "get", sandbox_id)
    assert (code, json.loads(out)["id"]) == (0, sandbox_id)

    code, out, _ = run(stack, org.token, capsys, "list")
    assert code == 0
    assert sandbox_id in out
    assert out.splitlines()[0].split()[:3] == ["ID", "PHASE", "CREATED"]

    code, out, err = run(stack, org.token, capsys, "fork", "--no-wait", "--count", "2", sandbox_id)
    assert code == 0
    assert len(out.split()) == 2

    code, out, _ = run(stack, org.token, capsys, "stop", "--no-wait", sandbox_id)
    assert (code, out.strip()) == (0, sandbox_id)
    code, out, _ = run(stack, org.token, capsys, "start", "--no-wait", sandbox_id)
    assert (code, out.strip()) == (0, sandbox_id)

    code, out, err = run(stack, org.token, capsys, "exec", sandbox_id, "--", "echo", "hi")
    assert code == 1
    assert "not_running" in err

    code, out, _ = run(stack, org.token, capsys, "delete", sandbox_id)
    assert (code, out.strip()) == (0, sandbox_id)
    code, out, err = run(stack, org.token, capsys, "get", sandbox_id)
    assert code == 1
    assert err.startswith("error: not_found:")


def test_create_waits_for_running_and_shows_progress(
    stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    org = stack.org()
    made: list[str] = []
    before = set(stack.standin.objects)
    # The stand-in controller moves on to Running only once the CLI has read the sandbox as
    # Pending: on a busy machine no fixed pause is long enough (the create's answer can come
    # seconds after the Sandbox appeared and was reported on).
    pending_read = threading.Event()
    real_get = sdk.Client.get

    def get(self: sdk.Client, sandbox_id: str, **kwargs: Any) -> sdk.Sandbox:
        found = real_get(self, sandbox_id, **kwargs)
        if found.phase == "Pending":
            pending_read.set()
        return found

    monkeypatch.setattr(sdk.Client, "get", get)

    def controller() -> None:
        # Plays the controller: the Sandbox that appears is reported Pending, then Running.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not made:
            made.extend(name for key, name in list(stack.standin.objects) if (key, name) not in before)
            time.sleep(0.02)
        stack.standin.set_status(
            made[0],
            {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "ContainerCreating",
                        "message": "starting",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            },
        )
        pending_read.wait(timeout=60)
        stack.standin.set_status(made[0], {"phase": "Running"})

    helper = threading.Thread(target=controller)
    helper.start()
    code, out, err = run(stack, org.token, capsys, "--timeout", "20", "create", "progress/image:1")
    helper.join()
    assert code == 0
    assert out.strip().startswith("sbx_")
    lines = err.splitlines()
    assert any("Pending" in line for line in lines)
    assert any("ContainerCreating" in line for line in lines)
    assert "Running" in lines[-1]


def test_fork_ends_with_each_childs_reason_when_no_node_has_room(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    """The children are waited for together, each reported with the scheduler's reason, and
    the command ends (exit 1) instead of waiting out the timeout."""
    org = stack.org()
    parent = org.client.create(IMAGE)
    stack.standin.set_status(stack.object_name(parent.id), {"phase": "Running"})
    before = set(stack.standin.objects)
    full = "0/1 nodes are available: 1 Insufficient cpu."
    stop = threading.Event()

    def scheduler() -> None:  # plays the controller: every new Sandbox is unschedulable
        while not stop.is_set():
            for key, name in list(stack.standin.objects):
                if (key, name) not in before:
                    stack.standin.set_status(
                        name,
                        {
                            "phase": "Pending",
                            "conditions": [
                                {
                                    "type": "Ready",
                                    "status": "False",
                                    "reason": "Unschedulable",
                                    "message": full,
                                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                                }
                            ],
                        },
                    )
            time.sleep(0.05)

    helper = threading.Thread(target=scheduler)
    helper.start()
    try:
        argv = ("--timeout", "600", "--unschedulable-for", "1", "fork", "--count", "2", parent.id)
        code, out, err = run(stack, org.token, capsys, *argv)
    finally:
        stop.set()
        helper.join()
    assert (code, out) == (1, "")
    failures = [line for line in err.splitlines() if line.startswith("child ")]
    assert len(failures) == 2, err
    assert all("cannot_start" in line and full in line for line in failures), err
    assert "Unschedulable" in err  # the progress lines said why while it waited


def test_refusals_exit_non_zero_with_the_code(stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    org = stack.org(quota_sandboxes=0)
    code, _, err = run(stack, org.token, capsys, "create", "--no-wait", IMAGE)
    assert code == 1
    assert err.startswith("error: quota_exceeded:")
    code, _, err = run(stack, "wk_aaaaaaaaaaaa_" + "A" * 43, capsys, "list")
    assert code == 1
    assert "unauthenticated" in err


def _until_up(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "the server exited"
        try:
            httpx.get(url, timeout=1)
        except httpx.TransportError:
            time.sleep(0.1)
            continue
        return
    raise AssertionError(f"{url} did not come up")


def test_serve_runs_the_api_behind_the_edge(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'records.db'}"
    key_file = tmp_path / "stamp.key"
    key_file.write_bytes(b"x" * 48 + b"\n")
    api_port, edge_port = free_port(), free_port()
    common = ["--database-url", url, "--stamp-key-file", str(key_file)]
    program = [sys.executable, "-m", "warren_control.cli", "serve"]
    api_log = tmp_path / "api.log"
    with api_log.open("wb") as sink:
        api = subprocess.Popen(
            [*program, "--role", "api", "--port", str(api_port), "--migrate", *common], stderr=sink
        )
    processes = [api]
    try:
        _until_up(f"http://127.0.0.1:{api_port}/healthz", api)
        edge = subprocess.Popen(
            [
                *program,
                "--role",
                "edge",
                "--port",
                str(edge_port),
                "--api-url",
                f"http://127.0.0.1:{api_port}",
                *common,
            ]
        )
        processes.append(edge)
        _until_up(f"http://127.0.0.1:{edge_port}/v1/sandboxes", edge)
        sessions = session_factory(make_engine(url))
        with sessions.begin() as session:
            org = store.create_org(session, "served")
            user = store.create_user(session, org.id, "admin")
            token = store.issue_api_key(session, org.id, user.id, []).token
        listed = httpx.get(
            f"http://127.0.0.1:{edge_port}/v1/sandboxes", headers={"Authorization": f"Bearer {token}"}
        )
        assert (listed.status_code, listed.json()) == (200, {"items": [], "next_cursor": None})
        assert httpx.get(f"http://127.0.0.1:{edge_port}/v1/sandboxes").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{api_port}/v1/sandboxes").status_code == 401
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
    # Logs are JSON lines, uvicorn's included: its access line also as fields.
    lines = [json.loads(line) for line in api_log.read_text().splitlines()]
    assert any(line["event"] == "Application startup complete." for line in lines)
    assert any(
        (line["logger"], line.get("path"), line.get("status")) == ("uvicorn.access", "/v1/sandboxes", 401)
        for line in lines
    )


def test_a_pool_must_name_a_template(tmp_path: Path) -> None:
    key_file = tmp_path / "stamp.key"
    key_file.write_bytes(b"x" * 48 + b"\n")
    program = [sys.executable, "-m", "warren_control.cli", "serve", "--role", "api"]
    common = ["--database-url", f"sqlite:///{tmp_path / 'r.db'}", "--stamp-key-file", str(key_file)]
    done = subprocess.run(
        [*program, *common, "--template", "base=busybox", "--pool", "big"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "--pool big names no template: give --template big=IMAGE too" in done.stderr
