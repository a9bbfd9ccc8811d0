"""The daemon end to end through its socket, with real QEMU guests (TCG here)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from conftest import Daemon
from warren_forkd.client import ApiError, Client

pytestmark = pytest.mark.integration
CHILDREN = 3


def metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


def test_template_boot_snapshot_branch_exec_stop(daemon: Client, tmp_path: Path) -> None:
    built = daemon.post("/v1/templates", name="busybox", mem_mib=128)
    # A second template registered from paths: its own copy of the base disk, changed below.
    disk = tmp_path / "base.ext4"
    shutil.copy(built["disk"], disk)
    tpl = daemon.post(
        "/v1/templates",
        name="mine",
        kernel=built["kernel"],
        initramfs=built["initramfs"],
        disk=str(disk),
        mem_mib=128,
    )
    assert {t["name"] for t in daemon.get("/v1/templates")} == {"busybox", "mine"}
    assert refused_status(daemon, "/v1/templates", name="mine") == 409

    parent = daemon.post("/v1/vms", template=tpl["name"], id="parent")
    assert parent["state"] == "running" and parent["ready_ms"] > 0
    assert daemon.post("/v1/vms/parent/exec", command="echo hi")["output"] == "hi\n"

    snap = daemon.post("/v1/vms/parent/snapshot", id="snap")
    assert snap["disk_generation"].startswith("sha256:")
    assert daemon.get("/v1/vms/parent")["state"] == "snapshotted"
    assert refused_status(daemon, "/v1/vms/parent/exec", command="true") == 409  # paused for good

    branched = daemon.post("/v1/snapshots/snap/branch", count=CHILDREN)
    assert branched["failed"] == 0, branched
    ids = [c["id"] for c in branched["children"]]
    assert len(set(ids)) == CHILDREN
    assert refused_status(daemon, f"/v1/vms/{ids[0]}/snapshot") == 409  # children map RAM privately

    hostnames = [daemon.post(f"/v1/vms/{i}/exec", command="hostname")["output"].strip() for i in ids]
    assert hostnames == ids
    randoms = {
        daemon.post(f"/v1/vms/{i}/exec", command="head -c 16 /dev/urandom | od -An -tx1")["output"]
        for i in ids
    }
    assert len(randoms) == CHILDREN
    failing = daemon.post(f"/v1/vms/{ids[0]}/exec", command="echo oops >&2; exit 3")
    assert (failing["rc"], failing["output"]) == (3, "oops\n")

    listed = {vm["id"]: vm for vm in daemon.get("/v1/vms")}
    assert set(listed) == {"parent", *ids}
    assert all(listed[i]["branched_from"] == "snap" and listed[i]["pss_mib"] > 0 for i in ids)

    text = daemon.metrics()
    assert metric(text, "forkd_vms", '{state="running"}') == CHILDREN
    assert metric(text, "forkd_vms", '{state="snapshotted"}') == 1
    assert metric(text, "forkd_boot_seconds_count") >= 1
    assert metric(text, "forkd_snapshot_seconds_count") >= 1
    assert metric(text, "forkd_branch_child_seconds_count") >= CHILDREN
    assert metric(text, "forkd_branch_children_total", '{result="ok"}') >= CHILDREN

    for vm_id in [*ids, "parent"]:
        assert daemon.post(f"/v1/vms/{vm_id}/stop")["state"] == "stopped"
    assert daemon.get("/v1/vms") == []
    text = daemon.metrics()
    assert [metric(text, "forkd_vms", f'{{state="{s}"}}') for s in ("running", "snapshotted")] == [0, 0]

    # The snapshot outlives its parent; over another disk generation it is refused, by name.
    flip_byte(disk)
    with pytest.raises(ApiError) as info:
        daemon.post("/v1/snapshots/snap/branch", count=1)
    doc = info.value.doc
    assert (info.value.status, doc["error"]) == (409, "generation_mismatch")
    assert doc["recorded"] == snap["disk_generation"]
    assert doc["found"].startswith("sha256:") and doc["found"] != doc["recorded"]
    assert doc["fix"]
    assert daemon.get("/v1/vms") == []  # nothing was started


def refused_status(daemon: Client, path: str, **body: object) -> int:
    with pytest.raises(ApiError) as info:
        daemon.post(path, **body)
    return info.value.status


def flip_byte(disk: Path) -> None:
    """One changed byte is another disk generation."""
    with disk.open("r+b") as f:
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_restart_keeps_templates_and_snapshots_and_kills_vms(tmp_path: Path) -> None:
    first = Daemon(tmp_path)
    try:
        first.client.post("/v1/templates", name="t", mem_mib=128)
        vm = first.client.post("/v1/vms", template="t", id="left-running")
        first.client.post("/v1/vms/left-running/snapshot", id="kept")
        child = first.client.post("/v1/snapshots/kept/branch", count=1, ids=["child"])["children"][0]
        assert child["ok"], child
        pids = [vm["pid"], first.client.get("/v1/vms/child")["pid"]]
    finally:
        assert first.stop() == 0, first.log.read_text()[-3000:]
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]  # no QEMU outlives it
    assert not list((tmp_path / "state" / "vms").iterdir())

    second = Daemon(tmp_path)
    try:
        assert [t["name"] for t in second.client.get("/v1/templates")] == ["t"]
        assert [s["id"] for s in second.client.get("/v1/snapshots")] == ["kept"]
        assert second.client.get("/v1/vms") == []
        again = second.client.post("/v1/snapshots/kept/branch", count=1)["children"][0]
        assert again["ok"], again
        assert (
            second.client.post(f"/v1/vms/{again['id']}/exec", command="hostname")["output"]
            == f"{again['id']}\n"
        )
    finally:
        assert second.stop() == 0, second.log.read_text()[-3000:]
