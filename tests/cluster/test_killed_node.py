"""Node loss, simulated on the deployed platform (tests/cluster/run.sh): a sandbox writes to its
workspace and gets a `replicated` receipt from the node's warren-blockd; then the node loses
everything a crash and a new disk take (the kubelet stopped, warren-blockd's processes
killed, every container gone, every mount gone, blockd's node-local state and chunk cache
wiped); the node starts again and the same sandbox comes back with every byte the receipt
covered, restored from the object store. The API's answer for what object storage proves,
read before the loss, names at least the receipt's sequence, and still does after.

The second test loses the joined node instead, for good: its sandbox comes back on the first
node, and the lost node's warren-blockd, back again, cannot take the workspace back.

They run before test_local_cluster.py (file order), whose last tests take the cluster down,
and after the acceptance path: they take every pod of the node down with them."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_ansible_site import kubectl, playbook
from test_control_plane import SMALL, ok, read, sandbox

from warren.cluster.process import Supervisor
from warren.config import load_config
from warren.node.layout import NodeLayout
from warren.node.workloads import host_paths

pytestmark = pytest.mark.cluster

BLOCKD = "/opt/warren/blockd/bin/warren-blockd"  # in the warren-blockd image


def blockd_processes(cgroup_root: str = "/") -> list[int]:
    """warren-blockd's processes on one node (the daemon and its CSI plugin, in the
    DaemonSet's pod there): under that node's cgroup root, the first node's by default (its
    /kubepods, not a joined node's /warren-N/kubepods)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        if f"::{cgroup_root}kubepods" in cgroup and any(
            arg.endswith(b"/warren-blockd") for arg in cmdline[:3]
        ):
            found.append(int(entry.name))
    return found


def kill_blockd() -> None:
    """SIGKILL, as a crash: no flush, no unmount."""
    pids = blockd_processes()
    assert pids, "no warren-blockd process runs in a pod"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        assert time.monotonic() < deadline, "warren-blockd survived SIGKILL"
        time.sleep(0.2)


def recorded_loops(blockd_state: Path) -> dict[str, str]:
    """Loop device -> workspace, as warren-blockd recorded them: from the host their backing
    files' paths are the pod's (the FUSE mount lives in its mount namespace), not the node's."""
    found = {}
    for record in blockd_state.glob("workspaces/*/mount.json"):
        loop = json.loads(record.read_text()).get("loop")
        if loop:
            found[loop] = record.parent.name
    return found


def loops_on(roots: list[Path], recorded: dict[str, str]) -> list[str]:
    """Loop devices on files under `roots`, or still on the workspace file blockd put them on."""
    found = []
    for line in subprocess.run(
        ["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], capture_output=True, text=True, check=True
    ).stdout.splitlines():
        name, _, backing = line.strip().partition(" ")
        backing = backing.strip().removesuffix(" (deleted)")
        if any(Path(backing).is_relative_to(root) for root in roots) or Path(backing).name == recorded.get(
            name
        ):
            found.append(name)
    return found


def lose_everything_under(roots: list[Path], recorded: dict[str, str]) -> None:
    """What a reboot does to the node's mounts and loop devices (a crash leaves them)."""
    for name in loops_on(roots, recorded):
        subprocess.run(["losetup", "-d", name], check=False, capture_output=True)
    for _ in range(5):
        mounts = subprocess.run(
            ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True
        ).stdout.split()
        ours = sorted((m for m in mounts if any(Path(m).is_relative_to(r) for r in roots)), reverse=True)
        if not ours:
            break
        for target in ours:
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    else:
        pytest.fail(f"mounts survived the simulated reboot: {ours}")
    # A loop device still busy when it was detached goes once its last mount does.
    deadline = time.monotonic() + 30
    while left := loops_on(roots, recorded):
        assert time.monotonic() < deadline, f"loop devices survived the simulated reboot: {left}"
        time.sleep(0.5)


def remove_every_pod(crictl: list[str]) -> None:
    """Every pod sandbox of the node gone, as after a reboot. A shim that dies while containerd
    stops its container (a gVisor sandbox whose workspace daemon was just killed can) fails that
    one call with "ttrpc: closed"; containerd cleans up the dead shim, so the next call succeeds."""
    for _ in range(3):
        done = subprocess.run(
            [*crictl, "--timeout", "120s", "rmp", "--all", "--force"], capture_output=True, check=False
        )
        left = subprocess.run(
            [*crictl, "pods", "-q"], capture_output=True, text=True, check=False
        ).stdout.split()
        if done.returncode == 0 and not left:
            return
        time.sleep(5)
    ok(done)
    assert not left, f"pod sandboxes survived the simulated reboot: {left}"


def wait_running(env: dict[str, str], sandbox_id: str, timeout: float = 600) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        seen = json.loads(ok(sandbox(env, "--json", "get", sandbox_id)))
        if seen["phase"] == "Running" and sandbox(env, "exec", sandbox_id, "--", "true").returncode == 0:
            return dict(seen)
        assert time.monotonic() < deadline, f"the sandbox did not come back: {seen}"
        time.sleep(2)


def blockd_pod(state: Path, node: str) -> str:
    """The name of warren-blockd's running pod on `node`."""
    found = kubectl(
        state,
        "-n",
        "warren-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=warren-blockd",
        "--field-selector",
        f"spec.nodeName={node},status.phase=Running",
        "-o",
        "name",
    ).split()
    assert len(found) == 1, f"warren-blockd pods on {node}: {found}"
    return found[0]


def replicated(state: Path, node: str, workspace: str) -> dict[str, int | str]:
    """The `replicated` receipt `node`'s warren-blockd gives for everything the workspace
    has written so far."""
    flushed = kubectl(
        state,
        *("-n", "warren-system", "exec", blockd_pod(state, node), "-c", "blockd", "--", BLOCKD),
        *("--socket=/run/warren/blockd.sock", "flush", workspace, "--wait-replicated", "120"),
    )
    receipt: dict[str, int | str] = json.loads(flushed)
    assert receipt["level"] == "replicated", receipt
    return receipt


def created_on(env: dict[str, str], state: Path, node: str, others: list[str], *argv: str) -> str:
    """A sandbox created while every other node is cordoned, so its pod lands on `node`."""
    for other in others:
        kubectl(state, "cordon", other)
    try:
        box = ok(sandbox(env, "create", *argv)).strip()
    finally:
        for other in others:
            kubectl(state, "uncordon", other)
    placed = kubectl(state, "get", "pods", "-A", "-l", "warren.dev/sandbox=true", "-o", "json")
    seen = json.loads(ok(sandbox(env, "--json", "get", box)))
    nodes = {
        pod["spec"].get("nodeName")
        for pod in json.loads(placed)["items"]
        if (pod["metadata"].get("labels") or {}).get("warren.dev/workspace") == seen["workspace_id"]
    }
    assert nodes == {node}, f"sandbox {box} runs on {nodes}, not {node}"
    return box


def test_a_sandbox_survives_the_loss_of_its_node(env: dict[str, str], state: Path, first_node: str) -> None:
    from warren.node.images import busybox_image

    config = load_config(Path(env["WARREN_TEST_CONFIG"]))
    if not config.services.enabled:
        pytest.fail("the node-loss test needs Warren's services as workloads (services.enabled)")
    node = NodeLayout(state / "node")
    blockd_state = Path(host_paths(state)["blockd_state_host_path"])
    supervisor = Supervisor(state)

    # The node lost is the first one, the node in the host's network: its processes, mounts
    # and disk are the host's to kill and wipe.
    others = [n.name for n in config.cluster.joined_nodes]
    box = created_on(env, state, first_node, others, *SMALL, busybox_image(), "--", "sleep", "86400")
    lost = False
    try:
        workspace = json.loads(ok(sandbox(env, "--json", "get", box)))["workspace_id"]
        proven = secrets.token_bytes(3 << 20)  # random: no chunk of it exists anywhere else
        ok(sandbox(env, "write-file", box, "/workspace/proven.bin", stdin=proven))
        ok(sandbox(env, "exec", box, "--", "sync"))
        receipt = replicated(state, first_node, workspace)
        before = json.loads(ok(sandbox(env, "workspace", box)))
        assert before["workspace_id"] == workspace
        assert before["replicated_sequence"] >= receipt["seq"], (before, receipt)
        # Writes still in flight when the node goes: nothing is promised for them.
        ok(sandbox(env, "write-file", box, "/workspace/in-flight.bin", stdin=secrets.token_bytes(1 << 20)))

        # -- the loss -------------------------------------------------------------------
        lost = True
        supervisor.stop("kubelet")
        kill_blockd()
        crictl = [str(Path(env["WARREN_BIN_DIR"]) / "crictl"), "--runtime-endpoint", node.endpoint]
        remove_every_pod(crictl)
        lose_everything_under([node.root], recorded_loops(blockd_state))
        subprocess.run(["rm", "-rf", "--one-file-system", str(blockd_state)], check=True)
        assert not blockd_state.exists()

        # -- the node starts again, as the installer brings it up: site.yml -----------------
        recap = playbook(env)
        lost = False
        assert recap["failed"] == 0 and recap["changed"] > 0, recap
        wait_running(env, box)

        assert read(env, box, "/workspace/proven.bin") == proven
        # The node had nothing: the workspace came from the object store (the new
        # warren-blockd pod's CSI plugin says so).
        logs = kubectl(state, "-n", "warren-system", "logs", blockd_pod(state, first_node), "-c", "csi")
        events = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
        restored = [e for e in events if e.get("event") == "restored" and e.get("workspace") == workspace]
        assert restored, f"no restore of {workspace} in the CSI plugin's log after the loss"
        after = json.loads(ok(sandbox(env, "workspace", box)))
        assert after["replicated_sequence"] >= before["replicated_sequence"]
        # Still a working workspace: it takes new writes and proves them again.
        ok(sandbox(env, "write-file", box, "/workspace/after.txt", stdin=b"after the loss\n"))
        assert read(env, box, "/workspace/after.txt") == b"after the loss\n"
    finally:
        if lost:  # failed half-way: bring the node back, or every later test fails on it
            playbook(env)
        sandbox(env, "delete", "--no-wait", box)


def pods_of(state: Path, workspace: str) -> list[dict[str, object]]:
    """The live pods serving `workspace`, in every namespace."""
    found = json.loads(
        kubectl(state, "get", "pods", "-A", "-l", f"warren.dev/workspace={workspace}", "-o", "json")
    )
    return [pod for pod in found["items"] if not pod["metadata"].get("deletionTimestamp")]


def ready_nodes(state: Path) -> dict[str, bool]:
    found = json.loads(kubectl(state, "get", "nodes", "-o", "json"))["items"]
    return {
        node["metadata"]["name"]: any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or []
        )
        for node in found
    }


def warren_up(env: dict[str, str]) -> None:
    """`warren cluster up`: every node's processes running again, the joined nodes' too."""
    up = subprocess.run(
        [str(Path(sys.executable).parent / "warren"), "cluster", "up", "--config", env["WARREN_TEST_CONFIG"]],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert up.returncode == 0, up.stdout + up.stderr


def kill_joined_node(state: Path, node: str) -> None:
    """A joined node's crash: its kubelet and its warren-blockd SIGKILLed, nothing flushed.
    Its containerd and the sandboxes it runs stay (a node cut off from the cluster)."""
    record = state / "nodes" / node / "run" / "kubelet.json"
    os.kill(int(json.loads(record.read_text())["pid"]), signal.SIGKILL)
    killed = blockd_processes(f"/warren-{node}/")
    assert killed, f"no warren-blockd process of node {node} was found"
    for pid in killed:
        os.kill(pid, signal.SIGKILL)


def assert_stale_writer_refused(state: Path, node: str, workspace: str, holder: str) -> None:
    """Once `node` is Ready again, its warren-blockd's attach of `workspace` is refused:
    `holder` holds it."""
    deadline = time.monotonic() + 300
    while not ready_nodes(state)[node]:
        assert time.monotonic() < deadline, f"{node} did not come back"
        time.sleep(2)
    while True:
        # Its pod reads as Running as soon as the kubelet starts its containers again; the
        # daemon in it answers a moment later (a refused connection until then).
        try:
            stale = subprocess.run(
                [
                    *("kubectl", "--kubeconfig", str(state / "admin.kubeconfig"), "-n", "warren-system"),
                    *("exec", blockd_pod(state, node), "-c", "blockd", "--"),
                    *(BLOCKD, "--socket=/run/warren/blockd.sock", "restore", workspace),
                    "/var/lib/warren/blockd/stale-writer",
                ],
                capture_output=True,
                text=True,
                check=False,
                timeout=300,
            )
        except AssertionError:  # no Running pod of it yet
            stale = None
        if stale is not None and "cannot reach the daemon" not in stale.stderr:
            break
        assert time.monotonic() < deadline, f"warren-blockd did not come back on {node}: {stale}"
        time.sleep(2)
    assert stale.returncode != 0, stale.stdout
    assert "held" in stale.stderr and f"attached on node {holder}" in stale.stderr, stale.stderr


def wait_moved(state: Path, workspace: str, node: str) -> None:
    """Until the workspace's pod runs on `node`."""
    deadline = time.monotonic() + 600
    while not (pods := pods_of(state, workspace)) or pods[0]["spec"].get("nodeName") != node:  # type: ignore[index,union-attr]
        assert time.monotonic() < deadline, f"the sandbox's pod was not replaced on {node}: {pods}"
        time.sleep(3)


def test_a_sandbox_whose_node_is_lost_comes_back_on_another_node_and_the_old_writer_is_fenced(
    env: dict[str, str], state: Path, first_node: str
) -> None:
    """Two Ready nodes with sandboxes on both. The joined node runs a sandbox that writes and
    gets a `replicated` receipt, then writes more; the node's kubelet and warren-blockd are
    killed. The node goes NotReady; after services.node_lost_seconds the controller deletes
    the pod and makes a new one, which lands on the first node and takes the workspace over
    from object storage: every byte the receipt covered is back, the Sandbox says it was
    moved, and the API's proof still names the receipt. Then the lost node comes back: its
    warren-blockd cannot attach the workspace (the first node holds it)."""
    from warren.node.images import busybox_image

    config = load_config(Path(env["WARREN_TEST_CONFIG"]))
    joined = [n.name for n in config.cluster.joined_nodes]
    if not joined:
        pytest.fail("the node-loss test needs a second node: cluster.joined_nodes in warren-test.yaml")
    lost_node = joined[0]
    assert ready_nodes(state) == {first_node: True, **dict.fromkeys(joined, True)}
    argv = (*SMALL, busybox_image(), "--", "sleep", "86400")
    here = created_on(env, state, first_node, joined, *argv)
    box = created_on(env, state, lost_node, [first_node, *joined[1:]], *argv)
    wide = kubectl(state, "get", "pods", "-A", "-l", "warren.dev/sandbox=true", "-o", "wide")
    assert first_node in wide and lost_node in wide, wide
    lost = False
    try:
        workspace = json.loads(ok(sandbox(env, "--json", "get", box)))["workspace_id"]
        proven = secrets.token_bytes(3 << 20)
        ok(sandbox(env, "write-file", box, "/workspace/proven.bin", stdin=proven))
        ok(sandbox(env, "exec", box, "--", "sync"))
        receipt = replicated(state, lost_node, workspace)
        before = json.loads(ok(sandbox(env, "workspace", box)))
        assert before["replicated_sequence"] >= receipt["seq"], (before, receipt)
        ok(sandbox(env, "write-file", box, "/workspace/in-flight.bin", stdin=secrets.token_bytes(1 << 20)))

        # -- the loss ------------------------------------------------------------------
        lost = True
        kill_joined_node(state, lost_node)
        wait_moved(state, workspace, first_node)
        assert not ready_nodes(state)[lost_node]
        seen = wait_running(env, box)
        assert read(env, box, "/workspace/proven.bin") == proven
        (moved,) = [c for c in seen["conditions"] if c["type"] == "NodeLost"]  # type: ignore[attr-defined]
        assert moved["reason"] == "Rescheduled" and lost_node not in json.dumps(seen), seen
        after = json.loads(ok(sandbox(env, "workspace", box)))
        assert after["replicated_sequence"] >= before["replicated_sequence"], (before, after)
        ok(sandbox(env, "write-file", box, "/workspace/after.txt", stdin=b"after the loss\n"))
        assert read(env, box, "/workspace/after.txt") == b"after the loss\n"
        ok(sandbox(env, "exec", here, "--", "true"))  # the first node's sandbox never stopped

        # -- the lost node comes back: its writer cannot take the workspace back ------------
        warren_up(env)
        lost = False
        assert_stale_writer_refused(state, lost_node, workspace, first_node)
        assert read(env, box, "/workspace/proven.bin") == proven
    finally:
        if lost:  # failed half-way: bring the node back, or every later test fails on it
            warren_up(env)
        for sandbox_id in (box, here):
            sandbox(env, "delete", "--no-wait", sandbox_id)
