"""Publish and unpublish a workspace for a pod, through this node's warren-blockd daemon.

Publish: the daemon mounts the workspace (restored from object storage, or first created,
forked or made from a template) at a staging directory the plugin owns,
`<plugin dir>/workspaces/<id>`, and the plugin binds that at the pod's target path
nosuid,nodev. Unpublish: flush and wait, bounded, for a `replicated` receipt; unbind; have
the daemon unmount and detach. The workspace stays in object storage for the next publish,
on this node or any other.

A bindAtClaim volume is published empty: a record, and the target directory with nothing
mounted, so the pod's sandbox can start before its workspace is known. `bind` later names the
workspace (made, forked or restored as a publish would) and mounts it at that target, where
only a container started after it sees it (under gVisor, a container's gofer serves the
mounts that existed when it started).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from warren_blockd.client import ApiError, Client
from warren_blockd.csi import mounts, rootfs
from warren_blockd.csi.attributes import AwaitingClaim, VolumeRequest, missing_size
from warren_blockd.csi.errors import CsiError, from_api, unreachable
from warren_blockd.csi.records import Publication, Records

log = logging.getLogger("warren_blockd.csi")
Code = grpc.StatusCode


class Publisher:
    def __init__(
        self, client: Client, plugin_dir: Path, replicate_wait: float, runtime_state: Path | None = None
    ) -> None:
        self.client = client
        self.runtime_state = runtime_state
        self.records = Records(plugin_dir / "volumes")
        self.staging_root = plugin_dir / "workspaces"
        self.replicate_wait = replicate_wait
        self._table = threading.Lock()  # the records: check and claim in one step
        self._locks: dict[str, threading.Lock] = {}  # one per workspace: kubelet retries overlap

    def staging(self, workspace: str) -> Path:
        return self.staging_root / workspace

    def _lock(self, workspace: str) -> threading.Lock:
        with self._table:
            return self._locks.setdefault(workspace, threading.Lock())

    def _ask(self, doing: str, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One request to the daemon: unreachable is UNAVAILABLE; refusals stay ApiError."""
        try:
            return self.client.request(method, path, body)
        except OSError as exc:
            raise unreachable(self.client.socket_path, exc, doing) from None

    def healthy(self) -> bool:
        return bool(self._ask("probing the daemon", "GET", "/healthz")["ok"])

    # -- publish ----------------------------------------------------------------------

    def publish(self, volume_id: str, target: Path, readonly: bool, request: VolumeRequest) -> str:
        """Make the workspace appear at `target`; returns how it got there (for the log).
        A repeat of a publish that succeeded succeeds again without a second mount."""
        workspace = request.workspace
        with self._lock(workspace):
            existing = self._claim(volume_id, target, readonly, request)
            mounted_now = False
            try:
                how = self._ensure_mounted(request)
                mounted_now = how != "already mounted"
                if self._ensure_bound(workspace, target, readonly):
                    return "already published"
                return how
            except BaseException:
                if existing is None:  # undo only what this call did; a retry starts clean
                    self._roll_back(volume_id, workspace, unmount=mounted_now)
                raise

    def publish_awaiting(self, volume_id: str, target: Path, readonly: bool, awaiting: AwaitingClaim) -> str:
        """Record a bindAtClaim volume and make its target directory, mounting nothing."""
        with self._lock(_volume_key(volume_id)), self._table:
            existing = self.records.get(volume_id)
            if existing is not None:
                if existing.target_path != str(target) or existing.readonly != readonly:
                    raise CsiError(
                        Code.ALREADY_EXISTS,
                        f"volume {volume_id} is already published at {existing.target_path} "
                        f"{_access(existing.readonly)}: unpublish it before changing it",
                    )
                return "already published" if existing.awaiting else "already bound"
            target.mkdir(mode=0o750, parents=True, exist_ok=True)
            self.records.save(
                Publication(
                    volume_id,
                    "",
                    str(target),
                    readonly,
                    f"{awaiting.pod_namespace}/{awaiting.pod_name}",
                    awaiting.pod_uid,
                )
            )
        return "awaiting its claim"

    def bind(self, request: VolumeRequest, container_id: str | None = None) -> str:
        """Name the workspace of the bindAtClaim volume of pod `request.pod_uid` and mount it
        at that volume's target, or with `container_id` at /workspace of that running
        container's root file system (rootfs.py); returns how it got there. A repeat with the
        same workspace succeeds again; another workspace is refused (a claimed pod takes one)."""
        found = [r for r in self.records.all() if r.pod_uid == request.pod_uid and request.pod_uid]
        if not found:
            raise CsiError(
                Code.NOT_FOUND,
                f"no volume of pod {request.pod_uid} is published on this node: bind on the node the pod "
                "runs on, once it is running",
            )
        if len(found) > 1:
            raise CsiError(
                Code.FAILED_PRECONDITION,
                f"pod {request.pod_uid} has {len(found)} volumes of this driver: a bind needs exactly one",
            )
        volume_id = found[0].volume_id
        with self._lock(_volume_key(volume_id)):
            record = self.records.get(volume_id)
            if record is None:
                raise CsiError(Code.NOT_FOUND, f"pod {request.pod_uid}'s volume was unpublished meanwhile")
            if not record.awaiting:
                if record.workspace == request.workspace:
                    return "already bound"
                raise CsiError(
                    Code.ALREADY_EXISTS,
                    f"pod {record.pod}'s volume is bound to workspace {record.workspace}, not "
                    f"{request.workspace}: a claimed pod takes one workspace",
                )
            target = Path(record.target_path)
            if container_id is not None:
                target = rootfs.target(self.runtime_state, container_id, request.pod_uid)
            return self._bind(record, request, target)

    def _bind(self, record: Publication, request: VolumeRequest, target: Path) -> str:
        workspace = request.workspace
        began = time.monotonic()
        with self._lock(workspace):
            with self._table:
                for other in self.records.all():
                    if other.workspace == workspace:
                        raise CsiError(
                            Code.FAILED_PRECONDITION,
                            f"workspace {workspace} is already published on this node for pod {other.pod}: "
                            "a workspace has one writer; bind a new workspace id",
                        )
                elsewhere = str(target) if str(target) != record.target_path else ""
                self.records.save(replace(record, workspace=workspace, bound_at=elsewhere))
            mounted_now = False
            try:
                recorded = time.monotonic()
                how = self._ensure_mounted(request)
                mounted_now = how != "already mounted"
                mounted = time.monotonic()
                self._ensure_bound(workspace, target, record.readonly)
                log.info(
                    "bind steps",
                    extra={
                        "fields": {
                            "workspace": workspace,
                            "record_ms": round((recorded - began) * 1000),
                            "mount_ms": round((mounted - recorded) * 1000),
                            "bind_ms": round((time.monotonic() - mounted) * 1000),
                        }
                    },
                )
                return how
            except BaseException:
                self._roll_back(record.volume_id, workspace, unmount=mounted_now, keep=record)
                raise

    def _claim(
        self, volume_id: str, target: Path, readonly: bool, request: VolumeRequest
    ) -> Publication | None:
        """Record the publication before anything is mounted (so an unpublish after a crash
        knows the workspace), or return the record of the same publication made earlier."""
        workspace = request.workspace
        with self._table:
            existing = self.records.get(volume_id)
            if existing is not None:
                if existing.workspace != workspace or existing.readonly != readonly:
                    raise CsiError(
                        Code.ALREADY_EXISTS,
                        f"volume {volume_id} is already published as workspace {existing.workspace} "
                        f"{_access(existing.readonly)}, not {workspace} {_access(readonly)}: "
                        "unpublish it before changing it",
                    )
                if existing.target_path != str(target):
                    raise CsiError(
                        Code.FAILED_PRECONDITION,
                        f"volume {volume_id} is already published at {existing.target_path}: a workspace "
                        "has one writer; unpublish it there first",
                    )
                return existing
            for other in self.records.all():
                if other.workspace == workspace:
                    raise CsiError(
                        Code.FAILED_PRECONDITION,
                        f"workspace {workspace} is already published on this node for pod {other.pod} "
                        f"(volume {other.volume_id}): a workspace has one writer; delete that pod first, "
                        f"or give this pod a new workspace with forkOf: {workspace}",
                    )
            self.records.save(
                Publication(
                    volume_id,
                    workspace,
                    str(target),
                    readonly,
                    f"{request.pod_namespace}/{request.pod_name}",
                    request.pod_uid,
                )
            )
            return None

    def _ensure_mounted(self, request: VolumeRequest) -> str:
        """The workspace mounted by the daemon at its staging directory."""
        workspace, staging = request.workspace, self.staging(request.workspace)
        attached = self._ask("reading the daemon's stats", "GET", "/v1/stats")["workspaces"].get(workspace)
        if attached and attached.get("target"):
            if Path(attached["target"]) == staging:
                return "already mounted"
            raise CsiError(
                Code.FAILED_PRECONDITION,
                f"workspace {workspace} is mounted at {attached['target']} on this node outside the CSI "
                "plugin: a workspace has one writer; unmount it there first "
                f"(warren-blockd unmount {workspace})",
            )
        doing = f"mounting workspace {workspace}"
        # A fork's child is new but for a retry: it is forked first (one that exists already
        # is kept as it is), without a restore's reads that would find nothing.
        if not request.fork_of:
            try:  # restore is mount: the newest manifest plus the log tail, chunks faulted in on read
                restored = self._ask(
                    doing, "POST", f"/v1/workspaces/{workspace}/restore", {"target": str(staging)}
                )
                log.info(
                    "restored",
                    extra={
                        "fields": {
                            "workspace": workspace,
                            "log_seq": restored.get("log_seq"),
                            "restore_ms": restored.get("restore_ms"),
                        }
                    },
                )
                return "restored"
            except ApiError as exc:
                if exc.code != "not_found":
                    raise from_api(exc, doing) from None
        how = self._make(request)
        try:
            self._ask(doing, "POST", f"/v1/workspaces/{workspace}/mount", {"target": str(staging)})
        except ApiError as exc:
            raise from_api(exc, doing) from None
        return how

    def _make(self, request: VolumeRequest) -> str:
        """Create the workspace: a fork of forkOf or template by manifest, or empty of `size`.
        Losing a race to another creator of the same id is fine: then it exists."""
        workspace = request.workspace
        if request.source:
            source = request.source
            doing = f"making workspace {workspace} from {source}"
            try:
                if request.fork_of:  # the daemon freezes a source mounted here while it settles
                    body: dict[str, Any] = {"children": [workspace]}
                    if request.siblings is not None:
                        body["siblings"] = request.siblings
                    result = self._ask(doing, "POST", f"/v1/workspaces/{source}/fork", body)
                    error = result["children"][workspace]
                else:
                    self._ask(doing, "POST", "/v1/workspaces", {"id": workspace, "template": source})
                    error = None
            except ApiError as exc:
                if exc.code == "not_found":
                    key = "forkOf" if request.fork_of else "template"
                    raise CsiError(
                        Code.NOT_FOUND,
                        f"{doing}: workspace {source} does not exist in object storage; check {key}, "
                        "or drop it to create an empty workspace",
                    ) from None
                if exc.code != "exists" or "already exists" not in str(exc):
                    raise from_api(exc, doing) from None
                error = None
            if error and "already exists" not in error:
                raise CsiError(Code.UNAVAILABLE, f"{doing}: {error}")
            log.info("made", extra={"fields": {"workspace": workspace, "from": source}})
            return "forked" if request.fork_of else "from template"
        if request.size_bytes is None:
            raise missing_size(workspace)
        doing = f"creating workspace {workspace}"
        try:
            self._ask(doing, "POST", "/v1/workspaces", {"id": workspace, "size_bytes": request.size_bytes})
        except ApiError as exc:
            if exc.code != "exists":
                raise from_api(exc, doing) from None
        log.info("created", extra={"fields": {"workspace": workspace, "size_bytes": request.size_bytes}})
        return "created"

    def _ensure_bound(self, workspace: str, target: Path, readonly: bool) -> bool:
        """Bind the staging mount at `target`; True if it already was."""
        staging = self.staging(workspace)
        source = mounts.mount_at(staging)
        if source is None:
            raise CsiError(
                Code.UNAVAILABLE,
                f"workspace {workspace} should be mounted at {staging} but is not (did warren-blockd "
                "restart?): retry the publish",
            )
        target.mkdir(mode=0o750, parents=True, exist_ok=True)
        current = mounts.mount_at(target)
        if current is not None:
            if (current.device, current.root) != (source.device, source.root):
                raise CsiError(
                    Code.FAILED_PRECONDITION,
                    f"{target} already has {current.source} ({current.fstype}) mounted: "
                    "unmount it; the target path must be free",
                )
            if current.readonly != readonly:
                raise CsiError(
                    Code.ALREADY_EXISTS,
                    f"{target} already has workspace {workspace} mounted {_access(current.readonly)}: "
                    "unpublish it before changing that",
                )
            return True
        try:
            mounts.bind(staging, target, readonly=readonly)
        except mounts.MountError as exc:
            raise CsiError(Code.INTERNAL, f"binding workspace {workspace} at {target}: {exc}") from None
        return False

    def _roll_back(
        self, volume_id: str, workspace: str, *, unmount: bool, keep: Publication | None = None
    ) -> None:
        """Undo a publish (or a bind: `keep` is the record to go back to)."""
        try:
            if unmount:
                self._ask(
                    "rolling back",
                    "POST",
                    f"/v1/workspaces/{workspace}/unmount",
                    {"wait_replicated": self.replicate_wait},
                )
                self.staging(workspace).rmdir()
        except Exception as exc:  # the publish's own error is the one to report
            log.warning(
                "roll back after a failed publish was incomplete",
                extra={"fields": {"workspace": workspace, "error": str(exc)}},
            )
        finally:
            if keep is not None:
                self.records.save(keep)
            else:
                self.records.delete(volume_id)

    # -- unpublish --------------------------------------------------------------------

    def unpublish(self, volume_id: str, target: Path) -> dict[str, Any] | None:
        """Flush, unbind, unmount and detach; returns the daemon's last receipt (None if it had
        nothing attached). Unpublishing what is not published succeeds."""
        record = self.records.get(volume_id)
        if record is None or record.target_path != str(target):
            self._clear_unrecorded(volume_id, target, record)
            return None
        if record.awaiting:
            with self._lock(_volume_key(volume_id)):
                record = self.records.get(volume_id)
                if record is not None and record.awaiting:  # never bound: nothing mounted
                    _remove_dir(target)
                    self.records.delete(volume_id)
                    log.info("unpublished", extra={"fields": {"volume": volume_id, "pod": record.pod}})
                    return None
            return self.unpublish(volume_id, target)  # bound meanwhile
        workspace = record.workspace
        with self._lock(workspace):
            started = time.monotonic()
            flushed = self._flush(workspace)
            # A bind into a container's root file system is normally gone by now (the
            # runtime's shim unmounts beneath the root file system as the container goes).
            if record.bound_at:
                self._unbind(Path(record.bound_at), self.staging(workspace))
            if mounts.mount_at(target) is not None:
                try:
                    mounts.unmount(target)
                except mounts.MountError as exc:
                    raise CsiError(
                        Code.INTERNAL,
                        f"unmounting {target}: {exc}; is a process outside the pod still using it?",
                    ) from None
            _remove_dir(target)
            left = max(5.0, self.replicate_wait - (time.monotonic() - started))
            final = self._detach(workspace, left) or flushed
            _remove_dir(self.staging(workspace))
            self.records.delete(volume_id)
        fields: dict[str, Any] = {"volume": volume_id, "workspace": workspace, "pod": record.pod}
        if final:
            fields.update(receipt=final["level"], seq=final["seq"])
        log.info("unpublished", extra={"fields": fields})
        return final

    @staticmethod
    def _unbind(bound: Path, staging: Path) -> None:
        """Take down the workspace's bind at `bound` if it is still there (and is ours)."""
        here, ours = mounts.mount_at(bound), mounts.mount_at(staging)
        if here is None or ours is None or (here.device, here.root) != (ours.device, ours.root):
            return
        try:
            mounts.unmount(bound)
        except mounts.MountError as exc:
            raise CsiError(
                Code.INTERNAL, f"unmounting {bound}: {exc}; does the pod's container still run?"
            ) from None

    def _flush(self, workspace: str) -> dict[str, Any] | None:
        """Flush and wait for `replicated` up to the bound. A `local` receipt still lets the
        unpublish go on: the daemon's spool on node disk keeps replaying it to storage."""
        doing = f"flushing workspace {workspace}"
        wait = self.replicate_wait
        try:
            receipt: dict[str, Any] = self._ask(
                doing, "POST", f"/v1/workspaces/{workspace}/flush", {"wait_replicated": wait}
            )
        except ApiError as exc:
            if exc.code == "not_attached":
                log.warning(
                    "flush: the daemon has nothing attached (did it restart?); its spool replays at the "
                    "next attach",
                    extra={"fields": {"workspace": workspace}},
                )
            else:
                log.error(
                    "flush failed; unpublishing anyway",
                    extra={"fields": {"workspace": workspace, "error": str(exc)}},
                )
            return None
        fields = {"workspace": workspace, "receipt": receipt["level"], "seq": receipt["seq"]}
        if receipt["level"] == "replicated":
            log.info("flushed", extra={"fields": fields})
        else:
            log.warning(
                f"not replicated within {wait:g}s; unpublishing anyway: the writes are on node disk "
                "and the daemon's spool replays them to storage",
                extra={"fields": fields},
            )
        return receipt

    def _detach(self, workspace: str, wait: float) -> dict[str, Any] | None:
        doing = f"unmounting workspace {workspace} in the daemon"
        try:
            receipt: dict[str, Any] = self._ask(
                doing, "POST", f"/v1/workspaces/{workspace}/unmount", {"wait_replicated": wait}
            )
        except ApiError as exc:
            if exc.code == "not_attached":
                return None
            raise from_api(exc, doing) from None
        if receipt["level"] != "replicated":
            log.warning(
                f"detached with a local receipt after {wait:g}s: the daemon keeps replicating its spool",
                extra={"fields": {"workspace": workspace, "seq": receipt["seq"]}},
            )
        return receipt

    def _clear_unrecorded(self, volume_id: str, target: Path, record: Publication | None) -> None:
        if record is not None:  # this volume is published, but elsewhere: nothing to do here
            log.warning(
                "unpublish of a path this volume is not published at",
                extra={
                    "fields": {"volume": volume_id, "target": str(target), "published": record.target_path}
                },
            )
            return
        if mounts.mount_at(target) is not None:  # kubelet names only its paths of our volumes
            fields = {"volume": volume_id, "target": str(target)}
            log.warning("unmounting a target with no record", extra={"fields": fields})
            try:
                mounts.unmount(target)
            except mounts.MountError as exc:
                raise CsiError(Code.INTERNAL, f"unmounting {target}: {exc}") from None
        _remove_dir(target)


def _volume_key(volume_id: str) -> str:
    """A volume's own lock (a bind against its unpublish), apart from the workspaces' locks."""
    return f"volume/{volume_id}"


def _access(readonly: bool) -> str:
    return "read-only" if readonly else "read-write"


def _remove_dir(path: Path) -> None:
    """The SP removes the directory it created at the target path (CSI spec); an empty one only."""
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not remove a directory", extra={"fields": {"path": str(path), "error": str(exc)}})
