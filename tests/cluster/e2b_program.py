"""A program written for E2B and nothing else: the official SDK, configured only by E2B_API_KEY,
E2B_API_URL and E2B_SANDBOX_URL. The cluster tier runs it against the deployed platform
(test_e2b.py) and checks the report it prints as its last line (JSON): each step either
passed or names what it got instead.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from e2b import CommandExitException, FileType, Sandbox, SandboxQuery, SandboxState

report: dict[str, Any] = {}


def step(name: str, check: Callable[[], Any]) -> None:
    try:
        report[name] = check()
    except Exception as exc:  # the report names every failure
        report[name] = f"FAILED: {type(exc).__name__}: {exc}"


def command_steps(sandbox: Sandbox) -> None:
    commands = sandbox.commands

    def outputs() -> Any:
        done = commands.run('echo "$GREETING"; echo to-stderr >&2; whoami; pwd')
        return [done.exit_code, done.stdout, done.stderr]

    def exit_code() -> Any:
        try:
            commands.run("exit 3")
        except CommandExitException as exc:
            return exc.exit_code
        return "no exception"

    def envs_and_cwd() -> Any:
        done = commands.run("echo $ONE; pwd", envs={"ONE": "1"}, cwd="/tmp")
        return done.stdout

    def streaming() -> Any:
        seen: list[str] = []
        commands.run("for i in 1 2 3; do echo $i; sleep 0.2; done", on_stdout=seen.append)
        return "".join(seen)

    def large_output() -> Any:
        done = commands.run("head -c 3000000 /dev/zero | tr '\\0' x")
        return len(done.stdout)

    def background_and_kill() -> Any:
        handle = commands.run("sleep 600", background=True)
        listed = [p.pid for p in commands.list()]
        killed = commands.kill(handle.pid)
        return [handle.pid in listed, killed, handle.pid in [p.pid for p in commands.list()]]

    def stdin() -> Any:
        handle = commands.run("cat", background=True, stdin=True)
        commands.send_stdin(handle.pid, "typed in\n")
        commands.close_stdin(handle.pid)
        return handle.wait().stdout

    step("outputs", outputs)
    step("exit_code", exit_code)
    step("envs_and_cwd", envs_and_cwd)
    step("streaming", streaming)
    step("large_output", large_output)
    step("background_and_kill", background_and_kill)
    step("stdin", stdin)


def file_steps(sandbox: Sandbox) -> None:
    files = sandbox.files

    def text_and_binary() -> Any:
        files.write("/home/user/notes/a.txt", "hello")
        files.write("/home/user/blob.bin", bytes(range(256)))
        blob = files.read("/home/user/blob.bin", format="bytes")
        return [files.read("/home/user/notes/a.txt"), bytes(blob) == bytes(range(256))]

    def listing_and_info() -> Any:
        names = sorted(e.name for e in files.list("/home/user/notes"))
        info = files.get_info("/home/user/blob.bin")
        return [names, info.type == FileType.FILE, info.size, files.exists("/home/user/nope")]

    def mkdir_rename_remove() -> Any:
        made = files.make_dir("/home/user/dir")
        files.rename("/home/user/notes/a.txt", "/home/user/dir/b.txt")
        moved = files.read("/home/user/dir/b.txt")
        files.remove("/home/user/dir")
        return [made, moved, files.exists("/home/user/dir")]

    def watch() -> Any:
        watcher = files.watch_dir("/home/user")
        files.write("/home/user/watched.txt", "x")
        time.sleep(1)
        events = watcher.get_new_events()
        watcher.stop()
        return "watched.txt" in {e.name for e in events}

    step("text_and_binary", text_and_binary)
    step("listing_and_info", listing_and_info)
    step("mkdir_rename_remove", mkdir_rename_remove)
    step("watch", watch)


def lifecycle_steps(sandbox: Sandbox) -> None:
    commands = sandbox.commands

    def listing_by_metadata() -> Any:
        found = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b-program"})).next_items()
        return [s.sandbox_id for s in found] == [sandbox.sandbox_id]

    def timeout() -> Any:
        sandbox.set_timeout(900)
        left = sandbox.get_info().end_at.timestamp() - time.time()
        return 890 < left <= 900

    step("listing_by_metadata", listing_by_metadata)
    step("timeout", timeout)

    def fork() -> Any:
        commands.run("echo from-the-parent > /workspace/shared.txt && sync")
        # Outside the workspace: only the sandbox's memory holds it (E2B's fork keeps memory).
        commands.run("echo in-memory > /tmp/held.txt")
        children = sandbox.fork(count=2)
        seen = []
        for child in children:
            if isinstance(child, Exception):
                seen.append(f"{type(child).__name__}: {child}")
                continue
            seen.append([child.files.read("/workspace/shared.txt"), child.files.read("/tmp/held.txt")])
            child.kill()
        return seen

    def pause_and_connect() -> Any:
        commands.run("echo kept > /workspace/kept.txt && sync")
        paused = sandbox.pause()
        state = Sandbox.get_info(sandbox.sandbox_id).state
        again = Sandbox.connect(sandbox.sandbox_id)
        return [paused, state == SandboxState.PAUSED, again.files.read("/workspace/kept.txt")]

    def metrics() -> Any:
        samples = sandbox.get_metrics()
        latest = samples[-1]
        return [latest.cpu_count >= 1, latest.mem_total > 0, latest.disk_total > 0]

    def snapshot() -> Any:
        commands.run("echo in-the-snapshot > /workspace/snap.txt && sync")
        info = sandbox.create_snapshot(name="e2b-program")
        commands.run("echo after > /workspace/snap.txt && sync")  # not the snapshot's
        made = Sandbox.create(info.snapshot_id, timeout=300)
        seen = made.files.read("/workspace/snap.txt")
        made.kill()
        listed = [s.snapshot_id for s in sandbox.list_snapshots().next_items()]
        return [seen, listed == [info.snapshot_id], Sandbox.delete_snapshot(info.snapshot_id)]

    step("fork", fork)
    step("pause_and_connect", pause_and_connect)
    step("metrics", metrics)
    step("snapshot", snapshot)
    step("kill", lambda: [sandbox.kill(), Sandbox.kill(sandbox.sandbox_id)])


def main() -> None:
    sandbox = Sandbox.create(timeout=600, metadata={"suite": "e2b-program"}, envs={"GREETING": "hi"})
    report["sandbox_id"] = sandbox.sandbox_id
    command_steps(sandbox)
    file_steps(sandbox)
    lifecycle_steps(sandbox)


if __name__ == "__main__":
    main()
    print(json.dumps(report))
    sys.exit(0)
