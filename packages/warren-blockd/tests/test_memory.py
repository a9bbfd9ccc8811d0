"""Memory images in a real store (local files; SeaweedFS in the integration tier): what a
capture stores is staged back byte for byte, only over the workspace generation it was bound
to; a flipped byte in a piece or in the manifest, or a missing piece, is refused before
anything appears where runsc would read it. The capture itself (runsc checkpoint of a real
gVisor sandbox) is proven on the deployed platform: tests/workloads/test_memory_images.py."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from warren_blockd import chunks, memory
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.daemon import BlockdError
from warren_blockd.gc import gc
from warren_blockd.memory import PIECE_BYTES, Images, Runsc
from warren_blockd.replicator import Receipt
from warren_blockd.workspace import LogLane, Workspace

WORKSPACE = "ws_memorytest"


def images(store: PolicyStore, tmp_path: Path, attached: bool = False) -> Images:
    def flush(workspace: str) -> Receipt:
        return Receipt(workspace, Workspace(store, workspace).replicated_seq(), "replicated")

    return Images(store, tmp_path / "state", Path("/host/state"), None, flush, lambda _w: attached)


def store_image(store: PolicyStore, tmp_path: Path) -> tuple[str, dict[str, bytes]]:
    """An image of two files (one of several pieces) as capture stores it: its id and bytes."""
    Workspace(store, WORKSPACE).create(1024)
    files = {"checkpoint.img": os.urandom(1000), "pages.img": os.urandom(PIECE_BYTES * 2 + 17)}
    work = tmp_path / "captured"
    work.mkdir()
    for name, data in files.items():
        (work / name).write_bytes(data)
    image_id, size = images(store, tmp_path).keep(work, WORKSPACE, 0)
    assert size == sum(len(data) for data in files.values())
    return image_id, files


def test_a_staged_image_is_the_captured_files_where_the_host_sees_them(
    store: PolicyStore, tmp_path: Path
) -> None:
    image_id, files = store_image(store, tmp_path)
    staged = images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    name = staged["path"].removeprefix("/host/state/images/")
    assert name.startswith(f"{image_id}.")
    here = tmp_path / "state" / "images" / name
    assert {p.name: p.read_bytes() for p in here.iterdir()} == files
    # Each staging makes and verifies its own copy; one older than STAGED_KEEP_S goes.
    os.utime(here, (0, 0))
    again = images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    assert again["path"] != staged["path"] and not here.exists()
    # The pages file went as pieces of at most PIECE_BYTES, stored once each.
    doc = json.loads(store.get(f"images/{image_id}"))
    pages = next(f for f in doc["files"] if f["name"] == "pages.img")
    assert len(pages["pieces"]) == 3


def test_a_second_staging_links_the_files_kept_here_once_each_is_checked_again(
    store: PolicyStore, tmp_path: Path
) -> None:
    image_id, files = store_image(store, tmp_path)
    first = images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    assert first["local"] is False
    here = tmp_path / "state" / "images"
    kept = here / first["path"].removeprefix("/host/state/images/")
    # Without the pieces in storage, only the kept copy can serve the second staging.
    doc = json.loads(store.get(f"images/{image_id}"))
    pieces = {p for f in doc["files"] for p in f["pieces"]}
    for digest in pieces:
        store.delete(f"images/{chunks.key_for(digest)}")
    second = images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    assert second["local"] is True and second["path"] != first["path"]
    copy = here / second["path"].removeprefix("/host/state/images/")
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == files
    assert (copy / "pages.img").stat().st_ino == (kept / "pages.img").stat().st_ino
    # A kept file that changed is never used: with nothing in storage either, refused. The
    # copies share the file (linked): one write changes it in each.
    with (kept / "pages.img").open("r+b") as f:
        f.seek(5)
        byte = f.read(1)
        f.seek(5)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(BlockdError, match="is missing") as exc:
        images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    assert exc.value.code == "corrupt_image"


def test_kept_copies_past_the_byte_bound_go_least_recently_used_first_but_never_a_fresh_one(
    store: PolicyStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_id, _ = store_image(store, tmp_path)
    staged = images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    here = tmp_path / "state" / "images"
    older = here / staged["path"].removeprefix("/host/state/images/")
    newer = here / f"{image_id}.{'b' * 8}"
    shutil.copytree(older, newer)  # files of its own, not linked
    size = sum(f.stat().st_size for f in older.iterdir())
    monkeypatch.setattr(memory, "STAGED_KEEP_BYTES", size)  # room for one
    monkeypatch.setattr(memory, "STAGED_KEEP_S", float("inf"))

    def age(path: Path, seconds: float) -> None:
        os.utime(path, (time.time() - seconds,) * 2)

    # Over the bound, but both fresh: both stay.
    age(newer, memory.STAGED_FRESH_S - 60)
    age(older, memory.STAGED_FRESH_S - 30)
    images(store, tmp_path).stage(image_id, WORKSPACE, 0, into="ws_c1")
    assert older.exists() and newer.exists()
    # Neither fresh now: the one used longest ago goes, the other (within the bound) stays.
    age(newer, memory.STAGED_FRESH_S + 10)
    age(older, memory.STAGED_FRESH_S + 20)
    for path in here.iterdir():
        if path not in (older, newer):
            shutil.rmtree(path)  # the staging just made: only the two compete
    images(store, tmp_path).stage(image_id, WORKSPACE, 0, into="ws_c2")
    assert not older.exists() and newer.exists()


def test_a_placed_image_appears_whole_at_its_slot_once_and_goes_with_its_copy(
    store: PolicyStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_id, files = store_image(store, tmp_path)
    keeper = images(store, tmp_path)
    staged = keeper.stage(image_id, WORKSPACE, 0)
    placed = keeper.place(staged["path"], "resume-base-3f2a9c")
    # Where the slot's pod waits (its restore annotation): the verified files, by a link.
    assert placed["path"] == "/host/state/images/slot-resume-base-3f2a9c"
    slot = tmp_path / "state" / "images" / "slot-resume-base-3f2a9c"
    assert slot.is_symlink() and not slot.readlink().is_absolute()
    assert {p.name: p.read_bytes() for p in slot.iterdir()} == files
    with pytest.raises(BlockdError, match="a slot restores once") as exc:
        keeper.place(staged["path"], "resume-base-3f2a9c")
    assert exc.value.code == "busy"
    # Only a staged copy of this node, to a pod's name: nothing else is linked.
    for bad_staged, slot_name, code in (
        ("/host/state/images/" + "0" * 64 + ".deadbeef", "resume-x", "not_found"),
        ("/etc", "resume-x", "not_found"),
        (staged["path"], "../escape", "bad_request"),
        (staged["path"], "Upper", "bad_request"),
    ):
        with pytest.raises(BlockdError) as exc:
            keeper.place(bad_staged, slot_name)
        assert exc.value.code == code, (bad_staged, slot_name)
    # The link goes once its copy does (a later staging prunes both).
    copy = tmp_path / "state" / "images" / staged["path"].removeprefix("/host/state/images/")
    monkeypatch.setattr(memory, "STAGED_KEEP_S", float("inf"))
    keeper.stage(image_id, WORKSPACE, 0)
    assert slot.is_symlink()
    shutil.rmtree(copy)
    keeper.stage(image_id, WORKSPACE, 0)
    assert not slot.is_symlink()


def test_a_released_slot_gets_an_empty_file_once_and_a_placed_one_keeps_its_image(
    store: PolicyStore, tmp_path: Path
) -> None:
    image_id, _ = store_image(store, tmp_path)
    keeper = images(store, tmp_path)
    here = tmp_path / "state" / "images"
    # Released before any image: an empty file, on which its runsc starts afresh.
    assert keeper.release("resume-a") == {"slot": "resume-a", "released": True}
    assert (here / "slot-resume-a").is_file() and (here / "slot-resume-a").stat().st_size == 0
    with pytest.raises(BlockdError) as exc:
        keeper.place(keeper.stage(image_id, WORKSPACE, 0)["path"], "resume-a")
    assert exc.value.code == "busy"
    # Placed first: the release changes nothing.
    keeper.place(keeper.stage(image_id, WORKSPACE, 0)["path"], "resume-b")
    assert keeper.release("resume-b")["released"] is False
    assert (here / "slot-resume-b").is_symlink() and (here / "slot-resume-b").is_dir()
    with pytest.raises(BlockdError) as exc:
        keeper.release("../x")
    assert exc.value.code == "bad_request"


def test_an_image_over_a_workspace_written_since_is_refused_by_name(
    store: PolicyStore, tmp_path: Path
) -> None:
    image_id, _ = store_image(store, tmp_path)
    LogLane(Workspace(store, WORKSPACE), next_seq=1).publish([(0, bytes(4096))])
    with pytest.raises(BlockdError, match=r"at write record 1, but image \w+ is valid over record 0") as exc:
        images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    assert exc.value.code == "workspace_changed"
    assert not (tmp_path / "state" / "images" / image_id).exists()


def test_an_image_of_another_workspace_or_generation_or_still_attached_is_refused(
    store: PolicyStore, tmp_path: Path
) -> None:
    image_id, _ = store_image(store, tmp_path)
    with pytest.raises(BlockdError, match="captured over workspace ws_memorytest, not ws_other"):
        images(store, tmp_path).stage(image_id, "ws_other", 0)
    LogLane(Workspace(store, WORKSPACE), next_seq=1).publish([(0, bytes(4096))])
    image_id, _ = images(store, tmp_path).keep(tmp_path / "captured", WORKSPACE, 1)
    with pytest.raises(BlockdError, match="at write record 1: record 0 is older than that"):
        images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    with pytest.raises(BlockdError, match="still attached on this node") as exc:
        images(store, tmp_path, attached=True).stage(image_id, WORKSPACE, 1)
    assert exc.value.code == "busy"


def test_an_image_staged_onto_a_fork_gets_a_new_workspace_at_its_generation(
    store: PolicyStore, tmp_path: Path
) -> None:
    store_image(store, tmp_path)
    lane = LogLane(Workspace(store, WORKSPACE), next_seq=1)
    lane.publish([(0, b"\x01" * 4096)])
    image_id, _ = images(store, tmp_path).keep(tmp_path / "captured", WORKSPACE, 1)
    staged = images(store, tmp_path).stage(image_id, WORKSPACE, 1, into="ws_child")
    assert staged["workspace"] == "ws_child"
    assert Workspace(store, "ws_child").fork_base() == (WORKSPACE, 1)
    assert Workspace(store, "ws_child").effective().extents == Workspace(store, WORKSPACE).effective().extents
    # A retry finds the child it made; the original workspace is untouched by it.
    images(store, tmp_path).stage(image_id, WORKSPACE, 1, into="ws_child")
    assert Workspace(store, WORKSPACE).replicated_seq() == 1
    # A child written since, or an id that is the workspace itself, is refused by name.
    LogLane(Workspace(store, "ws_child"), next_seq=1).publish([(1, bytes(4096))])
    with pytest.raises(BlockdError, match="ws_child has writes of its own, not on ws_memorytest at record 1"):
        images(store, tmp_path).stage(image_id, WORKSPACE, 1, into="ws_child")
    with pytest.raises(BlockdError, match="needs a new workspace"):
        images(store, tmp_path).stage(image_id, WORKSPACE, 1, into=WORKSPACE)
    with pytest.raises(BlockdError, match="is invalid"):
        images(store, tmp_path).stage(image_id, WORKSPACE, 1, into="../x")
    # A child forked ahead (by the control plane, while the original was paused) is
    # restored onto whatever the original does since; a new one would stand on a later
    # record once the original moved on: refused before it is made.
    assert Workspace(store, WORKSPACE).fork(["ws_ahead"]) == {"ws_ahead": None}
    lane.publish([(2, bytes(4096))])
    assert images(store, tmp_path).stage(image_id, WORKSPACE, 1, into="ws_ahead")["workspace"] == "ws_ahead"
    with pytest.raises(BlockdError, match="at write record 2, but image"):
        images(store, tmp_path).stage(image_id, WORKSPACE, 1, into="ws_other")
    assert not store.list("workspaces/ws_other/")


def test_a_flipped_byte_in_a_piece_is_refused_before_any_file_appears(
    store: PolicyStore, tmp_path: Path
) -> None:
    image_id, _ = store_image(store, tmp_path)
    doc = json.loads(store.get(f"images/{image_id}"))
    digest = doc["files"][1]["pieces"][1]
    key = f"images/{chunks.key_for(digest)}"
    data = bytearray(store.get(key))
    data[len(data) // 2] ^= 0x01
    store.put(key, bytes(data))
    with pytest.raises(BlockdError, match=f"piece {digest} is corrupt") as exc:
        images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    assert exc.value.code == "corrupt_image"
    assert list((tmp_path / "state" / "images").iterdir()) == []  # not even the work directory


def test_a_changed_manifest_or_a_missing_piece_is_refused(store: PolicyStore, tmp_path: Path) -> None:
    image_id, _ = store_image(store, tmp_path)
    body = store.get(f"images/{image_id}")
    doc = json.loads(body)
    store.put(f"images/{image_id}", body.replace(b'"workspace_seq":0', b'"workspace_seq":1'))
    with pytest.raises(BlockdError, match="its manifest is not what its id names"):
        images(store, tmp_path).stage(image_id, WORKSPACE, 0)
    store.put(f"images/{image_id}", body)
    store.delete(f"images/{chunks.key_for(doc['files'][0]['pieces'][0])}")
    with pytest.raises(BlockdError, match="is missing"):
        images(store, tmp_path).stage(image_id, WORKSPACE, 0)


def test_no_image_and_no_runsc_say_so(store: PolicyStore, tmp_path: Path) -> None:
    with pytest.raises(BlockdError, match=f"no image {'0' * 64} in storage"):
        images(store, tmp_path).stage("0" * 64, WORKSPACE, 0)
    with pytest.raises(BlockdError, match="not an image id"):
        images(store, tmp_path).stage("../etc", WORKSPACE, 0)
    with pytest.raises(BlockdError, match="started without --runsc") as exc:
        images(store, tmp_path).capture("pod-uid", WORKSPACE)
    assert exc.value.code == "no_runsc"


def test_an_image_goes_with_its_workspace_and_its_pieces_once_old_enough(
    store: PolicyStore, tmp_path: Path
) -> None:
    image_id, _ = store_image(store, tmp_path)
    pieces = set(store.list("images/chunks/"))
    later = datetime.now(UTC) + timedelta(hours=7)  # past the default grace
    kept = gc(store, now=later)
    assert (kept.images_deleted, kept.image_pieces_deleted) == (0, 0)
    assert set(store.list("images/chunks/")) == pieces
    # A piece no image names (a capture that failed before its manifest) goes once old.
    stray, _ = chunks.encode(b"stray")
    store.put(f"images/{chunks.key_for(stray)}", chunks.encode(b"stray")[1])
    assert gc(store).image_pieces_deleted == 0  # young: a capture may still name it
    Workspace(store, WORKSPACE).release()
    dry = gc(store, now=later, dry_run=True)
    assert (dry.images_deleted, dry.image_pieces_deleted) == (1, len(pieces) + 1)
    assert store.exists(f"images/{image_id}")
    swept = gc(store, now=later)
    assert (swept.images_deleted, swept.image_pieces_deleted) == (1, len(pieces) + 1)
    assert store.list("images/") == []
    with pytest.raises(BlockdError, match="no image"):
        images(store, tmp_path).stage(image_id, WORKSPACE, 0)


# A stand-in for runsc, for the faults the real one cannot be made to show on demand (a
# checkpoint that fails after the pause, a sandbox a capture before left paused): it answers
# `list` and `state` from a JSON file, writes an image on `checkpoint`, and logs every call.
# The real runsc is driven by the cluster tier (tests/workloads/test_memory_images.py).
FAKE_RUNSC = r"""#!/usr/bin/env python3
import json, pathlib, sys
here = pathlib.Path(sys.argv[0]).parent
state = json.loads((here / "state.json").read_text())
args = [a for a in sys.argv[1:] if not a.startswith("--root=")]
with (here / "calls").open("a") as log:
    log.write(" ".join(args) + "\n")
verb = args[0]
if verb == "list":
    print(json.dumps([{"id": "sbx1", "status": state["status"], "annotations": {
        "io.kubernetes.cri.sandbox-uid": "pod-1", "io.kubernetes.cri.container-type": "sandbox"}}]))
elif verb == "state":
    print(json.dumps({"status": state["status"], "pid": 0}))
elif verb in ("pause", "resume"):
    state["status"] = "paused" if verb == "pause" else "running"
    (here / "state.json").write_text(json.dumps(state))
elif verb == "checkpoint":
    if state.get("fail_checkpoint"):
        sys.exit("checkpoint: cannot save the sandbox")
    path = next(a.split("=", 1)[1] for a in args if a.startswith("--image-path="))
    (pathlib.Path(path) / "checkpoint.img").write_bytes(b"memory" * 1000)
"""


def fake_runsc(tmp_path: Path, status: str, fail_checkpoint: bool = False) -> Runsc:
    bin_dir = tmp_path / "runsc"
    bin_dir.mkdir()
    (bin_dir / "state.json").write_text(json.dumps({"status": status, "fail_checkpoint": fail_checkpoint}))
    binary = bin_dir / "runsc"
    binary.write_text(FAKE_RUNSC)
    binary.chmod(0o755)
    return Runsc(str(binary), str(tmp_path / "root"))


def calls(runsc: Runsc) -> list[str]:
    return [line.split()[0] for line in (Path(runsc.binary).parent / "calls").read_text().splitlines()]


def capturing(store: PolicyStore, tmp_path: Path, runsc: Runsc) -> Images:
    Workspace(store, WORKSPACE).create(1024)

    def flush(workspace: str) -> Receipt:
        return Receipt(workspace, Workspace(store, workspace).replicated_seq(), "replicated")

    return Images(store, tmp_path / "state", Path("/host/state"), runsc, flush, lambda _w: False)


def test_a_capture_freezes_checkpoints_and_leaves_the_sandbox_frozen(
    store: PolicyStore, tmp_path: Path
) -> None:
    runsc = fake_runsc(tmp_path, "running")
    captured = capturing(store, tmp_path, runsc).capture("pod-1", WORKSPACE)
    assert calls(runsc) == ["list", "state", "pause", "checkpoint"]
    assert captured["workspace"] == WORKSPACE and captured["bytes"] == 6000
    assert store.exists(f"images/{captured['image']}")
    # The work directory is the node's first copy of the image, under the image's id.
    (kept,) = (tmp_path / "state" / "images").iterdir()
    assert kept.name.startswith(f"{captured['image']}.")


def test_a_failed_checkpoint_lets_the_sandbox_run_on(store: PolicyStore, tmp_path: Path) -> None:
    runsc = fake_runsc(tmp_path, "running", fail_checkpoint=True)
    with pytest.raises(BlockdError, match="cannot save the sandbox"):
        capturing(store, tmp_path, runsc).capture("pod-1", WORKSPACE)
    assert calls(runsc) == ["list", "state", "pause", "checkpoint", "resume"]
    assert store.list("images/") == []


def test_a_sandbox_an_earlier_capture_left_frozen_is_checkpointed_as_it_stands(
    store: PolicyStore, tmp_path: Path
) -> None:
    runsc = fake_runsc(tmp_path, "paused")
    taker = capturing(store, tmp_path, runsc)
    taker.capture("pod-1", WORKSPACE)
    assert calls(runsc) == ["list", "state", "checkpoint"]
    with pytest.raises(BlockdError, match="no gVisor sandbox of pod pod-2"):
        taker.capture("pod-2", WORKSPACE)
