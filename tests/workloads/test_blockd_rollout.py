"""warren-blockd's DaemonSet rolled under four writing sandboxes (the cluster tier deployed the
platform as workloads): each sandbox writes files with fsync into /workspace without pause,
the DaemonSet rolls (on each node a new pod beside the old, whose daemon takes every
workspace over by handoff, then the old pod deleted), and then:
no I/O error inside any sandbox, every file a sandbox wrote reads back with the digest it
had, and after a stop (the unpublish waits for a `replicated` receipt) and a start (the
workspace restored) every one still does, with object storage proving a sequence for each
workspace."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import SYSTEM, WAIT_S, blockd_pods, blockd_rolled_out, wait_for
from kubernetes import client

from warren.node.images import busybox_image

pytestmark = pytest.mark.workloads

SANDBOXES = 4
# The writer: 64 KiB files of random bytes, each fsync'd; after each fsync its digest goes to
# a journal in the sandbox's own memory (not the workspace), and any failure to an error file
# there, so both can be read whatever the workspace does. It stops when /workspace/stop exists.
WRITER = r"""
mkdir -p /workspace/w
i=0
while [ ! -e /workspace/stop ]; do
  if dd if=/dev/urandom of=/workspace/w/f$i bs=65536 count=1 conv=fsync 2>/tmp/dd.out; then
    sha256sum /workspace/w/f$i >> /tmp/journal || echo "reading $i failed" >> /tmp/errors
  else
    echo "writing $i failed: $(cat /tmp/dd.out)" >> /tmp/errors
  fi
  i=$((i + 1))
done
touch /tmp/stopped
sleep 86400
"""


@pytest.fixture(scope="module")
def writers(platform: Any) -> Iterator[list[str]]:
    ids: list[str] = []
    try:
        for _ in range(SANDBOXES):
            created = platform.create(
                busybox_image(), command=["sh", "-c", WRITER], cpu_millis=100, memory_mib=128
            )
            ids.append(str(created.id))
        for sandbox_id in ids:
            assert platform.wait_until(sandbox_id, "Running", timeout=WAIT_S).phase == "Running"
        yield ids
    finally:
        for sandbox_id in ids:
            try:
                platform.delete(sandbox_id)
                platform.wait_until(sandbox_id, "Deleted", timeout=WAIT_S)
            except Exception as exc:  # delete the rest; say what stayed
                print(f"could not delete {sandbox_id}: {exc}")


def run(platform: Any, sandbox_id: str, script: str) -> str:
    result = platform.run(sandbox_id, ["sh", "-c", script], timeout=300)
    assert result.exit_code == 0, (script, result.stderr)
    return str(result.stdout.decode())


def journal(platform: Any, sandbox_id: str) -> dict[str, str]:
    """Every file the sandbox's writer fsync'd: path -> sha256."""
    lines = run(platform, sandbox_id, "cat /tmp/journal 2>/dev/null || true").splitlines()
    return {path: digest for digest, path in (line.split() for line in lines if len(line.split()) == 2)}


def errors(platform: Any, sandbox_id: str) -> str:
    return run(platform, sandbox_id, "cat /tmp/errors 2>/dev/null || true").strip()


def wait_writes(platform: Any, ids: list[str], counts: dict[str, int], more: int) -> None:
    for sandbox_id in ids:
        wait_for(
            f"{more} more fsync'd writes in {sandbox_id}",
            lambda s=sandbox_id: len(journal(platform, s)) >= counts.get(s, 0) + more,
        )


def read_back(platform: Any, sandbox_id: str, written: dict[str, str]) -> None:
    """Every journaled file, read back through the workspace, has its digest."""
    lines = run(platform, sandbox_id, "cd /workspace/w && sha256sum f*").splitlines()
    now = {f"/workspace/w/{path}": digest for digest, path in (line.split() for line in lines)}
    differ = sorted(path for path, digest in written.items() if now.get(path) != digest)
    assert differ == [], f"{sandbox_id}: files differ or are missing: {differ[:10]}"


def nodes_of(core: client.CoreV1Api, workspaces: set[str]) -> dict[str, list[str]]:
    """workspace -> the nodes of the pods that mount it (more than one: it moved)."""
    found: dict[str, list[str]] = {w: [] for w in workspaces}
    for pod in core.list_pod_for_all_namespaces(label_selector="warren.dev/workspace").items:
        workspace = pod.metadata.labels.get("warren.dev/workspace")
        if workspace in found:
            found[workspace].append(str(pod.spec.node_name))
    return found


def old_logs(core: client.CoreV1Api, names: set[str], kept: dict[str, str]) -> None:
    """The old daemons' last lines, read while their pods are still there: what each handed
    over is in them, and nothing else keeps it once the rollout deleted the pod."""
    for name in names:
        with contextlib.suppress(client.ApiException):  # gone: the last read stays
            kept[name] = core.read_namespaced_pod_log(name, SYSTEM, container="blockd")[-1500:]


def test_rolling_blockd_under_four_writing_sandboxes(
    api: client.ApiClient, platform: Any, writers: list[str]
) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    wait_writes(platform, writers, {}, 20)
    old_pods = {p.metadata.name for p in blockd_pods(core)}
    wanted = {platform.workspace_proof(s).workspace_id for s in writers}
    placed = nodes_of(core, wanted)
    last_old: dict[str, str] = {}
    before = {s: len(journal(platform, s)) for s in writers}

    # The rollout: a changed template annotation, as `kubectl rollout restart` makes.
    stamp = datetime.now(UTC).isoformat()
    apps.patch_namespaced_daemon_set(
        "warren-blockd",
        SYSTEM,
        {"spec": {"template": {"metadata": {"annotations": {"warren.dev/rolled-at": stamp}}}}},
    )

    def rolled() -> bool:
        old_logs(core, old_pods, last_old)
        return blockd_rolled_out(apps) and not old_pods & {p.metadata.name for p in blockd_pods(core)}

    wait_for("the DaemonSet's rollout, the old pods gone", rolled)
    new_pods = blockd_pods(core)
    assert new_pods and not {p.metadata.name for p in new_pods} & old_pods
    # The new daemons took the writers' workspaces over, each on its own node (no plain
    # start, no restore from storage).
    taken: set[str] = set()
    logs = {}
    for pod in new_pods:
        log = logs[pod.metadata.name] = core.read_namespaced_pod_log(
            pod.metadata.name, SYSTEM, container="blockd"
        )
        took_over = [json.loads(line) for line in log.splitlines() if '"took over"' in line]
        if took_over:
            taken |= set(took_over[-1]["workspaces"])
            print("took over:", took_over[-1])
    tails = {name: log[-2000:] for name, log in logs.items()}
    # A node taken for lost (services.node_lost_seconds) moves its sandboxes: NodeLost says so.
    conditions = {s: [c for c in platform.get(s).conditions if c.status != "False"] for s in writers}
    ready = {
        n.metadata.name: [
            (c.status, str(c.last_transition_time)) for c in n.status.conditions if c.type == "Ready"
        ]
        for n in core.list_node().items
    }
    assert wanted <= taken, (
        f"not taken over by handoff: {sorted(wanted - taken)}; the writers' nodes before: {placed}, "
        f"now: {nodes_of(core, wanted)}; the writers' conditions: {conditions}; "
        f"the nodes' Ready: {ready}; new daemons' logs: {tails}; old daemons' last logs: {last_old}"
    )
    # The sandboxes wrote on through it, served by the new daemon.
    wait_writes(platform, writers, before, 20)

    for sandbox_id in writers:
        run(platform, sandbox_id, "touch /workspace/stop")
    for sandbox_id in writers:
        wait_for(
            f"{sandbox_id}'s writer to stop",
            lambda s=sandbox_id: run(platform, s, "ls /tmp").count("stopped"),
        )
    written = {s: journal(platform, s) for s in writers}
    for sandbox_id in writers:
        assert errors(platform, sandbox_id) == "", f"I/O errors inside {sandbox_id}"
        assert len(written[sandbox_id]) >= before[sandbox_id] + 20
        read_back(platform, sandbox_id, written[sandbox_id])

    # Through storage: a stop unpublishes (the flush waits for `replicated`), a start restores.
    for sandbox_id in writers:
        platform.stop(sandbox_id)
    for sandbox_id in writers:
        assert platform.wait_until(sandbox_id, "Stopped", timeout=WAIT_S).phase == "Stopped"
        proof = platform.workspace_proof(sandbox_id)
        assert proof.replicated_sequence, f"object storage proves nothing for {sandbox_id}"
        platform.start(sandbox_id)
    for sandbox_id in writers:
        assert platform.wait_until(sandbox_id, "Running", timeout=WAIT_S).phase == "Running"
        read_back(platform, sandbox_id, written[sandbox_id])
    marker = uuid.uuid4().hex
    assert (
        run(platform, writers[0], f"echo {marker} > /workspace/after && cat /workspace/after").strip()
        == marker
    )
