"""The CLI's own behaviour: the dedup report as JSON, sizes, and clear errors without a daemon."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from warren_blockd.cli import main, size


@pytest.mark.skipif(not shutil.which("mkfs.ext4"), reason="mkfs.ext4 (e2fsprogs) is needed")
def test_dedup_prints_both_ratios_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(6):
        (tree / f"f{i}").write_bytes(bytes([i + 1]) * (300_000 + i * 4096))
    images = []
    for name in ("a", "b"):
        image = tmp_path / f"{name}.img"
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-b", "4096", "-d", str(tree), str(image), "32M"], check=True
        )
        images.append(str(image))
        (tree / "f0").write_bytes(b"changed" * 70_000)  # B differs from A in one file
    assert main(["dedup", *images, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chunk_size"] == 256 * 1024
    assert 0 < doc["shared_ratio_fixed"] <= doc["shared_ratio_file_aligned"] < 1


def test_sizes_and_a_missing_daemon_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert size("8G") == 8 << 30 and size("512M") == 512 << 20 and size("4096") == 4096
    with pytest.raises(Exception, match="is not a size"):
        size("lots")
    assert main(["--socket", str(tmp_path / "none.sock"), "stats"]) == 1
    assert "is `warren-blockd serve` running?" in capsys.readouterr().err


def test_replicated_reads_the_store_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from warren_blockd.blobs.local import LocalDriver
    from warren_blockd.blobs.policy import PolicyStore
    from warren_blockd.workspace import LogLane, Workspace

    store = f"file://{tmp_path}"
    assert main(["replicated", "ws-1", "--store", store]) == 3  # nothing stored yet
    assert json.loads(capsys.readouterr().out)["error"] == "not_found"
    workspace = Workspace(PolicyStore(LocalDriver(tmp_path)), "ws-1")
    workspace.create(16)
    LogLane(workspace, 1).publish([(0, b"\1" * 4096)])
    assert main(["replicated", "ws-1", "--store", store]) == 0
    assert json.loads(capsys.readouterr().out) == {"workspace": "ws-1", "replicated_seq": 1}
    assert main(["replicated", "../etc", "--store", store]) == 2
    assert "is not a workspace id" in capsys.readouterr().err


def test_release_and_gc_work_on_the_store_itself(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from warren_blockd.blobs.local import LocalDriver
    from warren_blockd.blobs.policy import PolicyStore
    from warren_blockd.workspace import LogLane, Workspace

    store = f"file://{tmp_path}"
    policy = PolicyStore(LocalDriver(tmp_path))
    workspace = Workspace(policy, "ws-1")
    workspace.create(16)
    LogLane(workspace, 1).publish([(0, b"\1" * 4096)])

    assert main(["release", "nobody", "--store", store]) == 0  # nothing to release is no error
    out = json.loads(capsys.readouterr().out)
    assert out["found"] is False and "nothing to release" in out["note"]
    assert main(["release", "ws-1", "--store", store]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {
        "workspace": "ws-1",
        "found": True,
        "records_deleted": 1,
        "generations_deleted": 1,
        "kept_for_forks": [],
        "complete": True,
    }
    assert main(["replicated", "ws-1", "--store", store]) == 3
    assert json.loads(capsys.readouterr().out)["error"] == "released"
    assert main(["release", "../etc", "--store", store]) == 2

    assert main(["gc", "--store", store]) == 0  # the default grace: the chunk is too young
    report = json.loads(capsys.readouterr().out)
    assert (report["chunks_seen"], report["deleted"], report["kept_young"]) == (1, 0, 1)
    assert main(["gc", "--store", store, "--grace", "0", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["deleted"] == 1 and "safe only while no writer" in captured.err
    assert policy.list("chunks/")
    assert main(["gc", "--store", store, "--grace", "0"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == 1
    assert policy.list("chunks/") == []
    assert main(["gc", "--store", store, "--grace", "-1"]) == 2


def test_copy_makes_a_workspace_from_the_stored_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from warren_blockd.blobs.local import LocalDriver
    from warren_blockd.blobs.policy import PolicyStore
    from warren_blockd.workspace import LogLane, Workspace

    store = f"file://{tmp_path}"
    policy = PolicyStore(LocalDriver(tmp_path))
    source = Workspace(policy, "ws-1")
    source.create(16)
    LogLane(source, 1).publish([(0, b"\1" * 4096)])

    assert main(["copy", "ws-1", "snap-1", "--store", store]) == 0
    assert json.loads(capsys.readouterr().out) == {"workspace": "ws-1", "copy": "snap-1"}
    copied = Workspace(policy, "snap-1")
    assert copied.effective().extents == Workspace(policy, "ws-1").effective().extents
    before = copied.effective().extents
    # Writes to the source after the copy are not the copy's.
    LogLane(source, 2).publish([(0, b"\2" * 4096)])
    assert copied.effective().extents != Workspace(policy, "ws-1").effective().extents
    # The id is taken now; a source that is not there; ids that are not ids.
    assert main(["copy", "ws-1", "snap-1", "--store", store]) == 1
    assert "snap-1" in capsys.readouterr().err
    assert main(["copy", "nobody", "snap-2", "--store", store]) == 3
    assert json.loads(capsys.readouterr().out)["error"] == "not_found"
    assert main(["copy", "ws-1", "../etc", "--store", store]) == 2
    # The source released (its sandbox deleted), the copy still reads what it had.
    assert main(["release", "ws-1", "--store", store]) == 0
    assert json.loads(capsys.readouterr().out)["kept_for_forks"]
    assert copied.effective().extents == before
