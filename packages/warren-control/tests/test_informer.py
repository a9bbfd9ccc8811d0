"""The stores and the queue the controller's passes read from: a store keeps each object as
the last event left it and forgets only the incarnation that was deleted; a relist says what
is gone; a burst of work for one key runs once, with the latest item."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from warren_common.testing import wait_for
from warren_control.informer import CoalescingQueue, Informer, Later, Store
from warren_control.kube import Obj


def pod(name: str, uid: str, namespace: str = "ns", **labels: str) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": labels}}


def test_a_deleted_event_of_an_older_incarnation_keeps_the_newer() -> None:
    store = Store()
    store.apply("ADDED", pod("p", "new"))
    store.apply("DELETED", pod("p", "old"))
    assert store.get("ns", "p") == pod("p", "new")
    store.apply("DELETED", pod("p", "new"))
    assert store.get("ns", "p") is None


def test_a_relist_replaces_one_namespace_and_names_what_is_gone() -> None:
    store = Store()
    assert not store.synced("ns")
    store.apply("ADDED", pod("kept", "1"))
    store.apply("ADDED", pod("gone", "2"))
    store.apply("ADDED", pod("other", "3", namespace="elsewhere"))
    gone = store.replace("ns", [pod("kept", "1"), pod("new", "4")])
    assert gone == [pod("gone", "2")]
    assert store.synced("ns") and not store.synced("elsewhere")
    assert {p["metadata"]["name"] for p in store.select("ns", {})} == {"kept", "new"}
    assert store.get("elsewhere", "other") is not None


def test_select_matches_every_label() -> None:
    store = Store()
    store.replace("ns", [pod("a", "1", ws="w1", x="y"), pod("b", "2", ws="w2"), pod("c", "3")])
    assert [p["metadata"]["name"] for p in store.select("ns", {"ws": "w1"})] == ["a"]
    assert store.select("ns", {"ws": "w1", "x": "z"}) == []


def test_a_key_put_again_before_its_run_runs_once_with_the_latest_item() -> None:
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def work(item: str) -> None:
        if item == "block":
            started.set()
            release.wait(10)
        ran.append(item)

    queue: CoalescingQueue[str, str] = CoalescingQueue(1, work, "test")
    queue.put("blocker", "block")
    started.wait(10)
    for n in range(5):  # the one worker is busy: these wait, and fold into one
        queue.put("k", f"v{n}")
    release.set()
    wait_for(lambda: len(ran) == 2, 10, "both runs")
    queue.shutdown()
    assert ran == ["block", "v4"]


def test_a_key_put_while_it_runs_runs_again_after_it_never_beside_it() -> None:
    started, release = threading.Event(), threading.Event()
    running, most, ran = [0], [0], []
    guard = threading.Lock()

    def work(item: str) -> None:
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        if item == "first":
            started.set()
            release.wait(10)
        with guard:
            running[0] -= 1
            ran.append(item)

    queue: CoalescingQueue[str, str] = CoalescingQueue(4, work, "test")  # threads to spare
    queue.put("k", "first")
    started.wait(10)
    queue.put("k", "second")
    queue.put("k", "third")  # folds into the second, which waits for the first
    time.sleep(0.1)
    assert ran == [] and most == [1]
    release.set()
    wait_for(lambda: len(ran) == 2, 10, "the run after")
    queue.shutdown()
    assert ran == ["first", "third"]
    assert most == [1]


def test_a_failing_run_does_not_stop_the_queue() -> None:
    ran: list[str] = []

    def work(item: str) -> None:
        if item == "bad":
            raise RuntimeError("the API server is away")
        ran.append(item)

    queue: CoalescingQueue[str, str] = CoalescingQueue(1, work, "test")
    queue.put("a", "bad")
    queue.put("b", "good")
    wait_for(lambda: ran == ["good"], 10, "the next item")
    queue.shutdown()


def test_the_index_follows_label_changes_and_deletes() -> None:
    store = Store(index="owner")
    store.apply("ADDED", pod("a", "1", owner="x"))
    store.apply("ADDED", pod("b", "2", owner="x"))
    assert {o["metadata"]["name"] for o in store.indexed("ns", "x")} == {"a", "b"}
    store.apply("MODIFIED", pod("a", "1", owner="y"))  # relabelled: moves
    assert [o["metadata"]["name"] for o in store.indexed("ns", "y")] == ["a"]
    assert [o["metadata"]["name"] for o in store.indexed("ns", "x")] == ["b"]
    store.apply("DELETED", pod("b", "2", owner="x"))
    assert store.indexed("ns", "x") == []
    store.replace("ns", [pod("c", "3", owner="y")])
    assert [o["metadata"]["name"] for o in store.indexed("ns", "y")] == ["c"]


def test_a_put_after_shutdown_is_ignored() -> None:
    done: list[int] = []
    queue: CoalescingQueue[str, int] = CoalescingQueue(1, done.append, "test")
    queue.shutdown()
    queue.put("late", 1)  # a watch still delivering while the controller stops
    assert done == []


def test_later_hands_each_item_over_once_its_delay_has_passed_in_due_order() -> None:
    handed: list[str] = []
    later: Later[str] = Later(handed.append)
    stop = threading.Event()
    thread = threading.Thread(target=later.run, args=(stop,), daemon=True)
    thread.start()
    later.put(0.4, "second")
    later.put(0.1, "first")
    later.put(60, "never")  # still waiting when stopped: dropped
    wait_for(lambda: len(handed) == 2, 10, "both due items")
    stop.set()
    thread.join(timeout=5)
    assert handed == ["first", "second"]
    assert not thread.is_alive()


class BlockingWatch:
    """A watch that sends nothing until its response is shut down, as a quiet collection's
    does until the server's timeout."""

    def __init__(self) -> None:
        self.ended = threading.Event()

    def shutdown(self) -> None:
        self.ended.set()

    def list_with_version(self, path: str, query: dict[str, str]) -> tuple[list[Obj], str]:
        return [], "1"

    def watch(
        self,
        path: str,
        version: str,
        *,
        query: dict[str, str],
        timeout_s: int,
        opened: Callable[[Any], object],
    ) -> Iterator[Obj]:
        opened(self)
        self.ended.wait()
        raise OSError("the watch's connection was shut down")
        yield {}  # a generator, as Kube.watch is


def test_a_stop_ends_a_quiet_watch_at_once() -> None:
    kube = BlockingWatch()
    informer = Informer(kube, "/api/v1/nodes", on_replace=lambda _items: None, on_event=lambda _t, _o: None)  # type: ignore[arg-type]
    stop = threading.Event()
    thread = informer.start(stop, "quiet")
    assert informer.synced.wait(10)
    stop.set()
    thread.join(timeout=30)  # the server would end this watch only after 300 s
    assert not thread.is_alive() and kube.ended.is_set()
