"""Node loss, simulated on the deployed platform (tests/cluster/run.sh): a sandbox writes to its
workspace and gets a `replicated` receipt from the node's blockd; then the node loses
everything a crash and a new disk take (the kubelet, blockd and its CSI plugin killed,
every container gone, every mount gone, blockd's node-local state and chunk cache wiped);
the node starts again and the same sandbox comes back with every byte the receipt covered,
restored from the object store. The API's answer for what object storage proves, read before
the loss, names at least the receipt's sequence, and still does after.

It runs before test_local_cluster.py (file order), whose last tests take the cluster down, and
after the acceptance path: it takes every pod of the node down with it."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest
from test_ansible_site import playbook
from test_control_plane import SMALL, ok, read, run, sandbox

from warren.cluster.process import Supervisor
from warren.config import load_config
from warren.node.layout import NodeLayout
from warren.workspaces.local import BLOCKD, CSI, blockd_env, layout

pytestmark = pytest.mark.cluster


def kill(supervisor: Supervisor, name: str) -> None:
    """SIGKILL, as a crash: no flush, no unmount."""
    record = supervisor.running(name)
    assert record is not None, f"{name} is not running"
    os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while supervisor.running(name) is not None:
        assert time.monotonic() < deadline, f"{name} survived SIGKILL"
        time.sleep(0.2)


def lose_everything_under(roots: list[Path]) -> None:
    """What a reboot does to the node's mounts and loop devices (a crash leaves them)."""
    for line in subprocess.run(
        ["losetup", "-l", "-n", "-O", "NAME,BACK-FILE"], capture_output=True, text=True, check=True
    ).stdout.splitlines():
        name, _, backing = line.strip().partition(" ")
        if any(backing.startswith(str(root)) for root in roots):
            subprocess.run(["losetup", "-d", name], check=False, capture_output=True)
    for _ in range(5):
        mounts = subprocess.run(
            ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=True
        ).stdout.split()
        ours = sorted((m for m in mounts if any(m.startswith(str(r)) for r in roots)), reverse=True)
        if not ours:
            return
        for target in ours:
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)
    pytest.fail(f"mounts survived the simulated reboot: {ours}")


def wait_running(env: dict[str, str], sandbox_id: str, timeout: float = 600) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while True:
        seen = json.loads(ok(sandbox(env, "--json", "get", sandbox_id)))
        if seen["phase"] == "Running" and sandbox(env, "exec", sandbox_id, "--", "true").returncode == 0:
            return dict(seen)
        assert time.monotonic() < deadline, f"the sandbox did not come back: {seen}"
        time.sleep(2)


def test_a_sandbox_survives_the_loss_of_its_node(env: dict[str, str], state: Path) -> None:
    from warren.node.images import busybox_image

    config = load_config(Path(env["WARREN_TEST_CONFIG"]))
    if not config.cluster.sandbox_workspaces:
        pytest.fail("the node-loss test needs the workspace layer (cluster.workspaces.enabled)")
    layer = layout(state)
    node = NodeLayout(state / "node")
    supervisor = Supervisor(state)
    blockd = [str(blockd_env() / "bin" / "warren-blockd"), f"--socket={layer.blockd_socket}"]

    box = ok(sandbox(env, "create", *SMALL, busybox_image(), "--", "sleep", "86400")).strip()
    try:
        workspace = json.loads(ok(sandbox(env, "--json", "get", box)))["workspace_id"]
        proven = secrets.token_bytes(3 << 20)  # random: no chunk of it exists anywhere else
        ok(sandbox(env, "write-file", box, "/workspace/proven.bin", stdin=proven))
        ok(sandbox(env, "exec", box, "--", "sync"))
        receipt = json.loads(
            ok(run(env, blockd[0], *blockd[1:], "flush", workspace, "--wait-replicated", "120"))
        )
        assert receipt["level"] == "replicated", receipt
        before = json.loads(ok(sandbox(env, "workspace", box)))
        assert before["workspace_id"] == workspace
        assert before["replicated_sequence"] >= receipt["seq"], (before, receipt)
        # Writes still in flight when the node goes: nothing is promised for them.
        ok(sandbox(env, "write-file", box, "/workspace/in-flight.bin", stdin=secrets.token_bytes(1 << 20)))

        # -- the loss -------------------------------------------------------------------
        supervisor.stop("kubelet")
        kill(supervisor, CSI)
        kill(supervisor, BLOCKD)
        crictl = [str(Path(env["WARREN_BIN_DIR"]) / "crictl"), "--runtime-endpoint", node.endpoint]
        ok(
            subprocess.run(
                [*crictl, "--timeout", "120s", "rmp", "--all", "--force"], capture_output=True, check=False
            )
        )
        lose_everything_under([node.root, layer.blockd_state])
        subprocess.run(["rm", "-rf", "--one-file-system", str(layer.blockd_state)], check=True)
        assert not layer.blockd_state.exists()
        csi_log = supervisor.log_path(CSI)
        log_before = csi_log.stat().st_size

        # -- the node starts again, as the installer brings it up: site.yml -----------------
        recap = playbook(env)
        assert recap["failed"] == 0 and recap["changed"] > 0, recap
        wait_running(env, box)

        assert read(env, box, "/workspace/proven.bin") == proven
        # The node had nothing: the workspace came from the object store.
        with csi_log.open("rb") as log:
            log.seek(log_before)
            after_log = [json.loads(line) for line in log.read().splitlines() if line.startswith(b"{")]
        restored = [e for e in after_log if e.get("event") == "restored" and e.get("workspace") == workspace]
        assert restored, f"no restore of {workspace} in {csi_log} after the loss"
        after = json.loads(ok(sandbox(env, "workspace", box)))
        assert after["replicated_sequence"] >= before["replicated_sequence"]
        # Still a working workspace: it takes new writes and proves them again.
        ok(sandbox(env, "write-file", box, "/workspace/after.txt", stdin=b"after the loss\n"))
        assert read(env, box, "/workspace/after.txt") == b"after the loss\n"
    finally:
        sandbox(env, "delete", "--no-wait", box)
