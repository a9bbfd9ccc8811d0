"""Collections kept in memory by list and watch, and the queue that turns their changes into
work: what the status mirror and the controller read instead of asking the API server again.

`Informer` lists a collection, then watches it from the list's resourceVersion and relists
when the server says that version is too old. A watch's events arrive in the order the
server made the changes, so a `Store` fed only from one informer never goes back in time:
it holds each object as the latest event left it. A relist replaces everything, which is
how an object deleted while no watch ran leaves the store.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any, Generic, TypeVar

import urllib3

from warren_control.kube import ApiException, Kube, Obj

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class Informer:
    """One collection kept current: list, then watch from there; relist when the server
    says the version is too old. `on_replace` gets the whole collection after each list,
    `on_event` each change (type and object), both on the informer's thread."""

    def __init__(
        self,
        kube: Kube,
        path: str,
        *,
        query: dict[str, str] | None = None,
        on_replace: Callable[[list[Obj]], None],
        on_event: Callable[[str, Obj], None],
        watch_timeout_s: int = 300,
        retry_seconds: float = 2.0,
    ) -> None:
        self.kube = kube
        self.path = path
        self.query = query or {}
        self.on_replace = on_replace
        self.on_event = on_event
        self.watch_timeout_s = watch_timeout_s
        self.retry_seconds = retry_seconds
        self.synced = threading.Event()
        self._open: Any = None  # the watch's response while one is open

    def run(self, stop: threading.Event) -> None:
        threading.Thread(target=self._end_on, args=(stop,), name=f"{self.path}-stop", daemon=True).start()
        while not stop.is_set():
            try:
                items, version = self.kube.list_with_version(self.path, self.query)
                self.on_replace(items)
                self.synced.set()
                while not stop.is_set():
                    resumed = self._watch(version, stop)
                    if resumed is None:
                        break  # too old: relist
                    version = resumed
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
                log.warning("watching %s failed, relisting: %s", self.path, exc)
                stop.wait(self.retry_seconds)

    def _end_on(self, stop: threading.Event) -> None:
        """Once `stop` is set, end the open watch's wait for its next event: a stop takes
        effect at once, not when the server next sends something (up to its timeout)."""
        stop.wait()
        response = self._open
        if response is not None:
            response.shutdown()

    def _opened(self, response: Any) -> None:
        self._open = response

    def _watch(self, version: str, stop: threading.Event) -> str | None:
        """Watch until the server ends it; the version to resume from, None to relist."""
        events = self.kube.watch(
            self.path, version, query=self.query, timeout_s=self.watch_timeout_s, opened=self._opened
        )
        for event in events:
            kind = str(event.get("type") or "")
            obj = event.get("object") or {}
            if kind == "ERROR":
                code = obj.get("code")
                if code != HTTPStatus.GONE:
                    log.warning("watch of %s: %s", self.path, obj.get("message"))
                return None
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
            if kind != "BOOKMARK":
                self.on_event(kind, obj)
            if stop.is_set():
                break
        return version

    def start(self, stop: threading.Event, name: str) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(stop,), name=name, daemon=True)
        thread.start()
        return thread


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta["name"])


class Store:
    """Objects by namespace and name as their watch events left them. Shared, not copied:
    readers must not change what they get. `synced(namespace)` says whether a list of that
    namespace has arrived: only then does a miss mean the object does not exist. With an
    `index` label, `indexed` finds the objects carrying one value of it without a scan."""

    def __init__(self, index: str | None = None) -> None:
        self._lock = threading.Lock()
        self._items: dict[tuple[str, str], Obj] = {}
        self._synced: set[str] = set()
        self._index_label = index
        self._index: dict[tuple[str, str], set[tuple[str, str]]] = {}

    def _indexed_value(self, obj: Obj) -> str | None:
        if self._index_label is None:
            return None
        return ((obj.get("metadata") or {}).get("labels") or {}).get(self._index_label)

    def _put(self, key: tuple[str, str], obj: Obj | None) -> None:
        """Hold `obj` under `key` (None: nothing), keeping the index with it. Lock held."""
        held = self._items.pop(key, None)
        if held is not None and (value := self._indexed_value(held)) is not None:
            keys = self._index.get((key[0], value))
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._index[(key[0], value)]
        if obj is not None:
            self._items[key] = obj
            if (value := self._indexed_value(obj)) is not None:
                self._index.setdefault((key[0], value), set()).add(key)

    def apply(self, kind: str, obj: Obj) -> None:
        key = _key(obj)
        with self._lock:
            if kind == "DELETED":
                # Only that incarnation: a newer object of the same name stays.
                held = self._items.get(key)
                if held is not None and held["metadata"].get("uid") == obj["metadata"].get("uid"):
                    self._put(key, None)
            else:
                self._put(key, obj)

    def replace(self, namespace: str, items: Iterable[Obj]) -> list[Obj]:
        """The namespace's whole collection, from a list; the objects it no longer holds."""
        fresh = {_key(obj): obj for obj in items}
        with self._lock:
            gone = [obj for key, obj in self._items.items() if key[0] == namespace and key not in fresh]
            for key in [key for key in self._items if key[0] == namespace]:
                self._put(key, None)
            for key, obj in fresh.items():
                self._put(key, obj)
            self._synced.add(namespace)
        return gone

    def get(self, namespace: str, name: str) -> Obj | None:
        with self._lock:
            return self._items.get((namespace, name))

    def indexed(self, namespace: str, value: str) -> list[Obj]:
        """The namespace's objects whose index label has this value."""
        with self._lock:
            return [self._items[key] for key in self._index.get((namespace, value), ())]

    def select(self, namespace: str, labels: dict[str, str]) -> list[Obj]:
        """The namespace's objects that carry every one of `labels`."""
        with self._lock:
            held = [obj for key, obj in self._items.items() if key[0] == namespace]
        return [
            obj
            for obj in held
            if all(((obj["metadata"].get("labels") or {}).get(k)) == v for k, v in labels.items())
        ]

    def all(self) -> list[Obj]:
        """Every object held, of every namespace."""
        with self._lock:
            return list(self._items.values())

    def synced(self, namespace: str) -> bool:
        with self._lock:
            return namespace in self._synced

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


class CoalescingQueue(Generic[K, T]):
    """Work per key on a pool of threads. A key put again before its run starts runs once,
    with the latest item: a burst of events of one object is one pass, not a queue of stale
    ones. A key put while its run is under way runs again after it, never beside it: a
    second run would only wait for the first one's locks, holding a thread meanwhile."""

    def __init__(self, workers: int, work: Callable[[T], object], name: str) -> None:
        self._work = work
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._pending: dict[K, T] = {}
        self._running: set[K] = set()
        self._closed = False

    def put(self, key: K, item: T) -> None:
        with self._lock:
            if self._closed:  # shutting down: a watch or timer still delivering is ignored
                return
            queued = key in self._pending
            self._pending[key] = item
            if not queued and key not in self._running:  # under the lock: no shutdown between
                self._pool.submit(self._run, key)

    def _run(self, key: K) -> None:
        with self._lock:
            item = self._pending.pop(key)
            self._running.add(key)
        try:
            self._work(item)
        except Exception:  # the API server away, say: the next event or the resync tries again
            log.exception("handling %s failed", key)
        finally:
            with self._lock:
                self._running.discard(key)
                if key in self._pending and not self._closed:  # put while it ran
                    self._pool.submit(self._run, key)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)


class Later(Generic[T]):
    """Items handed to `then` once their delay has passed, all on the one thread that runs
    `run`: a delayed pass for each of thousands of new objects costs no thread of its own."""

    def __init__(self, then: Callable[[T], object]) -> None:
        self._then = then
        self._due: list[tuple[float, int, T]] = []
        self._order = itertools.count()  # equal times never compare the items
        self._changed = threading.Condition()

    def put(self, delay: float, item: T) -> None:
        with self._changed:
            heapq.heappush(self._due, (time.monotonic() + delay, next(self._order), item))
            self._changed.notify()

    def run(self, stop: threading.Event) -> None:
        """Hand over each item when due, until `stop` is set (what is still waiting then
        is dropped: the resync covers it)."""
        while not stop.is_set():
            with self._changed:
                wait = self._due[0][0] - time.monotonic() if self._due else 1.0
                if wait > 0:
                    self._changed.wait(min(wait, 1.0))  # wakes for `stop` at least each second
                    continue
                _, _, item = heapq.heappop(self._due)
            try:
                self._then(item)
            except Exception:
                log.exception("a delayed item failed")
