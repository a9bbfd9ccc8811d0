"""Memory images in a real store (local files; SeaweedFS in the integration tier): what a
capture stores is staged back byte for byte, only over the workspace generation it was bound
to; a flipped byte in a piece or in the manifest, or a missing piece, is refused before
anything appears where runsc would read it. The capture itself (runsc checkpoint of a real
gVisor sandbox) is proven on the deployed platform: tests/workloads/test_memory_images.py."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from warren_blockd import chunks
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.daemon import BlockdError
from warren_blockd.gc import gc
from warren_blockd.memory import PIECE_BYTES, Images
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
