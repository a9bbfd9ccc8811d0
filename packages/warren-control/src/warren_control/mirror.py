"""The status mirror: what the cluster shows, converged into the product records.

Two informers (list, then watch from the list's resourceVersion, relist when the watch
expires) keep the sandbox namespace's Sandbox resources and the pods the controller made in
memory. Every change marks its sandbox dirty; a worker converges dirty records in batches
(observation.converge), computing the phase from the pod with the controller's own pure
function, so a reader sees what the pod shows even before the controller has written the
Sandbox status, and the two never disagree for long. After every relist and every
`resync_seconds`, a full pass over the live records also retires records whose resource has
vanished (deleted, or never written because of a crash).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from warren_control.informer import Informer
from warren_control.kube import ApiException, Kube, Obj
from warren_control.models import Sandbox, SandboxPhase
from warren_control.observation import converge, location_of, with_pod
from warren_control.podspec import MANAGED_BY, MANAGED_BY_LABEL, controller_uid, sandbox_pod_name

log = logging.getLogger(__name__)

NODE_TTL_S = 300.0  # node topology labels rarely change: read each node's at most this often


@dataclass(frozen=True)
class MirrorOptions:
    # The safety net under the watches: a full pass over every live record.
    resync_seconds: float = 60.0
    # How long the server keeps one watch open before the informer re-watches.
    watch_timeout_s: int = 300
    # Records converged per transaction when many change at once.
    batch: int = 200
    retry_seconds: float = 2.0


class Mirror:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        kube: Kube,
        namespace: str,
        options: MirrorOptions | None = None,
    ) -> None:
        self.sessions = sessions
        self.kube = kube
        self.namespace = namespace
        self.options = options or MirrorOptions()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._sandboxes: dict[str, Obj] = {}  # by object name
        self._pods: dict[str, Obj] = {}  # by pod name
        self._dirty: set[str] = set()  # object names
        self._full_pass = True
        self._nodes: dict[str, tuple[float, dict[str, str] | None]] = {}  # read at, hint
        self.converged = 0  # records changed, for tests and metrics
        self.sandboxes = Informer(
            kube,
            kube.sandboxes_path(namespace),
            on_replace=self._replace_sandboxes,
            on_event=self._sandbox_event,
            watch_timeout_s=self.options.watch_timeout_s,
            retry_seconds=self.options.retry_seconds,
        )
        self.pods = Informer(
            kube,
            kube.pods_path(namespace),
            query={"labelSelector": f"{MANAGED_BY_LABEL}={MANAGED_BY}"},
            on_replace=self._replace_pods,
            on_event=self._pod_event,
            watch_timeout_s=self.options.watch_timeout_s,
            retry_seconds=self.options.retry_seconds,
        )

    # ---- informer callbacks (informer threads)

    def _replace_sandboxes(self, items: list[Obj]) -> None:
        with self._lock:
            self._sandboxes = {o["metadata"]["name"]: o for o in items}
            self._full_pass = True
            self._wake.notify()

    def _sandbox_event(self, kind: str, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        with self._lock:
            if kind == "DELETED":
                self._sandboxes.pop(name, None)
            else:
                self._sandboxes[name] = obj
            self._dirty.add(name)
            self._wake.notify()

    def _replace_pods(self, items: list[Obj]) -> None:
        with self._lock:
            self._pods = {o["metadata"]["name"]: o for o in items}
            self._full_pass = True
            self._wake.notify()

    def _pod_event(self, kind: str, pod: Obj) -> None:
        meta = pod["metadata"]
        owner = next(
            (
                ref
                for ref in meta.get("ownerReferences") or []
                if ref.get("controller") and ref.get("kind") == "Sandbox"
            ),
            None,
        )
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(meta["name"], None)
            else:
                self._pods[meta["name"]] = pod
            if owner is not None:
                self._dirty.add(str(owner["name"]))
                self._wake.notify()

    # ---- converging (the worker thread)

    def observed(self, object_name: str) -> Obj | None:
        """The Sandbox resource as the mirror sees it, its status computed from the pod (or
        its absence) as the controller computes it; None when the cluster holds no such
        resource. Run only once both informers have listed: then a pod missing here is
        missing from the cluster, as of the watch."""
        with self._lock:
            sandbox = self._sandboxes.get(object_name)
            if sandbox is None:
                return None
            uid = str(sandbox["metadata"]["uid"])
            pod = self._pods.get(sandbox_pod_name(sandbox))
        if pod is not None and controller_uid(pod) != uid:
            return sandbox  # a pod of another incarnation: the controller reports on that
        return with_pod(sandbox, pod)

    def location(self, obj: Obj | None) -> dict[str, str] | None:
        """A node-free hint of where the sandbox's pod runs (node labels, read once per node)."""
        if obj is None:
            return None
        with self._lock:
            pod = self._pods.get(sandbox_pod_name(obj))
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        if not node:
            return None
        cached = self._nodes.get(node)
        if cached is not None and time.monotonic() - cached[0] < NODE_TTL_S:
            return cached[1]
        try:
            hint = location_of(self.kube.read_node(node))
        except ApiException as exc:
            # Without permission to read nodes there is simply no hint.
            log.info("no location hint from node labels: %s", exc.reason)
            hint = None
        self._nodes[node] = (time.monotonic(), hint)
        return hint

    def converge_names(self, names: Iterable[str]) -> int:
        """Converge the records of these Sandbox objects; how many changed."""
        changed = 0
        pending = list(names)
        for start in range(0, len(pending), self.options.batch):
            chunk = pending[start : start + self.options.batch]
            with self.sessions.begin() as session:
                records = session.scalars(select(Sandbox).where(Sandbox.object_name.in_(chunk))).all()
                for record in records:
                    changed += self._converge(session, record)
        return changed

    def full_pass(self) -> int:
        """Converge every live record (a record whose resource vanished is retired)."""
        with self.sessions() as session:
            names = list(
                session.scalars(
                    select(Sandbox.object_name).where(Sandbox.phase != SandboxPhase.DELETED)
                ).all()
            )
        return self.converge_names(names)

    def _converge(self, session: Session, record: Sandbox) -> int:
        obj = self.observed(record.object_name)
        return int(converge(session, record, obj, self.namespace, location=self.location(obj)))

    def step(self, timeout: float) -> int:
        """Wait up to `timeout` for changes and converge them; how many records changed."""
        with self._lock:
            if not self._dirty and not self._full_pass:
                self._wake.wait(timeout)
            full, self._full_pass = self._full_pass, False
            dirty, self._dirty = self._dirty, set()
        changed = self.full_pass() if full else self.converge_names(dirty)
        self.converged += changed
        return changed

    def run(self, stop: threading.Event) -> None:
        threads = [
            informer.start(stop, f"mirror-{name}")
            for name, informer in (("sandboxes", self.sandboxes), ("pods", self.pods))
        ]
        next_full = time.monotonic() + self.options.resync_seconds
        while not stop.is_set():
            if not (self.sandboxes.synced.is_set() and self.pods.synced.is_set()):
                stop.wait(0.1)  # a pass on half a picture would retire live records
                continue
            try:
                self.step(min(1.0, max(0.0, next_full - time.monotonic())))
            except Exception:  # the database away, say: keep the picture, try again
                log.exception("converging records failed; retrying")
                with self._lock:
                    self._full_pass = True
                stop.wait(self.options.retry_seconds)
            if time.monotonic() >= next_full:
                with self._lock:
                    self._full_pass = True
                next_full = time.monotonic() + self.options.resync_seconds
        for thread in threads:
            thread.join(timeout=5)
