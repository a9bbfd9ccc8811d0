"""The agent driven by the real E2B SDK (e2b, pinned in requirements.txt).

The SDK's own Commands and Filesystem modules (its generated Connect clients for
process.Process and filesystem.Filesystem, its /files upload and download code)
are pointed at an agent started on a free loopback port with an access token, as
the user running the tests, with HOME in a temporary directory. Every test asserts
what the agent did on disk or what it answered, so a wrong wire detail fails here.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b.api.client_sync import get_envd_api
from e2b.connection_config import ConnectionConfig
from e2b.envd.client_sync import create_rpc_client
from e2b.envd.filesystem import filesystem_connect, filesystem_pb
from e2b.exceptions import AuthenticationException, NotFoundException
from e2b.sandbox.commands.command_handle import CommandExitException, PtySize
from e2b.sandbox.filesystem.filesystem import FileType
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType
from e2b.sandbox_sync.commands.command import Commands
from e2b.sandbox_sync.commands.pty import Pty
from e2b.sandbox_sync.filesystem.filesystem import Filesystem
from packaging.version import Version

AGENT_DIR = Path(__file__).resolve().parent.parent
# The envd version the SDK is told it talks to: recent enough that it sends no
# default user and uses every upload path the agent serves.
ENVD_VERSION = Version("0.6.4")


@dataclass
class Agent:
    url: str
    token: str
    home: Path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def agent_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent built for this run, or the one WARREN_AGENT_BIN names (make agent builds it)."""
    given = os.environ.get("WARREN_AGENT_BIN")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("bin") / "agent"
    env = {**os.environ, "CGO_ENABLED": "0"}
    subprocess.run(["go", "build", "-trimpath", "-o", str(out), "."], cwd=AGENT_DIR, env=env, check=True)
    return out


@contextlib.contextmanager
def _running(binary: Path, home: Path, args: list[str], env: dict[str, str]) -> Iterator[str]:
    """The agent on a free loopback port, with HOME at `home`, until the block ends; its URL."""
    port = _free_port()
    log = (home.parent / f"agent-{port}.log").open("w")
    proc = subprocess.Popen(
        [str(binary), "-listen", f"127.0.0.1:{port}", *args],
        env={**os.environ, "HOME": str(home), **env},
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(f"{url}/health").status_code == 204:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the agent did not answer /health; its log is {log.name}")
        time.sleep(0.05)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture(scope="session")
def agent(agent_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    home = tmp_path_factory.mktemp("home")
    token = secrets.token_hex(16)
    with _running(agent_binary, home, [], {"WARREN_AGENT_ACCESS_TOKEN": token}) as url:
        yield Agent(url=url, token=token, home=home)


def _config(token: str | None, http_version: str = "1.1") -> ConnectionConfig:
    headers = {"X-Access-Token": token} if token is not None else {}
    return ConnectionConfig(
        api_key="e2b_unused", extra_sandbox_headers=headers, http_version=http_version, retries=0
    )


def _modules(agent: Agent, token: str | None, http_version: str = "1.1") -> tuple[Commands, Filesystem]:
    config = _config(token, http_version)
    envd_api = get_envd_api(config, agent.url)
    commands = Commands(agent.url, config, ENVD_VERSION, envd_api)
    files = Filesystem(agent.url, ENVD_VERSION, config, envd_api)
    return commands, files


@pytest.fixture
def commands(agent: Agent) -> Commands:
    return _modules(agent, agent.token)[0]


@pytest.fixture
def files(agent: Agent) -> Filesystem:
    return _modules(agent, agent.token)[1]


@pytest.fixture
def workdir(agent: Agent, request: pytest.FixtureRequest) -> Path:
    path = agent.home / request.node.name
    path.mkdir()
    return path


# Commands


def test_run_returns_stdout_stderr_and_exit_code(commands: Commands) -> None:
    result = commands.run("echo out; echo err >&2; exit 0")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)

    with pytest.raises(CommandExitException) as failed:
        commands.run("echo before; echo oops >&2; exit 7")
    assert failed.value.exit_code == 7
    assert failed.value.stdout == "before\n"
    assert failed.value.stderr == "oops\n"


def test_envs_and_cwd(commands: Commands, workdir: Path) -> None:
    result = commands.run(
        'printf "%s|%s" "$GREETING" "$(pwd)"', envs={"GREETING": "hi there"}, cwd=str(workdir)
    )
    assert result.stdout == f"hi there|{workdir}"


def test_the_access_token_is_not_in_the_commands_environment(commands: Commands) -> None:
    result = commands.run('echo "${WARREN_AGENT_ACCESS_TOKEN:-unset}"')
    assert result.stdout == "unset\n"


def test_commands_and_files_as_another_user(agent: Agent, workdir: Path) -> None:
    if os.geteuid() != 0:
        # CI runs as root on purpose: there the missing privilege fails instead of skipping.
        reason = "acting as another user needs the agent to run as root: run the tests as root"
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    commands, files = _modules(agent, agent.token)
    result = commands.run("id -un; pwd", user="nobody")
    assert result.stdout == "nobody\n/\n"  # nobody has no home directory: the root instead
    workdir.chmod(0o777)
    target = workdir / "owned" / "by-nobody.txt"
    files.write(str(target), "mine", user="nobody")
    assert target.stat().st_uid == pwd.getpwnam("nobody").pw_uid
    assert target.parent.stat().st_uid == pwd.getpwnam("nobody").pw_uid
    with pytest.raises(Exception, match="does not exist"):
        commands.run("true", user="no-such-user-here")


def test_cwd_that_does_not_exist_is_refused(commands: Commands, workdir: Path) -> None:
    with pytest.raises(Exception, match="not a directory"):
        commands.run("true", cwd=str(workdir / "missing"))


def test_both_http_versions(agent: Agent) -> None:
    for version in ("1.1", "2"):
        commands, files = _modules(agent, agent.token, version)
        assert commands.run("echo $((6 * 7))").stdout == "42\n"
        assert files.exists(str(agent.home))


def test_background_process_is_listed_then_killed(commands: Commands) -> None:
    handle = commands.run("sleep 300", background=True)
    listed = {p.pid: p for p in commands.list()}
    assert handle.pid in listed
    assert listed[handle.pid].cmd == "/bin/bash"
    assert listed[handle.pid].args[-1] == "sleep 300"

    assert commands.kill(handle.pid)
    # Off the list as soon as the kill is answered, before anyone waits for it.
    assert handle.pid not in {p.pid for p in commands.list()}
    with pytest.raises(CommandExitException) as killed:
        handle.wait()
    assert killed.value.exit_code == -1
    assert killed.value.error == "signal: killed"
    assert handle.pid not in {p.pid for p in commands.list()}
    assert commands.kill(handle.pid) is False  # not found: the SDK's NOT_FOUND branch


def test_connect_to_a_running_process(commands: Commands) -> None:
    handle = commands.run("read line; echo got $line", background=True, stdin=True)
    attached = commands.connect(handle.pid)
    commands.send_stdin(handle.pid, "hello\n")
    assert attached.wait().stdout == "got hello\n"
    assert handle.wait().stdout == "got hello\n"


def test_stdin_then_close(commands: Commands) -> None:
    handle = commands.run("cat; echo done", background=True, stdin=True)
    commands.send_stdin(handle.pid, "line one\n")
    commands.send_stdin(handle.pid, "line two\n")
    commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "line one\nline two\ndone\n"


def test_stream_input(commands: Commands) -> None:
    handle = commands.run("cat", background=True, stdin=True)
    commands.stream_input(handle.pid, iter(["chunk one, ", b"chunk two\n"]))
    commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "chunk one, chunk two\n"


def test_stdin_to_a_missing_process_is_not_found(commands: Commands) -> None:
    with pytest.raises(NotFoundException):
        commands.send_stdin(2**31 - 1, "x")


def test_large_output_arrives_whole(commands: Commands) -> None:
    size = 5 * 1024 * 1024
    result = commands.run(f"head -c {size} /dev/zero | tr '\\0' 'x'; echo; seq 1 20000 >&2")
    assert len(result.stdout) == size + 1
    assert set(result.stdout.strip()) == {"x"}
    assert result.stderr.splitlines()[-1] == "20000"


def test_pty_runs_an_interactive_shell_and_resizes(agent: Agent) -> None:
    config = _config(agent.token)
    pty = Pty(agent.url, config, ENVD_VERSION, get_envd_api(config, agent.url))
    handle = pty.create(PtySize(rows=24, cols=80))
    pty.send_stdin(handle.pid, b"stty size; tty\n")
    output = bytearray()
    resized = False
    for _, _, chunk in handle:
        output.extend(chunk or b"")
        if not resized and b"24 80" in output:  # the shell has answered at the first size
            pty.resize(handle.pid, PtySize(rows=40, cols=100))
            pty.send_stdin(handle.pid, b"stty size; exit 3\n")
            resized = True
    with pytest.raises(CommandExitException) as exited:
        handle.wait()
    assert exited.value.exit_code == 3
    text = output.decode()
    assert "40 100" in text.split("24 80", 1)[1]
    assert "/dev/pts/" in text


# Files


def test_write_and_read_text(files: Filesystem, workdir: Path) -> None:
    target = workdir / "nested" / "hello.txt"
    info = files.write(str(target), "héllo\nworld\n")
    assert info.path == str(target)
    assert info.name == "hello.txt"
    assert info.type == FileType.FILE
    assert target.read_text() == "héllo\nworld\n"
    assert files.read(str(target)) == "héllo\nworld\n"


def test_write_and_read_binary(files: Filesystem, workdir: Path) -> None:
    blob = bytes(range(256)) * 4096
    target = workdir / "blob.bin"
    files.write(str(target), blob)
    assert target.read_bytes() == blob
    assert bytes(files.read(str(target), format="bytes")) == blob


def test_write_octet_stream_and_gzip(files: Filesystem, workdir: Path) -> None:
    files.write(str(workdir / "plain.bin"), b"\x00\x01streamed", use_octet_stream=True)
    assert (workdir / "plain.bin").read_bytes() == b"\x00\x01streamed"
    files.write(str(workdir / "zipped.txt"), "compressed " * 1000, gzip=True)
    assert (workdir / "zipped.txt").read_text() == "compressed " * 1000


@pytest.mark.parametrize("octet_stream", [False, True])
def test_file_metadata(files: Filesystem, workdir: Path, octet_stream: bool) -> None:
    target = workdir / "tagged.txt"
    metadata = {"owner": "alice", "stage": "draft"}
    info = files.write(str(target), "x", metadata=metadata, use_octet_stream=octet_stream)
    assert info.metadata == metadata
    assert os.getxattr(target, "user.e2b.owner") == b"alice"
    assert files.get_info(str(target)).metadata == metadata
    assert [e.metadata for e in files.list(str(workdir))] == [metadata]
    (workdir / "plain.txt").write_text("y")
    assert files.get_info(str(workdir / "plain.txt")).metadata is None


def test_write_several_files_in_one_upload(files: Filesystem, workdir: Path) -> None:
    written = files.write_files(
        [
            {"path": str(workdir / "a.txt"), "data": "A"},
            {"path": str(workdir / "sub" / "b.txt"), "data": b"B"},
        ]
    )
    assert sorted(w.path for w in written) == [str(workdir / "a.txt"), str(workdir / "sub" / "b.txt")]
    assert (workdir / "a.txt").read_text() == "A"
    assert (workdir / "sub" / "b.txt").read_text() == "B"


def test_relative_paths_are_under_home(agent: Agent, files: Filesystem) -> None:
    files.write("relative.txt", "at home")
    assert (agent.home / "relative.txt").read_text() == "at home"


def test_read_missing_file_is_not_found(files: Filesystem, workdir: Path) -> None:
    with pytest.raises(NotFoundException):
        files.read(str(workdir / "missing.txt"))


def test_list_with_depth(files: Filesystem, workdir: Path) -> None:
    (workdir / "a" / "b").mkdir(parents=True)
    (workdir / "top.txt").write_text("1")
    (workdir / "a" / "mid.txt").write_text("22")
    (workdir / "a" / "b" / "deep.txt").write_text("333")

    shallow = {e.name: e for e in files.list(str(workdir))}
    assert set(shallow) == {"a", "top.txt"}
    assert shallow["a"].type == FileType.DIR
    assert shallow["top.txt"].type == FileType.FILE
    assert shallow["top.txt"].size == 1

    deep = {e.path for e in files.list(str(workdir), depth=3)}
    assert str(workdir / "a" / "b" / "deep.txt") in deep
    assert str(workdir / "a" / "mid.txt") in deep


def test_stat(files: Filesystem, workdir: Path) -> None:
    target = workdir / "f.txt"
    target.write_text("12345")
    target.chmod(0o640)
    info = files.get_info(str(target))
    assert info.name == "f.txt"
    assert info.path == str(target)
    assert info.type == FileType.FILE
    assert info.size == 5
    assert info.mode == 0o640
    assert info.permissions == "-rw-r-----"
    assert abs(info.modified_time.timestamp() - target.stat().st_mtime) < 1

    link = workdir / "link"
    link.symlink_to(target)
    linked = files.get_info(str(link))
    assert linked.symlink_target == str(target)
    assert linked.type == FileType.SYMLINK  # the SDK's reading of isSymlink
    assert linked.size == 5  # the target's

    with pytest.raises(NotFoundException):
        files.get_info(str(workdir / "missing"))


def test_make_dir(files: Filesystem, workdir: Path) -> None:
    target = workdir / "x" / "y"
    assert files.make_dir(str(target)) is True
    assert target.is_dir()
    assert files.make_dir(str(target)) is False  # already there
    assert files.exists(str(target))
    assert not files.exists(str(workdir / "nope"))


def test_rename(files: Filesystem, workdir: Path) -> None:
    (workdir / "old.txt").write_text("moved")
    info = files.rename(str(workdir / "old.txt"), str(workdir / "new" / "new.txt"))
    assert info.path == str(workdir / "new" / "new.txt")
    assert not (workdir / "old.txt").exists()
    assert (workdir / "new" / "new.txt").read_text() == "moved"
    with pytest.raises(NotFoundException):
        files.rename(str(workdir / "old.txt"), str(workdir / "again.txt"))


def test_remove(files: Filesystem, workdir: Path) -> None:
    (workdir / "tree" / "leaf").mkdir(parents=True)
    (workdir / "tree" / "leaf" / "f").write_text("x")
    (workdir / "single.txt").write_text("x")
    files.remove(str(workdir / "tree"))
    files.remove(str(workdir / "single.txt"))
    assert not (workdir / "tree").exists()
    assert not (workdir / "single.txt").exists()


def test_watch_dir_polled(files: Filesystem, workdir: Path) -> None:
    handle = files.watch_dir(str(workdir), recursive=True, include_entry=True)
    try:
        (workdir / "sub").mkdir()
        (workdir / "sub" / "inner.txt").write_text("x")  # inside a directory made after the watch began
        (workdir / "top.txt").write_text("y")
        (workdir / "top.txt").unlink()
        seen: list[tuple[str, FilesystemEventType]] = []
        deadline = time.monotonic() + 10
        while ("top.txt", FilesystemEventType.REMOVE) not in seen and time.monotonic() < deadline:
            seen += [(e.name, e.type) for e in handle.get_new_events()]
            time.sleep(0.05)
    finally:
        handle.stop()
    assert ("sub", FilesystemEventType.CREATE) in seen
    # made before its new directory's watch began, or after: reported as created either way
    assert ("sub/inner.txt", FilesystemEventType.CREATE) in seen
    assert ("top.txt", FilesystemEventType.CREATE) in seen
    assert ("top.txt", FilesystemEventType.WRITE) in seen
    assert ("top.txt", FilesystemEventType.REMOVE) in seen
    with pytest.raises(Exception, match="not found"):
        handle._rpc.remove_watcher(filesystem_pb.RemoveWatcherRequest(watcher_id=handle._watcher_id))


def test_watch_dir_streamed(agent: Agent, workdir: Path) -> None:
    """WatchDir, the streaming call the async SDK uses, through the SDK's generated client."""
    rpc = create_rpc_client(filesystem_connect.FilesystemClientSync, agent.url, _config(agent.token))
    stream = rpc.watch_dir(filesystem_pb.WatchDirRequest(path=str(workdir), include_entry=True))
    try:
        first = next(stream)
        assert first.event is not None
        assert first.event.field == "start"
        (workdir / "new.txt").write_text("hello")
        event = next(stream)
        assert event.event is not None
        assert event.event.field == "filesystem"
        assert event.event.value.name == "new.txt"
        assert event.event.value.type == filesystem_pb.EventType.CREATE
        assert event.event.value.entry.path == str(workdir / "new.txt")
    finally:
        stream.close()


# The access token


@pytest.mark.parametrize("token", [None, "wrong-token"])
def test_calls_without_the_token_are_refused(agent: Agent, token: str | None, workdir: Path) -> None:
    commands, files = _modules(agent, token)
    (workdir / "secret.txt").write_text("s")
    with pytest.raises(AuthenticationException):
        commands.run("touch should-not-exist")
    with pytest.raises(AuthenticationException):
        commands.list()
    with pytest.raises(AuthenticationException):
        files.list(str(workdir))
    with pytest.raises(AuthenticationException):
        files.read(str(workdir / "secret.txt"))
    with pytest.raises(AuthenticationException):
        files.write(str(workdir / "planted.txt"), "x")
    assert not (agent.home / "should-not-exist").exists()
    assert not (workdir / "planted.txt").exists()
    # /health stays open: it is how a caller learns the agent is up.
    assert httpx.get(f"{agent.url}/health").status_code == 204


# A pool pod's agent


def test_a_pool_agent_serves_the_sdk_only_once_claimed(agent_binary: Path, tmp_path: Path) -> None:
    claim_token, token = secrets.token_hex(16), secrets.token_hex(16)
    claim_sha256 = hashlib.sha256(claim_token.encode()).hexdigest()
    with _running(agent_binary, tmp_path, ["-claim-token-sha256", claim_sha256], {}) as url:
        pool_agent = Agent(url=url, token=token, home=tmp_path)
        commands, _ = _modules(pool_agent, token)
        with pytest.raises(AuthenticationException):
            commands.run("true")
        body = {
            "accessTokenSha256": hashlib.sha256(token.encode()).hexdigest(),
            "envVars": {"CLAIMED_BY": "sandbox-a"},
        }
        assert httpx.post(f"{url}/claim", json=body, headers={"X-Claim-Token": token}).status_code == 401
        assert (
            httpx.post(f"{url}/claim", json=body, headers={"X-Claim-Token": claim_token}).status_code == 204
        )
        result = commands.run("echo $CLAIMED_BY")
        assert result.stdout.strip() == "sandbox-a"
        # The pod serves one sandbox: no second claim, and no other token.
        other = {**body, "accessTokenSha256": hashlib.sha256(b"other").hexdigest()}
        assert (
            httpx.post(f"{url}/claim", json=other, headers={"X-Claim-Token": claim_token}).status_code == 409
        )
        with pytest.raises(AuthenticationException):
            _modules(pool_agent, "other")[0].run("true")


def test_a_holding_agent_serves_nothing_and_ends_on_sigterm(agent_binary: Path) -> None:
    """-hold: a warm pool pod's placeholder process until its claim starts the sandbox's own
    container (which runs the serving agent on the same port)."""
    port = _free_port()
    proc = subprocess.Popen([str(agent_binary), "-hold", "-listen", f"127.0.0.1:{port}"])
    try:
        time.sleep(0.5)
        assert proc.poll() is None
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
