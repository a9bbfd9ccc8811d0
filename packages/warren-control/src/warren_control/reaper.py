"""The reaper: sandboxes nobody uses any more go away.

- Past its hard lifetime (`expires_at`, fixed at creation: the organization's maximum, 7 days
  by default, or less on request) a sandbox is deleted, persistent or not.
- Past its idle deadline (last activity plus its idle timeout, 24 hours by default; exec,
  files, keep-alive and start are activity) a sandbox does what it was created with
  (`on_idle`): deleted (the default), stopped (the default for a persistent one: its pod
  goes, its workspace stays) or paused (stopped with its memory captured: the next exec,
  file call or start resumes it); a stopped or paused sandbox's idle timer waits until it
  runs again. An abandoned sandbox still dies at its lifetime.

- A deleted sandbox's workspace is kept in object storage for the retention period (7 days by
  default: a new sandbox may still start from it, as a template), then released: its
  manifests and write records are removed (what a fork still stands on stays for the fork),
  and now and then the chunks nothing references any more are collected.

Each action goes to the cluster first and to the record second, and both are idempotent: a
reaper that crashes in between finds the same sandbox due on its next sweep and finishes.
Several reapers may run; they only repeat each other's idempotent calls.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from warren_control import store
from warren_control.api.cluster import Cluster
from warren_control.api.errors import ClusterError
from warren_control.models import Sandbox, SandboxPhase, utcnow
from warren_control.workspaces import DEFAULT_RETENTION_S, WorkspaceStore, WorkspaceStoreError

log = logging.getLogger(__name__)

Action = Literal["delete", "stop", "pause"]
Reason = Literal["lifetime", "idle"]


@dataclass(frozen=True)
class ReaperOptions:
    interval_s: float = 5.0
    batch: int = 100
    workspace_retention_s: float = DEFAULT_RETENTION_S
    collect_interval_s: float = 3600.0  # between chunk collections (each lists the whole store)


@dataclass(frozen=True)
class Due:
    sandbox_id: str
    object_name: str
    action: Action
    reason: Reason


def verdict(record: Sandbox, now: datetime) -> tuple[Action, Reason] | None:
    """What the reaper does to this sandbox now, if anything."""
    if record.phase in {SandboxPhase.DELETED, SandboxPhase.TERMINATING}:
        return None
    if record.expires_at <= now:
        # E2B's autoPause: the end of the timeout pauses (or stops) a running sandbox, which
        # then lives until its organization's longest lifetime (hard_end).
        on_end = _ON_IDLE.get(str(record.spec.get("on_end")))
        if on_end and on_end != "delete" and not record.spec.get("stopped") and now < hard_end(record):
            return on_end, "lifetime"
        return "delete", "lifetime"
    if record.idle_deadline_at is not None and record.idle_deadline_at <= now:
        default: Action = "stop" if record.spec.get("persistent") else "delete"
        return _ON_IDLE.get(str(record.spec.get("on_idle")), default), "idle"
    return None


def hard_end(record: Sandbox) -> datetime:
    """When a sandbox whose timeout pauses it dies after all: its creation plus its
    organization's longest lifetime, as it was at the creation."""
    return record.created_at + timedelta(seconds=int(record.spec.get("lifetime_cap_s") or 0))


_MESSAGES = {
    ("delete", "lifetime"): "deleted by the reaper: the sandbox reached its maximum lifetime",
    ("delete", "idle"): "deleted by the reaper: the sandbox was idle past its idle timeout",
    ("stop", "idle"): "stopped by the reaper: idle past its idle timeout (the workspace stays)",
    ("pause", "idle"): "paused by the reaper: idle past its idle timeout (memory and workspace kept; "
    "the next exec, file call or start resumes it)",
    ("pause", "lifetime"): "paused by the reaper at the end of its timeout (memory and workspace kept)",
    ("stop", "lifetime"): "stopped by the reaper at the end of its timeout (the workspace stays)",
}


_ON_IDLE: dict[str, Action] = {"delete": "delete", "stop": "stop", "pause": "pause"}
_STOPS: dict[Action, dict[str, bool]] = {
    "stop": {"stopped": True, "memoryCapture": False},
    "pause": {"stopped": True, "memoryCapture": True},
}


class Reaper:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        cluster: Cluster,
        options: ReaperOptions | None = None,
        workspaces: WorkspaceStore | None = None,
    ) -> None:
        self.sessions = sessions
        self.cluster = cluster
        self.options = options or ReaperOptions()
        self.workspaces = workspaces
        self.reaped: list[Due] = []  # what this reaper did, oldest first (tests, logs)
        self.released: list[str] = []  # workspaces this reaper released, oldest first
        self.collected: list[dict[str, Any]] = []  # the collections' reports
        self._last_collect: datetime | None = None

    def due(self, now: datetime) -> list[Due]:
        with self.sessions() as session:
            records = session.scalars(
                select(Sandbox)
                .where(
                    Sandbox.phase.not_in([SandboxPhase.DELETED, SandboxPhase.TERMINATING]),
                    or_(Sandbox.expires_at <= now, Sandbox.idle_deadline_at <= now),
                )
                .order_by(Sandbox.expires_at)
                .limit(self.options.batch)
            ).all()
            found = []
            for record in records:
                decided = verdict(record, now)
                if decided is not None:
                    found.append(Due(record.id, record.object_name, *decided))
            return found

    def reap(self, due: Due, now: datetime) -> bool:
        """Carry out one verdict; False if the cluster could not be reached (next sweep)."""
        try:
            if due.action == "delete":
                self.cluster.delete(due.object_name)
            elif self.cluster.patch(due.object_name, {"spec": _STOPS[due.action]}) is None:
                log.info("%s has no resource to stop; the mirror retires its record", due.sandbox_id)
        except ClusterError as exc:
            log.warning("reaping %s failed, retrying next sweep: %s", due.sandbox_id, exc)
            return False
        with self.sessions.begin() as session:
            record = session.get(Sandbox, due.sandbox_id)
            if record is None or verdict(record, now) != (due.action, due.reason):
                return True  # kept alive or deleted meanwhile: the cluster call was harmless
            condition = {
                "type": "Reaped",
                "status": "True",
                "reason": "MaxLifetime" if due.reason == "lifetime" else "IdleTimeout",
                "message": _MESSAGES[(due.action, due.reason)],
                "last_transition_time": now.isoformat(),
            }
            others = [c for c in record.conditions or [] if c.get("type") != "Reaped"]
            if due.action == "delete":
                store.begin_delete(session, record, conditions=[*others, condition])
            else:
                record.spec = {**record.spec, "stopped": True}
                record.idle_deadline_at = None  # paused until a start
                if due.reason == "lifetime":
                    record.expires_at = hard_end(record)
                record.conditions = [*others, condition]
        log.info("reaped %s: %s (%s)", due.sandbox_id, due.action, due.reason)
        self.reaped.append(due)
        return True

    def sweep(self, now: datetime | None = None) -> int:
        """Reap everything due, then release the workspaces past their retention (and now
        and then collect chunks); how many sandboxes were reaped."""
        now = now or utcnow()
        done = 0
        while True:
            batch = self.due(now)
            results = [self.reap(due, now) for due in batch]
            done += sum(results)
            if len(batch) < self.options.batch or not all(results):
                break
        if self.workspaces is not None:
            released = self.release_workspaces(self.workspaces, now)
            since = None if self._last_collect is None else (now - self._last_collect).total_seconds()
            if released or since is None or since >= self.options.collect_interval_s:
                self.collect(self.workspaces, now)
        return done

    def retained(self, now: datetime) -> list[tuple[str, str]]:
        """(sandbox id, workspace id) of deleted sandboxes whose retention has passed."""
        cutoff = now - timedelta(seconds=self.options.workspace_retention_s)
        with self.sessions() as session:
            rows = session.execute(
                select(Sandbox.id, Sandbox.workspace_id)
                .where(
                    Sandbox.deleted_at.is_not(None),
                    Sandbox.deleted_at <= cutoff,
                    Sandbox.workspace_id.is_not(None),
                    Sandbox.workspace_released_at.is_(None),
                )
                .order_by(Sandbox.deleted_at)
                .limit(self.options.batch)
            ).all()
        return [(row[0], str(row[1])) for row in rows]

    def release_workspaces(self, workspaces: WorkspaceStore, now: datetime) -> int:
        """Storage first, record second: a release cut short is repeated (it is idempotent)."""
        released = 0
        for sandbox_id, workspace_id in self.retained(now):
            try:
                workspaces.release(workspace_id)
            except WorkspaceStoreError as exc:
                log.warning("releasing workspace %s failed, retrying next sweep: %s", workspace_id, exc)
                break
            with self.sessions.begin() as session:
                record = session.get(Sandbox, sandbox_id)
                if record is not None:
                    record.workspace_released_at = now
            log.info("released workspace %s of %s (retention passed)", workspace_id, sandbox_id)
            self.released.append(workspace_id)
            released += 1
        return released

    def collect(self, workspaces: WorkspaceStore, now: datetime) -> None:
        try:
            report = workspaces.collect()
        except WorkspaceStoreError as exc:
            log.warning("collecting unreferenced chunks failed, retrying later: %s", exc)
            return
        self._last_collect = now
        self.collected.append(report)
        log.info("collected unreferenced chunks: %s", report)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.sweep()
            except Exception:  # the database away, say: try again next interval
                log.exception("the reaper's sweep failed")
            stop.wait(self.options.interval_s)
