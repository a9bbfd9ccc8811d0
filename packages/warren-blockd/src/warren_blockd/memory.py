"""Memory images of gVisor sandboxes: captured on this node, kept in object storage, staged
on a node for a pod to be restored from.

Layout in object storage:
  images/<image id>              the manifest (JSON); the id is the SHA-256 of its bytes
  images/chunks/<aa>/<digest>    the image files' pieces, 4 MiB raw, as chunks.py stores
                                 them (zstd, addressed by the SHA-256 of the raw bytes)

A manifest names the workspace the sandbox had and the write record (`workspace_seq`) that
was proven in storage after the capture. Taking the pod away unmounts the filesystem, and
ext4 writes its own bookkeeping as it goes: the generation an image is valid over is the one
proven once the pod is gone (never older than the capture's), which the caller records with
the image and names at staging; staging refuses the image over any other. Image pieces live
apart from the workspaces' chunks; gc.py deletes an image once its workspace is released,
and the pieces no remaining image names.

Capture freezes the sandbox (runsc pause), checkpoints it and leaves it frozen, then brings
its workspace to a `replicated` receipt: nothing can write between the two. The caller then
deletes the pod and discards the frozen sandbox (its processes killed where they stand), so
that nothing of it runs after the capture, not even its handlers of the runtime's SIGTERM. Staging checks
the manifest against its id, every piece against its digest and every file against its
digest before the directory appears under its final name; runsc reads nothing else.

A resume slot (a pod made ahead, its root container waiting in `runsc start` for the path
its restore annotation names, images/slot-<pod>) gets its image by `place`: a link to a
staged copy, made in one step, so runsc sees the whole verified image or nothing. `release`
puts an empty file there instead, on which runsc starts the slot's containers afresh: a
slot being deleted ends its wait at once.

The node keeps what it captured or staged (images/<image id>.<token>, STAGED_KEEP_S, at most
STAGED_KEEP_BYTES): a later staging of the same image on this node, the restore that proves
it or the resume, links those files into its own directory once each again has the digest
and size the manifest names, instead of fetching them. Nothing kept is used unchecked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from warren_blockd import chunks
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.daemon import BlockdError, check_id
from warren_blockd.errors import CorruptError, NotFoundError
from warren_blockd.replicator import Receipt
from warren_blockd.workspace import Workspace

log = logging.getLogger("warren_blockd.memory")
FORMAT = 1
PIECE_BYTES = 4 << 20
IMAGE_ID_LENGTH = 64
# The pod annotation (passed to runsc by the runtime's pod_annotations) that makes runsc
# restore each container from this directory where it would have started it (the pinned
# gVisor's patch 0003).
RESTORE_ANNOTATION = "dev.gvisor.internal.restore.image-path"
STAGED_DIR = "images"
COMMAND_TIMEOUT_S = 120.0
# Staged copies serve their restore within seconds and stay for a later staging of the same
# image here (a resume after a pause), the oldest removed first past either bound.
STAGED_KEEP_S = 3600.0
STAGED_KEEP_BYTES = 2 << 30
# Never removed for bytes while younger: a restore may be reading it.
STAGED_FRESH_S = 300.0
# images/slot-<pod>: a link to a staged copy, where a resume slot's pod waits for its image.
SLOT_PREFIX = "slot-"
STAGED_NAME = re.compile(r"[0-9a-f]{64}\.[0-9a-f]{8}")
POD_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,251}[a-z0-9])?")


def check_image_id(image_id: str) -> str:
    if len(image_id) != IMAGE_ID_LENGTH or any(c not in "0123456789abcdef" for c in image_id):
        raise BlockdError("bad_request", f"image {image_id!r} is not an image id (64 hex digits)")
    return image_id


def _piece_key(digest: str) -> str:
    return f"images/{chunks.key_for(digest)}"


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Runsc:
    """The node's runsc, against the state its containerd shim keeps (one root per
    containerd namespace: Kubernetes' is k8s.io)."""

    binary: str
    root: str

    def run(self, *args: str) -> str:
        command = [self.binary, f"--root={self.root}", *args]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BlockdError("host_command_failed", f"runsc {args[0]}: {exc}") from exc
        if done.returncode != 0:
            raise BlockdError("host_command_failed", f"runsc {args[0]} failed: {done.stderr.strip()[-400:]}")
        return done.stdout

    def sandbox_of(self, pod_uid: str) -> str:
        """The id of the gVisor sandbox that runs the pod `pod_uid` (its pause container's)."""
        for container in json.loads(self.run("list", "--format=json") or "[]"):
            notes = container.get("annotations") or {}
            if (
                notes.get("io.kubernetes.cri.sandbox-uid") == pod_uid
                and notes.get("io.kubernetes.cri.container-type") == "sandbox"
                and container.get("status") in ("running", "paused")
            ):
                return str(container["id"])
        raise BlockdError("not_found", f"no gVisor sandbox of pod {pod_uid} runs on this node")


class Images:
    """Capture, store and stage memory images. `flush` brings a workspace attached here to
    a `replicated` receipt (Daemon.flush); `attached` says whether one is attached here."""

    def __init__(  # noqa: PLR0917  # each part is a different kind; names at every call
        self,
        store: PolicyStore,
        state_dir: Path,
        host_state_dir: Path,
        runsc: Runsc | None,
        flush: Callable[[str], Receipt],
        attached: Callable[[str], bool],
    ) -> None:
        self.store, self.runsc = store, runsc
        self.dir, self.host_dir = state_dir / STAGED_DIR, host_state_dir / STAGED_DIR
        self.flush, self.attached = flush, attached
        self.dir.mkdir(parents=True, exist_ok=True)

    def _runsc(self) -> Runsc:
        if self.runsc is None:
            raise BlockdError(
                "no_runsc",
                "this daemon was started without --runsc and --runsc-root: it keeps no memory",
            )
        return self.runsc

    def capture(self, pod_uid: str, workspace: str) -> dict[str, Any]:
        """Freeze and checkpoint the pod's sandbox, prove its workspace in storage, store the
        image. The sandbox stays frozen: the caller deletes its pod. A capture that fails
        lets the sandbox run on."""
        runsc = self._runsc()
        began = time.monotonic()
        sandbox = runsc.sandbox_of(pod_uid)
        work = self.dir / f".capture-{sandbox}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        paused = False
        try:
            # Paused already if a capture before this one froze it and its caller never got
            # the answer (a controller restarted): checkpoint it as it stands.
            if json.loads(runsc.run("state", sandbox)).get("status") != "paused":
                runsc.run("pause", sandbox)
            paused = True
            runsc.run("checkpoint", "--leave-running", f"--image-path={work}", sandbox)
            checkpointed = time.monotonic()
            receipt = self.flush(workspace)
            if receipt.level != "replicated":
                raise BlockdError("not_replicated", f"workspace {workspace} did not reach storage")
            image_id, size = self.keep(work, workspace, receipt.seq)
            # The files just stored are this node's first copy of the image (staging checks
            # them again before any restore reads them).
            work.rename(self.dir / f"{image_id}.{secrets.token_hex(4)}")
        except Exception:
            if paused:  # no image: the sandbox carries on as it was
                self._thaw(runsc, sandbox)
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result = {
            "image": image_id,
            "workspace": workspace,
            "workspace_seq": receipt.seq,
            "bytes": size,
            "checkpoint_ms": round((checkpointed - began) * 1000),
            "capture_ms": round((time.monotonic() - began) * 1000),
        }
        log.info("captured", extra={"fields": {**result, "pod_uid": pod_uid}})
        return result

    def discard(self, pod_uid: str) -> dict[str, Any]:
        """End the sandbox a capture left frozen, once its pod is being deleted: its processes
        are killed where they stand (a frozen sandbox answers no signal the runtime sends, so
        its pod could never finish going), and nothing of it ran after the capture. A sandbox
        already gone is no error; a running one is never killed."""
        runsc = self._runsc()
        try:
            sandbox = runsc.sandbox_of(pod_uid)
        except BlockdError as exc:
            if exc.code != "not_found":
                raise
            return {"pod_uid": pod_uid, "sandbox": None}  # gone already: asking again is harmless
        state = json.loads(runsc.run("state", sandbox))
        if state.get("status") != "paused":
            raise BlockdError(
                "not_frozen", f"the sandbox of pod {pod_uid} is {state.get('status')}, not frozen"
            )
        pid = int(state["pid"])
        os.kill(pid, signal.SIGKILL)
        log.info("discarded", extra={"fields": {"pod_uid": pod_uid, "sandbox": sandbox, "pid": pid}})
        return {"pod_uid": pod_uid, "sandbox": sandbox}

    @staticmethod
    def _thaw(runsc: Runsc, sandbox: str) -> None:
        try:
            runsc.run("resume", sandbox)
        except BlockdError as exc:
            log.error(
                "a sandbox a failed capture froze stays frozen",
                extra={"fields": {"sandbox": sandbox, "error": str(exc)}},
            )

    def keep(self, directory: Path, workspace: str, workspace_seq: int) -> tuple[str, int]:
        """Store the image files in `directory`, bound to the workspace's write record
        `workspace_seq`: the image's id and its size in bytes."""
        files = [self._upload(path) for path in sorted(p for p in directory.iterdir() if p.is_file())]
        manifest = {
            "format": FORMAT,
            "workspace": workspace,
            "workspace_seq": workspace_seq,
            "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": files,
        }
        body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        image_id = hashlib.sha256(body).hexdigest()
        self.store.put(f"images/{image_id}", body)
        return image_id, sum(int(f["size"]) for f in files)

    def _upload(self, path: Path) -> dict[str, Any]:
        pieces, whole = [], hashlib.sha256()
        with path.open("rb") as f:
            while raw := f.read(PIECE_BYTES):
                whole.update(raw)
                digest, stored = chunks.encode(raw)
                key = _piece_key(digest)
                # As put_chunk does: a stored piece is reused only while young, so that the
                # gc (gc.py) never takes one before the manifest naming it is written.
                when = self.store.stat(key)
                if when is None or datetime.now(UTC) - when >= self.store.grace / 2:
                    self.store.put(key, stored)
                pieces.append(digest)
        return {"name": path.name, "size": path.stat().st_size, "sha256": whole.hexdigest(), "pieces": pieces}

    def manifest(self, image_id: str) -> dict[str, Any]:
        """The image's manifest, only if its bytes are what the id names."""
        try:
            body = self.store.get(f"images/{check_image_id(image_id)}")
        except NotFoundError:
            raise BlockdError("not_found", f"no image {image_id} in storage") from None
        if hashlib.sha256(body).hexdigest() != image_id:
            raise BlockdError("corrupt_image", f"image {image_id}: its manifest is not what its id names")
        doc: dict[str, Any] = json.loads(body)
        if doc.get("format") != FORMAT:
            raise BlockdError(
                "corrupt_image", f"image {image_id}: format {doc.get('format')!r} is not {FORMAT}"
            )
        return doc

    def stage(
        self, image_id: str, workspace: str, workspace_seq: int, into: str | None = None
    ) -> dict[str, Any]:
        """Fetch and verify the image into a directory runsc can restore from (where the
        host sees it: `path`), only while the workspace is at `workspace_seq`, the generation
        the caller recorded with the image once its pod was gone. With `into`, the pod to be
        restored gets a new workspace of that id instead, forked from the workspace at that
        generation (a verification, or a fork with memory): the original stays as it is."""
        began = time.monotonic()
        doc = self.manifest(image_id)
        if doc["workspace"] != workspace:
            raise BlockdError(
                "workspace_mismatch",
                f"image {image_id} was captured over workspace {doc['workspace']}, not {workspace}",
            )
        if workspace_seq < doc["workspace_seq"]:
            raise BlockdError(
                "workspace_mismatch",
                f"image {image_id} was captured with workspace {workspace} at write record "
                f"{doc['workspace_seq']}: record {workspace_seq} is older than that",
            )
        if into is None:
            if self.attached(workspace):
                raise BlockdError(
                    "busy",
                    f"workspace {workspace} is still attached on this node: its previous pod has not stopped",
                )
            self._check_seq(workspace, workspace_seq, image_id)
        else:
            self._fork_at(workspace, workspace_seq, into, image_id)
        self._prune()
        # A directory of its own for each staging, every file verified as it is written: a
        # restore reads its image at once. Files kept on this node are linked in instead of
        # fetched, once each again has the digest and size the manifest names.
        final = self.dir / f"{image_id}.{secrets.token_hex(4)}"
        work = self.dir / f".stage-{final.name}"
        work.mkdir()
        kept = self._kept(image_id)
        fetched = 0
        try:
            for item in doc["files"]:
                if not self._link_kept(kept, item, work):
                    self._fetch(image_id, item, work)
                    fetched += 1
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        result = {
            "image": image_id,
            "workspace": into or workspace,
            "path": str(self.host_dir / final.name),
            "stage_ms": round((time.monotonic() - began) * 1000),
            "local": fetched == 0,  # every file linked from a copy kept here
        }
        log.info("staged", extra={"fields": result})
        return result

    def place(self, staged: str, slot: str) -> dict[str, Any]:
        """Give the resume slot `slot` (a pod's name) the image staged at `staged` (a path
        stage answered): images/slot-<slot> made a link to it at once, which that pod's
        root container, waiting for the path, restores from. A slot takes one image."""
        name = Path(staged).name
        if not STAGED_NAME.fullmatch(name) or not (self.dir / name).is_dir():
            raise BlockdError("not_found", f"no staged image {staged!r} on this node: stage it here first")
        if not POD_NAME.fullmatch(slot):
            raise BlockdError("bad_request", f"slot {slot!r} is not a pod's name")
        link = self.dir / f"{SLOT_PREFIX}{slot}"
        try:
            link.symlink_to(name)  # relative: the same link where the host sees the directory
        except FileExistsError:
            raise BlockdError("busy", f"slot {slot} already has an image: a slot restores once") from None
        os.utime(self.dir / name)  # in use: the last to be pruned
        result = {"slot": slot, "path": str(self.host_dir / link.name), "staged": name}
        log.info("placed", extra={"fields": result})
        return result

    def release(self, slot: str) -> dict[str, Any]:
        """Release the resume slot `slot` (a pod's name) that will get no image: an empty file
        at its path, on which its runsc, waiting, starts the container afresh at once (its
        pod is being deleted: only then can the runtime stop it). A slot given an image
        already keeps it."""
        if not POD_NAME.fullmatch(slot):
            raise BlockdError("bad_request", f"slot {slot!r} is not a pod's name")
        path = self.dir / f"{SLOT_PREFIX}{slot}"
        try:
            path.touch(exist_ok=False)
        except FileExistsError:
            return {"slot": slot, "released": False}
        return {"slot": slot, "released": True}

    def _check_seq(self, workspace: str, workspace_seq: int, image_id: str) -> None:
        now = Workspace(self.store, workspace).replicated_seq()
        if now != workspace_seq:
            raise BlockdError(
                "workspace_changed",
                f"workspace {workspace} is at write record {now}, but image {image_id} is valid "
                f"over record {workspace_seq}: its memory would not match its files",
            )

    def _fork_at(self, source: str, workspace_seq: int, child: str, image_id: str) -> None:
        """Make sure `child` is a fork of `source` standing on exactly write record
        `workspace_seq` with nothing of its own: forked now if it does not exist (while the
        source is at that record), or made earlier (by the control plane while the source
        was paused, or by a retry of this staging), whatever the source did since."""
        check_id(child)
        if child == source:
            raise BlockdError(
                "bad_request", f"a restore onto a fork needs a new workspace, not {source} itself"
            )
        if self.attached(child):
            raise BlockdError(
                "busy", f"workspace {child} is attached on this node: a restore needs it unused"
            )
        if not self.store.list(f"workspaces/{child}/manifests/"):
            self._check_seq(source, workspace_seq, image_id)
            error = Workspace(self.store, source).fork([child])[child]
            if error and "already exists" not in error:
                raise BlockdError("fork_failed", f"forking workspace {source} into {child}: {error}")
        base = Workspace(self.store, child).fork_base()
        if base != (source, workspace_seq):
            stands = f"stands on {base[0]} at record {base[1]}" if base else "has writes of its own"
            raise BlockdError(
                "workspace_changed",
                f"workspace {child} {stands}, not on {source} at record {workspace_seq}: "
                "the image would not match its files; give the restore a new workspace id",
            )

    def _fetch(self, image_id: str, item: dict[str, Any], work: Path) -> None:
        name = str(item["name"])
        if "/" in name or name.startswith("."):
            raise BlockdError("corrupt_image", f"image {image_id}: file name {name!r} is not a plain name")
        whole = hashlib.sha256()
        with (work / name).open("wb") as f:
            for digest in item["pieces"]:
                try:
                    raw = chunks.decode(digest, self.store.get(_piece_key(digest)))
                except CorruptError as exc:
                    corrupt = f"image {image_id}, {name}: piece {digest} is corrupt ({exc})"
                    raise BlockdError("corrupt_image", corrupt) from None
                except NotFoundError:
                    raise BlockdError(
                        "corrupt_image", f"image {image_id}, {name}: piece {digest} is missing"
                    ) from None
                whole.update(raw)
                f.write(raw)
        if whole.hexdigest() != item["sha256"] or (work / name).stat().st_size != item["size"]:
            raise BlockdError("corrupt_image", f"image {image_id}: {name} is not the file it names")

    def _kept(self, image_id: str) -> list[Path]:
        """This node's copies of the image, newest first (complete ones: a copy gets its
        final name only once every file in it was written)."""
        found = []
        for path in self.dir.glob(f"{image_id}.*"):
            with contextlib.suppress(FileNotFoundError):  # pruned meanwhile
                found.append((path.stat().st_mtime, path))
        return [path for _, path in sorted(found, reverse=True)]

    def _link_kept(self, kept: list[Path], item: dict[str, Any], work: Path) -> bool:
        """Link the file `item` names into `work` from a kept copy whose file has its digest
        and size now; False if none has."""
        name = str(item["name"])
        for copy in kept:
            source = copy / name
            try:
                if source.stat().st_size != item["size"] or _sha256_of(source) != item["sha256"]:
                    continue
                os.link(source, work / name)
            except FileNotFoundError:
                continue  # pruned meanwhile, or never had this file
            os.utime(copy)  # in use: the last to be pruned
            return True
        return False

    def _prune(self) -> None:
        """Remove staged copies (and work left by a crash) older than STAGED_KEEP_S, and
        the oldest copies past STAGED_KEEP_BYTES (a file linked into several counted once)
        unless younger than STAGED_FRESH_S."""
        ages = []
        for path in self.dir.iterdir():
            if path.name.startswith(SLOT_PREFIX):
                self._prune_slot(path)
                continue
            with contextlib.suppress(FileNotFoundError):
                ages.append((time.time() - path.stat().st_mtime, path))
        seen: set[int] = set()
        total = 0
        for age, path in sorted(ages):
            if not path.name.startswith("."):  # work under way counts no bytes
                total += self._new_bytes(path, seen)
            over = total > STAGED_KEEP_BYTES and age > STAGED_FRESH_S
            if age > STAGED_KEEP_S or over:
                shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def _prune_slot(link: Path) -> None:
        """Remove a slot's link once its copy is gone, and a slot's link or release after
        STAGED_KEEP_S (its pod restored or started long since)."""
        with contextlib.suppress(FileNotFoundError):
            dangling = link.is_symlink() and not link.exists()
            if dangling or time.time() - link.lstat().st_mtime > STAGED_KEEP_S:
                link.unlink()

    @staticmethod
    def _new_bytes(copy: Path, seen: set[int]) -> int:
        """The bytes of `copy`'s files not already counted in `seen` (by inode)."""
        total = 0
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for file in copy.iterdir():
                info = file.stat()
                if info.st_ino not in seen:
                    seen.add(info.st_ino)
                    total += info.st_size
        return total
