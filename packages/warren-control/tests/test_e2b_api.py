"""The E2B SDK (e2b, pinned), unchanged, against Warren's E2B surface: through the real edge
with an e2b_ key Warren issued, the API on SQLite and a real PostgreSQL, and the cluster
stand-in of api_stack.py in place of the Kubernetes API server.

Sandbox traffic (commands, files) goes through the edge to the real agent (agent/, built
here), which plays the sandbox's pod: the stand-in is given a Running pod whose address is a
loopback address the agent listens on, so the edge's routing, its token check and the
SDK's own handling of what comes back are all real; what runs it in a gVisor pod is the
cluster tier's.

Every call below is the SDK's own public API, configured only by the options its
environment variables set (api_key, api_url, sandbox_url)."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from api_stack import NAMESPACE, STAMP_KEY, Stack, StandIn, serve_stack, settings_for
from e2b import CommandExitException, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
)
from warren_control import admin, keys, store
from warren_control.api.cluster import Cluster
from warren_control.models import Sandbox as Record
from warren_control.models import SandboxPhase, utcnow
from warren_control.podspec import AGENT_PORT, POOL_SKIPPED_ANNOTATION, pod_name
from warren_control.reaper import Reaper
from warren_control.sdk import Client, WarrenError
from warren_control.templates import Template

pytest_plugins = ["api_fixtures"]

IMAGE = "warren.dev/base:test"
AGENT_DIR = Path(__file__).resolve().parents[3] / "agent"
TEMPLATES = {
    "base": Template(image=IMAGE),
    "small": Template(image="warren.dev/busybox:1.36", memory_mib=256),
}


@dataclass
class E2bOrg:
    id: str
    key: str
    opts: dict[str, Any]


@pytest.fixture(scope="module")
def e2b_stack(stack_url: str, standin: StandIn) -> Iterator[Stack]:
    # No controller runs here, so nothing ever runs: these tests take the answer at once
    # (start_wait_s 0); test_create_waits_until_the_sandbox_runs plays the controller.
    with serve_stack(
        stack_url, standin, templates=TEMPLATES, sandbox_domain="sandboxes.example", start_wait_s=0
    ) as served:
        yield served


def new_org(stack: Stack, **settings: Any) -> E2bOrg:
    name = f"e2b-{hashlib.sha256(str(utcnow()).encode()).hexdigest()[:10]}"
    with stack.sessions.begin() as session:
        org = store.create_org(session, name, **settings)
        user = store.create_user(session, org.id, "agent")
        issued = store.issue_api_key(session, org.id, user.id, [], "e2b")
    # What E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL would set.
    opts = {"api_key": issued.token, "api_url": stack.edge, "sandbox_url": stack.edge}
    return E2bOrg(org.id, issued.token, opts)


def record(stack: Stack, sandbox_id: str) -> Record:
    with stack.sessions() as session:
        found = session.get(Record, "sbx_" + sandbox_id)
        assert found is not None
        return found


def test_create_get_and_kill_with_the_sdk(e2b_stack: Stack, standin: StandIn) -> None:
    org = new_org(e2b_stack)
    before = datetime.now(UTC)
    sandbox = Sandbox.create(
        "base", timeout=120, metadata={"task": "t-1", "owner": "ci"}, envs={"GREETING": "hi"}, **org.opts
    )
    # An id that fits in a host name ({port}-{id}.{domain}), and the domain the operator set.
    assert len(sandbox.sandbox_id) == 26
    assert sandbox.sandbox_domain == "sandboxes.example"
    assert sandbox.get_host(8080) == f"8080-{sandbox.sandbox_id}.sandboxes.example"

    info = sandbox.get_info()
    assert (info.sandbox_id, info.template_id, info.state) == (
        sandbox.sandbox_id,
        "base",
        SandboxState.RUNNING,
    )
    assert info.metadata == {"task": "t-1", "owner": "ci"}
    assert before + timedelta(seconds=110) < info.end_at < datetime.now(UTC) + timedelta(seconds=130)
    assert (info.cpu_count, info.memory_mb) == (1, 1024)

    # The template became the image; metadata and envs are kept; one Sandbox resource exists.
    kept = record(e2b_stack, sandbox.sandbox_id)
    assert kept.spec["image"] == IMAGE
    assert (kept.spec["metadata"], kept.spec["env"]) == ({"task": "t-1", "owner": "ci"}, {"GREETING": "hi"})
    resource = standin.get(kept.object_name)
    assert resource is not None
    assert resource["spec"]["image"] == IMAGE
    assert resource["spec"]["env"] == {"GREETING": "hi"}

    # Killed is gone at once, even while its pod is still stopping (the finalizer holds it).
    standin.hold_deletes = True
    try:
        assert sandbox.kill() is True
        assert standin.get(kept.object_name) is not None
        assert Sandbox.kill(sandbox.sandbox_id, **org.opts) is False
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(sandbox.sandbox_id, **org.opts)
    finally:
        standin.hold_deletes = False
        standin.finish_deletes()
    assert standin.get(kept.object_name) is None
    assert Sandbox.kill(sandbox.sandbox_id, **org.opts) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, **org.opts)


def test_template_size_and_unknown_templates(e2b_stack: Stack) -> None:
    org = new_org(e2b_stack)
    small = Sandbox.create("small", **org.opts)
    assert small.get_info().memory_mb == 256
    with pytest.raises(SandboxException, match=r"template 'no-such' not found.*base, small"):
        Sandbox.create("no-such", **org.opts)
    small.kill()


def test_what_cannot_be_enforced_is_refused_by_name(e2b_stack: Stack) -> None:
    org = new_org(e2b_stack)
    with pytest.raises(SandboxException, match="allow_internet_access is not supported"):
        Sandbox.create("base", allow_internet_access=False, **org.opts)
    # This deployment keeps no memory: a memory auto-pause asked for is refused, naming the fix.
    full = {"on_timeout": {"action": "pause", "mode": "full"}}
    with pytest.raises(SandboxException, match="autoPause: this sandbox's memory cannot be kept"):
        Sandbox.create("base", lifecycle=full, **org.opts)
    with pytest.raises(SandboxException, match="'1BAD' is not a variable name"):
        Sandbox.create("base", envs={"1BAD": "x"}, **org.opts)
    # Nothing was made by the refused requests.
    assert Sandbox.list(**org.opts).next_items() == []
    # Left to the API, the auto-pause keeps what it can: here the files.
    kept = Sandbox.create("base", lifecycle={"on_timeout": "pause"}, **org.opts)
    assert record(e2b_stack, kept.sandbox_id).spec["on_end"] == "stop"
    kept.kill()


def test_list_filters_and_pages(e2b_stack: Stack) -> None:
    org = new_org(e2b_stack, quota_sandboxes=10)
    made = [
        Sandbox.create("base", metadata={"batch": "b", "n": str(n), "odd key": "a value"}, **org.opts)
        for n in range(5)
    ]
    other = Sandbox.create("small", metadata={"batch": "other"}, **org.opts)
    made[1].pause()

    def every(query: SandboxQuery | None = None, **kwargs: Any) -> list[str]:
        paginator = Sandbox.list(query=query, limit=2, **kwargs, **org.opts)
        seen: list[str] = []
        pages = 0
        while paginator.has_next:
            seen += [s.sandbox_id for s in paginator.next_items()]
            pages += 1
        assert pages >= len(seen) // 2  # pages of two at most
        return seen

    ids = [s.sandbox_id for s in made]
    assert every(SandboxQuery(metadata={"batch": "b"})) == ids
    assert every(SandboxQuery(metadata={"odd key": "a value", "n": "3"})) == [ids[3]]
    assert every(SandboxQuery(metadata={"batch": "b"}), order="desc") == ids[::-1]
    assert every(SandboxQuery(state=[SandboxState.PAUSED])) == [ids[1]]
    running = every(SandboxQuery(state=[SandboxState.RUNNING]))
    assert running == [i for i in ids if i != ids[1]] + [other.sandbox_id]
    assert every(SandboxQuery(template="small")) == [other.sandbox_id]
    paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED]), **org.opts).next_items()
    assert [(s.state, s.metadata["n"]) for s in paused] == [(SandboxState.PAUSED, "1")]
    # The older list route answers running sandboxes only.
    response = httpx.get(
        f"{e2b_stack.edge}/sandboxes", headers={"X-API-KEY": org.key}, params={"metadata": "batch=b"}
    )
    assert response.status_code == 200
    assert [s["sandboxID"] for s in response.json()] == [i for i in ids if i != ids[1]]
    # A token that is no token is named.
    response = httpx.get(
        f"{e2b_stack.edge}/v2/sandboxes", headers={"X-API-KEY": org.key}, params={"nextToken": "x"}
    )
    assert (response.status_code, response.json()["code"]) == (400, 400)
    assert "nextToken" in response.json()["message"]
    for sandbox in [*made, other]:
        sandbox.kill()


def test_timeout_moves_the_end_and_the_reaper_keeps_it(e2b_stack: Stack, standin: StandIn) -> None:
    org = new_org(e2b_stack, max_lifetime_s=3600)
    sandbox = Sandbox.create("base", timeout=60, **org.opts)
    sandbox.set_timeout(600)
    end = sandbox.get_info().end_at
    assert timedelta(seconds=590) < end - datetime.now(UTC) <= timedelta(seconds=600)
    # Never past the organization's longest lifetime.
    with pytest.raises(SandboxException, match="the organization's longest lifetime is 3600 s"):
        sandbox.set_timeout(7200)
    with pytest.raises(SandboxException, match="a lifetime may be at most 3600 s"):
        Sandbox.create("base", timeout=7200, **org.opts)

    # At its end the reaper kills it (its next sweep: every few seconds in a deployment).
    reaper = Reaper(e2b_stack.sessions, Cluster(settings_for(e2b_stack.url, standin)))
    object_name = record(e2b_stack, sandbox.sandbox_id).object_name
    reaper.sweep(utcnow() + timedelta(seconds=30))
    assert standin.get(object_name) is not None
    reaper.sweep(utcnow() + timedelta(seconds=601))
    assert standin.get(object_name) is None
    assert record(e2b_stack, sandbox.sandbox_id).phase in {SandboxPhase.TERMINATING, SandboxPhase.DELETED}
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info()


def test_pause_and_connect(e2b_stack: Stack, standin: StandIn) -> None:
    org = new_org(e2b_stack)
    sandbox = Sandbox.create("base", **org.opts)
    object_name = record(e2b_stack, sandbox.sandbox_id).object_name
    token = sandbox._envd_access_token

    # This deployment keeps no memory: asking for it is refused by name, the filesystem
    # pause works.
    with pytest.raises(SandboxException, match=r"memory cannot be kept \(memory capture is off"):
        sandbox.pause(mode="full")
    assert sandbox.pause() is True
    assert standin.get(object_name)["spec"]["stopped"] is True
    assert sandbox.get_info().state == SandboxState.PAUSED
    assert sandbox.pause() is False  # already paused

    again = Sandbox.connect(sandbox.sandbox_id, timeout=900, **org.opts)
    assert standin.get(object_name)["spec"]["stopped"] is False
    assert again.get_info().state == SandboxState.RUNNING
    assert again._envd_access_token == token  # one token for the sandbox's whole life
    assert again.get_info().end_at - datetime.now(UTC) > timedelta(seconds=890)
    # Connecting to a running sandbox changes nothing but a later end.
    Sandbox.connect(sandbox.sandbox_id, timeout=60, **org.opts)
    assert again.get_info().end_at - datetime.now(UTC) > timedelta(seconds=800)
    sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id, **org.opts)


def test_where_memory_is_kept_e2bs_pause_keeps_it_and_a_reboot_starts_cold(
    stack_url: str, standin: StandIn
) -> None:
    with serve_stack(stack_url, standin, templates=TEMPLATES, start_wait_s=0, memory_capture=True) as served:
        org = new_org(served)
        sandbox = Sandbox.create("base", **org.opts)
        object_name = record(served, sandbox.sandbox_id).object_name
        assert sandbox.pause() is True  # E2B's default: memory and filesystem
        spec = standin.get(object_name)["spec"]
        assert spec["stopped"] is True and spec["memoryCapture"] is True
        Sandbox.connect(sandbox.sandbox_id, **org.opts)  # on_resume "restore": from the memory
        assert standin.get(object_name)["spec"]["coldStart"] is False
        assert sandbox.pause(mode="filesystem") is True
        assert standin.get(object_name)["spec"]["memoryCapture"] is False
        Sandbox.connect(sandbox.sandbox_id, on_resume="reboot", **org.opts)
        assert standin.get(object_name)["spec"]["coldStart"] is True


def test_autopause_pauses_at_the_end_of_the_timeout_and_autoresume_wakes_on_use(
    stack_url: str, standin: StandIn
) -> None:
    with serve_stack(stack_url, standin, templates=TEMPLATES, start_wait_s=0, memory_capture=True) as served:
        org = new_org(served)
        reaper = Reaper(served.sessions, Cluster(settings_for(served.url, standin)))
        lifecycle = {"on_timeout": "pause", "auto_resume": True}
        sandbox = Sandbox.create("base", timeout=60, lifecycle=lifecycle, **org.opts)
        made = record(served, sandbox.sandbox_id)
        assert made.spec["on_end"] == "pause" and made.spec["auto_resume"] is True
        reaper.sweep(utcnow() + timedelta(seconds=61))
        paused = record(served, sandbox.sandbox_id)
        assert paused.phase is not SandboxPhase.TERMINATING and paused.spec["stopped"] is True
        assert paused.expires_at > utcnow() + timedelta(hours=1)  # now the hard lifetime
        spec = standin.get(paused.object_name)["spec"]
        assert spec["stopped"] is True and spec["memoryCapture"] is True
        assert sandbox.get_info().state == SandboxState.PAUSED
        # Used: resumed (no controller here: the call then says it is still resuming).
        with served.sessions.begin() as session:
            user = store.create_user(session, org.id, "warren")
            key = store.issue_api_key(session, org.id, user.id, ["sandbox:read", "sandbox:write"])
        with Client(served.edge, key.token) as warren, pytest.raises(WarrenError, match="still resuming"):
            warren.run("sbx_" + sandbox.sandbox_id, ["true"])
        assert standin.get(paused.object_name)["spec"]["stopped"] is False
        # At the hard lifetime it is deleted, paused or not.
        reaper.sweep(paused.expires_at + timedelta(seconds=1))
        assert record(served, sandbox.sandbox_id).phase in {SandboxPhase.TERMINATING, SandboxPhase.DELETED}
        # A filesystem auto-pause is a stop at the end of the timeout.
        filesystem = {"on_timeout": {"action": "pause", "mode": "filesystem"}}
        files = Sandbox.create("base", lifecycle=filesystem, **org.opts)
        assert record(served, files.sandbox_id).spec["on_end"] == "stop"


def test_a_sandbox_whose_agent_is_copied_in_pauses_its_files_only(stack_url: str, standin: StandIn) -> None:
    with serve_stack(
        stack_url,
        standin,
        templates=TEMPLATES,
        start_wait_s=0,
        memory_capture=True,
        capturable_images=frozenset({IMAGE}),  # base's, not small's
    ) as served:
        org = new_org(served)
        small = Sandbox.create("small", **org.opts)
        with pytest.raises(SandboxException, match="does not start the agent itself"):
            small.pause(mode="full")
        assert small.pause() is True  # left to the API: the files
        spec = standin.get(record(served, small.sandbox_id).object_name)["spec"]
        assert spec["stopped"] is True and spec["memoryCapture"] is False
        base = Sandbox.create("base", **org.opts)
        assert base.pause() is True
        assert standin.get(record(served, base.sandbox_id).object_name)["spec"]["memoryCapture"] is True


def test_fork_gives_one_result_per_child(e2b_stack: Stack, standin: StandIn) -> None:
    org = new_org(e2b_stack, quota_sandboxes=3)
    parent = Sandbox.create("base", metadata={"role": "parent"}, **org.opts)
    children = parent.fork(count=3, timeout=120)
    # The quota (three sandboxes) leaves room for two children; the third fails on its own.
    made = [c for c in children if isinstance(c, Sandbox)]
    failed = [c for c in children if isinstance(c, Exception)]
    assert (len(made), len(failed)) == (2, 1)
    assert isinstance(failed[0], RateLimitException)
    assert "quota" in str(failed[0])
    parent_workspace = record(e2b_stack, parent.sandbox_id).workspace_id
    for child in made:
        kept = record(e2b_stack, child.sandbox_id)
        assert kept.spec["workspace"]["fork_of"] == parent_workspace
        resource = standin.get(kept.object_name)
        assert resource is not None
        assert resource["spec"]["workspace"]["forkOf"] == parent_workspace
        assert child._envd_access_token not in {parent._envd_access_token, None}
        assert child.get_info().end_at - datetime.now(UTC) < timedelta(seconds=121)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork("a" * 26, **org.opts)
    for sandbox in [parent, *made]:
        sandbox.kill()


def test_another_organization_sees_and_touches_nothing(e2b_stack: Stack, standin: StandIn) -> None:
    owner, stranger = new_org(e2b_stack), new_org(e2b_stack)
    sandbox = Sandbox.create("base", metadata={"secret": "yes"}, **owner.opts)
    sid = sandbox.sandbox_id
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sid, **stranger.opts)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sid, **stranger.opts)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(sid, 30, **stranger.opts)
    with pytest.raises((SandboxNotFoundException, NotFoundException)):
        Sandbox.fork(sid, **stranger.opts)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(sid, **stranger.opts)
    assert Sandbox.kill(sid, **stranger.opts) is False
    assert Sandbox.list(query=SandboxQuery(metadata={"secret": "yes"}), **stranger.opts).next_items() == []
    # The owner's sandbox is untouched by all of that.
    assert sandbox.get_info().state == SandboxState.RUNNING
    assert standin.get(record(e2b_stack, sid).object_name) is not None
    sandbox.kill()


def test_a_key_that_is_not_a_key_is_refused(e2b_stack: Stack) -> None:
    wrong = "e2b_" + "0" * 64
    with pytest.raises(AuthenticationException):
        Sandbox.create("base", api_key=wrong, api_url=e2b_stack.edge)
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=wrong, api_url=e2b_stack.edge).next_items()


# --- sandbox traffic through the edge -----------------------------------------------------------


@pytest.fixture(scope="session")
def agent_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent (make agent builds it and names it in WARREN_AGENT_BIN; otherwise built here)."""
    given = os.environ.get("WARREN_AGENT_BIN")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("agent") / "agent"
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
    subprocess.run(["go", "build", "-trimpath", "-o", str(out), "."], cwd=AGENT_DIR, env=env, check=True)
    return out


@dataclass
class RunningPod:
    address: str
    process: subprocess.Popen[bytes]


def run_pod(stack: Stack, standin: StandIn, agent: Path, home: Path, sandbox_id: str) -> RunningPod:
    """What the controller and the node would make of the sandbox: its pod, Running, with the
    agent listening at the pod's address (a loopback one of its own) on the agent's port,
    with the sandbox's token and its environment."""
    kept = record(stack, sandbox_id)
    resource = standin.get(kept.object_name)
    assert resource is not None
    address = "127." + ".".join(str(b) for b in secrets.token_bytes(2)) + f".{2 + secrets.randbelow(250)}"
    token = keys.agent_token(STAMP_KEY, kept.id)
    assert hashlib.sha256(token.encode()).hexdigest() == resource["spec"]["agentTokenSha256"]
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "WARREN_AGENT_ACCESS_TOKEN": token}
    env.update(resource["spec"].get("env") or {})
    process = subprocess.Popen(
        [str(agent), "-listen", f"{address}:{AGENT_PORT}"], env=env, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"http://{address}:{AGENT_PORT}/health").status_code == 204:
                break
        except httpx.TransportError:
            pass
        assert process.poll() is None and time.monotonic() < deadline, "the agent did not start"
        time.sleep(0.05)
    name = pod_name(resource["metadata"]["uid"])
    standin.pods[(NAMESPACE, name)] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "status": {"phase": "Running", "podIP": address},
    }
    return RunningPod(address, process)


def test_commands_and_files_reach_the_agent_through_the_edge(
    e2b_stack: Stack, standin: StandIn, agent_binary: Path, tmp_path: Path
) -> None:
    org = new_org(e2b_stack)
    sandbox = Sandbox.create("base", envs={"GREETING": "hello from warren"}, **org.opts)
    pod = run_pod(e2b_stack, standin, agent_binary, tmp_path, sandbox.sandbox_id)
    try:
        result = sandbox.commands.run('echo "$GREETING"; echo oops >&2')
        assert (result.exit_code, result.stdout, result.stderr) == (0, "hello from warren\n", "oops\n")
        with pytest.raises(CommandExitException) as failed:
            sandbox.commands.run("exit 7")
        assert failed.value.exit_code == 7
        streamed: list[str] = []
        sandbox.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=streamed.append)
        assert "".join(streamed) == "1\n2\n3\n"

        sandbox.files.write(f"{tmp_path}/notes/a.txt", "written through the edge")
        assert sandbox.files.read(f"{tmp_path}/notes/a.txt") == "written through the edge"
        assert (tmp_path / "notes" / "a.txt").read_text() == "written through the edge"
        assert [e.name for e in sandbox.files.list(f"{tmp_path}/notes")] == ["a.txt"]
        assert sandbox.is_running()

        # By host name as well: {port}-{id}.{domain}, the form get_host gives.
        host = sandbox.get_host(AGENT_PORT)
        token = {"X-Access-Token": sandbox._envd_access_token or ""}
        by_host = httpx.get(f"{e2b_stack.edge}/health", headers={"Host": host, **token})
        assert by_host.status_code == 204

        # A port nothing listens on, and the SDK's words for it.
        closed = httpx.get(
            f"{e2b_stack.edge}/",
            headers={"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "9", **token},
        )
        assert closed.status_code == 502
        assert "port 9 is not open" in closed.json()["message"]
    finally:
        pod.process.terminate()
        pod.process.wait(timeout=10)

    # Killed: the SDK learns the sandbox is gone, in the words it looks for.
    sandbox.kill()
    with pytest.raises(SandboxNotRunningException, match="was not found"):
        sandbox.commands.run("true")


def off_by_one(token: str) -> str:
    """The token with its last character changed (always to a different one)."""
    return token[:-1] + ("1" if token[-1] == "0" else "0")


def test_sandbox_traffic_needs_that_sandbox_s_token(
    e2b_stack: Stack, standin: StandIn, agent_binary: Path, tmp_path: Path
) -> None:
    owner, stranger = new_org(e2b_stack), new_org(e2b_stack)
    sandbox = Sandbox.create("base", **owner.opts)
    other = Sandbox.create("base", **stranger.opts)
    pod = run_pod(e2b_stack, standin, agent_binary, tmp_path, sandbox.sandbox_id)
    try:
        route = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": str(AGENT_PORT)}
        url = f"{e2b_stack.edge}/filesystem.Filesystem/ListDir"
        body = {"path": str(tmp_path), "depth": 1}
        attempts = {
            "no token": {},
            "another sandbox's token": {"X-Access-Token": other._envd_access_token or ""},
            "an API key instead": {"X-API-KEY": owner.key},
            "a token one character off": {"X-Access-Token": off_by_one(sandbox._envd_access_token or "")},
        }
        for what, headers in attempts.items():
            answer = httpx.post(url, json=body, headers={**route, **headers})
            assert answer.status_code == 401, what
        # A sandbox id nobody has gets the same answer as a wrong token: nothing is learnt.
        nobody = httpx.post(url, json=body, headers={**route, "E2b-Sandbox-Id": "a" * 26})
        assert nobody.status_code == 401
        # Nor does the stranger's SDK reach it: its API finds no such sandbox to connect to.
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(sandbox.sandbox_id, **stranger.opts)
        # And the right token works.
        ok = httpx.post(url, json=body, headers={**route, "X-Access-Token": sandbox._envd_access_token or ""})
        assert ok.status_code == 200
    finally:
        pod.process.terminate()
        pod.process.wait(timeout=10)
    sandbox.kill()
    other.kill()


# --- create answers once the sandbox runs -------------------------------------------------------


def play_controller(standin: StandIn, status: dict[str, Any], after_s: float) -> threading.Event:
    """What the controller would write: `status` on every Sandbox created from now on, `after_s`
    after it appears. Set the returned event to stop."""
    stop = threading.Event()
    seen = {name for _, name in list(standin.objects)}

    def run() -> None:
        first_seen: dict[str, float] = {}
        while not stop.wait(0.05):
            for _, name in list(standin.objects):
                if name in seen:
                    continue
                first_seen.setdefault(name, time.monotonic())
                if time.monotonic() - first_seen[name] >= after_s:
                    obj = standin.get(name)
                    generation = (obj or {}).get("metadata", {}).get("generation", 1)
                    # Written for the generation it saw, as the controller writes it.
                    standin.set_status(name, {**status, "observedGeneration": generation})
                    seen.add(name)

    threading.Thread(target=run, daemon=True).start()
    return stop


def test_create_waits_until_the_sandbox_runs(stack_url: str, standin: StandIn) -> None:
    with serve_stack(stack_url, standin, templates=TEMPLATES, start_wait_s=30) as waiting:
        org = new_org(waiting)
        stop = play_controller(standin, {"phase": "Running"}, after_s=1.0)
        try:
            started = time.monotonic()
            sandbox = Sandbox.create("base", **org.opts)
            # It answered only once the controller had said Running: the SDK may use it at once.
            assert time.monotonic() - started >= 1.0
            assert record(waiting, sandbox.sandbox_id).phase is SandboxPhase.RUNNING
            # Fork children wait the same way.
            (child,) = sandbox.fork(count=1)
            assert isinstance(child, Sandbox)
            assert record(waiting, child.sandbox_id).phase is SandboxPhase.RUNNING
        finally:
            stop.set()
        # A resume waits for the controller's status of the resumed spec: "Running" written for
        # the spec before the pause does not count.
        name = record(waiting, sandbox.sandbox_id).object_name
        sandbox.pause()
        # The paused sandbox's pod is still going (the resource reads Terminating) when the
        # connect comes: that is a sandbox coming back, not one being killed.
        standin.set_status(name, {"phase": "Terminating", "observedGeneration": 0})
        assert Sandbox.get_info(sandbox.sandbox_id, **org.opts).state == SandboxState.PAUSED

        paused = (standin.get(name) or {})["metadata"]["generation"]

        def controller_sees_the_resume() -> None:
            # The controller answers the resumed spec, so only once the connect has written it
            # (on a busy machine that can take longer than the second below).
            deadline = time.monotonic() + 30
            while (standin.get(name) or {})["metadata"][
                "generation"
            ] == paused and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
            generation = (standin.get(name) or {})["metadata"]["generation"]
            standin.set_status(name, {"phase": "Running", "observedGeneration": generation})

        threading.Thread(target=controller_sees_the_resume, daemon=True).start()
        started = time.monotonic()
        Sandbox.connect(sandbox.sandbox_id, **org.opts)
        assert time.monotonic() - started >= 1.0
        sandbox.kill()
        child.kill()


def test_a_sandbox_that_cannot_start_says_why_at_once(stack_url: str, standin: StandIn) -> None:
    never = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "ErrImageNeverPull",
                "message": "image not on the node",
            }
        ],
    }
    with serve_stack(stack_url, standin, templates=TEMPLATES, start_wait_s=30) as waiting:
        org = new_org(waiting)
        stop = play_controller(standin, never, after_s=0.2)
        try:
            started = time.monotonic()
            with pytest.raises(
                SandboxException, match="cannot start: ErrImageNeverPull: image not on the node"
            ):
                Sandbox.create("base", **org.opts)
            assert time.monotonic() - started < 20
        finally:
            stop.set()


def test_a_sandbox_still_starting_after_the_wait_is_a_504_naming_it(stack_url: str, standin: StandIn) -> None:
    with serve_stack(stack_url, standin, templates=TEMPLATES, start_wait_s=1) as waiting:
        org = new_org(waiting)
        with pytest.raises(SandboxException, match=r"is not running after 1 s \(Pending: starting\)"):
            Sandbox.create("base", **org.opts)
        # It keeps starting: it is there, running as far as E2B's states go, until its timeout.
        (listed,) = Sandbox.list(**org.opts).next_items()
        Sandbox.kill(listed.sandbox_id, **org.opts)


def test_a_create_its_pooled_template_describes_names_the_pool(stack_url: str, standin: StandIn) -> None:
    """With `--pool base`, a create from base (E2B's templateID, or Warren's API with base's
    image and size) names the pool in its Sandbox resource, so the controller claims one of
    the pool's pods if one fits; any other size names none and starts cold."""
    with serve_stack(
        stack_url, standin, templates=TEMPLATES, pools=frozenset({"base"}), start_wait_s=0
    ) as pooled:
        org = new_org(pooled)
        from_base = Sandbox.create("base", **org.opts)
        from_small = Sandbox.create("small", **org.opts)
        spec = {"image": IMAGE, "cpu_millis": 1000, "memory_mib": 1024}
        headers = {"X-API-Key": org.key}
        made = [
            httpx.post(f"{pooled.edge}/v1/sandboxes", json=body, headers=headers)
            for body in (spec, {**spec, "memory_mib": 512}, {**spec, "command": ["sleep", "1"]})
        ]
        assert [answer.status_code for answer in made] == [201, 201, 201], [a.text for a in made]
        pools = [
            standin.get(record(pooled, sandbox_id.removeprefix("sbx_")).object_name)["spec"].get("pool")
            for sandbox_id in (
                "sbx_" + from_base.sandbox_id,
                "sbx_" + from_small.sandbox_id,
                *(answer.json()["id"] for answer in made),
            )
        ]
        assert pools == ["base", None, "base", None, "base"]


def test_a_pooled_create_leaves_its_workspace_to_be_bound_and_a_fork_waits_for_it(
    stack_url: str, standin: StandIn
) -> None:
    """A pooled template's new, empty workspace is the controller's to bind (to the claimed
    pool pod's workspace, or a new one): the resource asks for it with an empty id, the
    record learns it from the resource, and a fork made before that waits for it."""
    with serve_stack(
        stack_url, standin, templates=TEMPLATES, pools=frozenset({"base"}), start_wait_s=0
    ) as pooled:
        org = new_org(pooled)
        headers = {"X-API-Key": org.key}
        body = {"image": IMAGE, "cpu_millis": 1000, "memory_mib": 1024}
        made = httpx.post(f"{pooled.edge}/v1/sandboxes", json=body, headers=headers)
        assert made.status_code == 201, made.text
        parent = made.json()
        assert parent["workspace_id"] is None
        name = record(pooled, parent["id"].removeprefix("sbx_")).object_name
        assert standin.get(name)["spec"]["workspace"] == {"id": "", "size": "10Gi"}

        def bind() -> None:  # what the controller does once it claims or starts a pod
            time.sleep(0.5)
            with standin.lock:
                standin.objects[(NAMESPACE, name)]["spec"]["workspace"]["id"] = "ws_bound"

        binder = threading.Thread(target=bind)
        binder.start()
        forked = httpx.post(
            f"{pooled.edge}/v1/sandboxes/{parent['id']}/fork", json={"count": 1}, headers=headers, timeout=60
        )
        binder.join()
        assert forked.status_code == 200, forked.text
        (child,) = forked.json()["results"]
        child_name = record(pooled, child["sandbox"]["id"].removeprefix("sbx_")).object_name
        # A fork's workspace is not the pool's to bind: its id is chosen with it.
        child_workspace = standin.get(child_name)["spec"]["workspace"]
        assert child_workspace["forkOf"] == "ws_bound"
        assert child_workspace["id"] == child["sandbox"]["workspace_id"] != ""
        seen = httpx.get(f"{pooled.edge}/v1/sandboxes/{parent['id']}", headers=headers).json()
        assert seen["workspace_id"] == "ws_bound"


def test_an_organization_at_its_pool_cap_starts_cold_and_its_sandbox_says_why(
    stack_url: str, standin: StandIn
) -> None:
    with serve_stack(
        stack_url, standin, templates=TEMPLATES, pools=frozenset({"base"}), start_wait_s=0
    ) as pooled:
        org = new_org(pooled)
        with pooled.sessions.begin() as session:
            admin.set_pool_cap(session, org.id, 1)
        headers = {"X-API-Key": org.key}
        body = {"image": IMAGE, "cpu_millis": 1000, "memory_mib": 1024}
        first, second = (
            httpx.post(f"{pooled.edge}/v1/sandboxes", json=body, headers=headers) for _ in range(2)
        )
        assert (first.status_code, second.status_code) == (201, 201), second.text
        objects = [
            standin.get(record(pooled, made.json()["id"].removeprefix("sbx_")).object_name)
            for made in (first, second)
        ]
        assert objects[0]["spec"]["pool"] == "base"
        assert "pool" not in objects[1]["spec"]
        said = objects[1]["metadata"]["annotations"][POOL_SKIPPED_ANNOTATION]
        assert said == "the organization holds 1 sandboxes from warm pools, its cap of 1"
        # Its workspace is not the pool's to bind: chosen with the record.
        assert objects[1]["spec"]["workspace"]["id"] == second.json()["workspace_id"] != ""
        # Another organization is not held to it.
        other = new_org(pooled)
        third = httpx.post(f"{pooled.edge}/v1/sandboxes", json=body, headers={"X-API-Key": other.key})
        assert (
            standin.get(record(pooled, third.json()["id"].removeprefix("sbx_")).object_name)["spec"]["pool"]
            == "base"
        )


def test_a_fork_of_a_template_with_a_fork_pool_names_it_in_each_child_within_the_cap(
    stack_url: str, standin: StandIn
) -> None:
    """With `--fork-pool base`, the children of a fork of base's sandbox name the pool
    base-forks (whose pods take their workspace at the claim), each with its own workspace
    id and its parent's as forkOf; they count against the organization's cap of sandboxes
    from warm pools, and a child past it names no pool and says why."""
    with serve_stack(
        stack_url,
        standin,
        templates=TEMPLATES,
        pools=frozenset({"base"}),
        fork_pools=frozenset({"base"}),
        start_wait_s=0,
    ) as pooled:
        org = new_org(pooled)
        with pooled.sessions.begin() as session:
            admin.set_pool_cap(session, org.id, 2)
        headers = {"X-API-Key": org.key}
        body = {"image": IMAGE, "cpu_millis": 1000, "memory_mib": 512}  # not base's size: cold
        made = httpx.post(f"{pooled.edge}/v1/sandboxes", json=body, headers=headers)
        other = made.json()
        forked = httpx.post(
            f"{pooled.edge}/v1/sandboxes/{other['id']}/fork", json={"count": 1}, headers=headers
        )
        (child,) = forked.json()["results"]
        assert "pool" not in standin.get(record(pooled, child["sandbox"]["id"][4:]).object_name)["spec"]

        body["memory_mib"] = 1024  # base's
        made = httpx.post(
            f"{pooled.edge}/v1/sandboxes", json={**body, "workspace": {"size_gib": 10}}, headers=headers
        )
        assert made.status_code == 201, made.text
        parent = made.json()
        name = record(pooled, parent["id"].removeprefix("sbx_")).object_name
        with standin.lock:  # what the controller does once it claims or starts the parent's pod
            standin.objects[(NAMESPACE, name)]["spec"]["workspace"]["id"] = "ws_parent"
        forked = httpx.post(
            f"{pooled.edge}/v1/sandboxes/{parent['id']}/fork", json={"count": 2}, headers=headers, timeout=60
        )
        assert forked.status_code == 200, forked.text
        objects = [
            standin.get(record(pooled, result["sandbox"]["id"][4:]).object_name)
            for result in forked.json()["results"]
        ]
        specs = [obj["spec"] for obj in objects]
        # The parent holds one of the two pooled places: one child claims, one starts cold.
        assert [spec.get("pool") for spec in specs] == ["base-forks", None]
        said = objects[1]["metadata"]["annotations"][POOL_SKIPPED_ANNOTATION]
        assert said == "the organization holds 2 sandboxes from warm pools, its cap of 2"
        for spec, result in zip(specs, forked.json()["results"], strict=True):
            assert spec["workspace"]["forkOf"] == "ws_parent"
            assert spec["workspace"]["id"] == result["sandbox"]["workspace_id"]


def test_an_e2b_fork_of_a_running_sandbox_keeps_its_memory(stack_url: str, standin: StandIn) -> None:
    """E2B's fork keeps memory: the sandbox is paused with it until its image is a restore
    point, each child's resource names that image, and the sandbox is resumed (its id kept).
    A retry under the same Idempotency-Key replays the answer without pausing it again."""
    image = "ef" * 32
    with serve_stack(stack_url, standin, templates=TEMPLATES, start_wait_s=30, memory_capture=True) as served:
        org = new_org(served)
        stop = play_controller(standin, {"phase": "Running"}, after_s=0.1)
        try:
            sandbox = Sandbox.create("base", **org.opts)
            name = record(served, sandbox.sandbox_id).object_name
            parent = record(served, sandbox.sandbox_id)
            memory = {
                "image": image,
                "workspace": parent.workspace_id,
                "sealedSeq": 4,
                "node": "node-a",
                "verifiedAt": "x",
                "verification": {"workspace": "ws-v", "done": True, "ms": 900},
            }

            def controller() -> None:
                # The controller's part for the parent: a proved image whenever it is paused
                # with its memory, Running whenever it is started again.
                answered = 0
                while not stop.wait(0.05):
                    obj = standin.get(name) or {}
                    spec, generation = obj["spec"], obj["metadata"]["generation"]
                    if generation == answered:
                        continue
                    if spec.get("stopped") and spec.get("memoryCapture"):
                        status = {"phase": "Stopped", "observedGeneration": generation, "memoryImage": memory}
                    else:
                        status = {"phase": "Running", "observedGeneration": generation}
                    standin.set_status(name, status)
                    answered = generation

            threading.Thread(target=controller, daemon=True).start()
            children = sandbox.fork(count=2)
            assert all(isinstance(child, Sandbox) for child in children)
            for child in children:
                spec = (standin.get(record(served, child.sandbox_id).object_name) or {})["spec"]
                assert (
                    spec["memoryFrom"]["image"] == image
                    and spec["workspace"]["forkOf"] == parent.workspace_id
                )
            spec = (standin.get(name) or {})["spec"]
            assert spec["stopped"] is False and spec["memoryCapture"] is True  # resumed from its image
            assert record(served, sandbox.sandbox_id).phase is SandboxPhase.RUNNING

            url = f"{served.edge}/sandboxes/{sandbox.sandbox_id}/fork"
            headers = {"X-API-Key": org.key, "Idempotency-Key": "fork-once"}
            first = httpx.post(url, json={"count": 1}, headers=headers, timeout=60)
            assert first.status_code == 201, first.text
            generation = (standin.get(name) or {})["metadata"]["generation"]
            again = httpx.post(url, json={"count": 1}, headers=headers, timeout=60)
            assert again.status_code == 201 and again.json() == first.json()
            assert (standin.get(name) or {})["metadata"]["generation"] == generation  # not paused again
        finally:
            stop.set()
