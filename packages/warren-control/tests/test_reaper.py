"""The reaper against the API's records (SQLite and a real PostgreSQL) and the cluster
stand-in: idle sandboxes are deleted, idle persistent ones stopped with their timer paused,
every sandbox deleted at its hard lifetime; activity pushes the idle deadline; a cluster
that cannot be reached leaves the sandbox for the next sweep."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from api_stack import NAMESPACE, Stack, StandIn, serve_stack, settings_for
from warren_control.api.cluster import Cluster
from warren_control.models import Sandbox, SandboxPhase, utcnow
from warren_control.reaper import Reaper, ReaperOptions, verdict
from warren_control.sdk import WarrenError

pytest_plugins = ["api_fixtures"]

IMAGE = "registry.example/tools/busybox:1.36"
HOUR = 3600


@pytest.fixture
def reaper(stack: Stack, standin: StandIn) -> Iterator[Reaper]:
    yield Reaper(stack.sessions, Cluster(settings_for(stack.url, standin)), ReaperOptions(batch=2))


def record(stack: Stack, sandbox_id: str) -> Sandbox:
    with stack.sessions() as session:
        found = session.get(Sandbox, sandbox_id)
        assert found is not None
        return found


def test_idle_sandboxes_are_deleted_and_persistent_ones_stopped(
    stack: Stack, standin: StandIn, reaper: Reaper
) -> None:
    org = stack.org(may_persist=True, idle_timeout_s=2 * HOUR)
    plain = org.client.create(IMAGE)
    kept = org.client.create(IMAGE, persistent=True)
    busy = org.client.create(IMAGE)
    short = org.client.create(IMAGE, idle_timeout_s=HOUR)

    mine = {plain.id, kept.id, busy.id, short.id}

    def reaped(when: datetime) -> set[str]:
        before = len(reaper.reaped)
        reaper.sweep(when)
        # The module's other tests have sandboxes of their own organizations.
        return {due.sandbox_id for due in reaper.reaped[before:]} & mine

    # Nothing is due yet.
    assert reaped(utcnow()) == set()
    # An hour and a half on: only the sandbox that asked for a one-hour idle timeout.
    assert reaped(utcnow() + timedelta(minutes=90)) == {short.id}
    assert record(stack, short.id).phase is SandboxPhase.TERMINATING
    assert standin.get(stack.object_name(short.id)) is None

    # Activity on `busy` moves its deadline; the others stay idle.
    before = record(stack, busy.id).idle_deadline_at
    assert before is not None
    org.client.keepalive(busy.id)
    after = record(stack, busy.id).idle_deadline_at
    assert after is not None and after > before

    # Just before the kept-alive sandbox's new deadline: past the others' (made earlier).
    later = after - timedelta(microseconds=1)
    assert reaped(later) == {plain.id, kept.id}
    gone = record(stack, plain.id)
    assert gone.phase is SandboxPhase.TERMINATING
    assert [c["reason"] for c in gone.conditions if c["type"] == "Reaped"] == ["IdleTimeout"]
    assert standin.get(stack.object_name(plain.id)) is None
    stopped = record(stack, kept.id)
    assert stopped.phase is not SandboxPhase.TERMINATING
    assert stopped.spec["stopped"] is True
    assert stopped.idle_deadline_at is None  # paused: a stopped persistent sandbox waits
    resource = standin.get(stack.object_name(kept.id))
    assert resource is not None and resource["spec"]["stopped"] is True
    assert record(stack, busy.id).phase is SandboxPhase.PENDING

    # Nothing more is due for the stopped persistent sandbox, however long it waits...
    assert reaped(later + timedelta(days=1)) == {busy.id}  # idle by then
    assert record(stack, kept.id).spec["stopped"] is True
    # ...until its hard lifetime: then it goes, persistent or not.
    assert reaped(stopped.expires_at) == {kept.id}
    assert record(stack, kept.id).phase is SandboxPhase.TERMINATING
    assert standin.get(stack.object_name(kept.id)) is None


def test_starting_a_stopped_sandbox_restarts_its_idle_timer(stack: Stack, reaper: Reaper) -> None:
    org = stack.org(may_persist=True, idle_timeout_s=HOUR)
    box = org.client.create(IMAGE, persistent=True)
    reaper.sweep(utcnow() + timedelta(hours=2))
    assert record(stack, box.id).idle_deadline_at is None
    org.client.start(box.id)
    restarted = record(stack, box.id)
    assert restarted.spec["stopped"] is False
    assert restarted.idle_deadline_at is not None
    assert restarted.idle_deadline_at > utcnow() + timedelta(minutes=59)


def test_the_hard_lifetime_holds_for_persistent_sandboxes_too(stack: Stack, reaper: Reaper) -> None:
    org = stack.org(max_lifetime_s=10 * HOUR, idle_timeout_s=8 * HOUR, may_persist=True)
    box = org.client.create(IMAGE, max_lifetime_s=2 * HOUR, persistent=True)
    org.client.keepalive(box.id)
    found = record(stack, box.id)
    # The request shortened the lifetime; a keep-alive moves only the idle deadline.
    assert found.expires_at - found.created_at == timedelta(hours=2)
    assert found.idle_deadline_at is not None and found.idle_deadline_at > found.expires_at
    assert verdict(found, found.expires_at - timedelta(seconds=1)) is None
    assert verdict(found, found.expires_at) == ("delete", "lifetime")
    reaper.sweep(found.expires_at)
    gone = record(stack, box.id)
    assert gone.phase is SandboxPhase.TERMINATING
    assert [c["reason"] for c in gone.conditions if c["type"] == "Reaped"] == ["MaxLifetime"]


def test_an_unreachable_cluster_leaves_the_sandbox_for_the_next_sweep(stack: Stack, standin: StandIn) -> None:
    org = stack.org(idle_timeout_s=HOUR)
    box = org.client.create(IMAGE)
    # A cluster nobody listens on: every call fails as a connection error would.
    nowhere = settings_for(stack.url, standin, kube=None, kubeconfig=None)
    unreachable = Cluster(nowhere)
    unreachable._kube = StandIn(url="http://127.0.0.1:9").kube()
    broken = Reaper(stack.sessions, unreachable)
    when = utcnow() + timedelta(hours=2)
    assert broken.sweep(when) == 0  # every cluster call failed
    assert record(stack, box.id).phase is SandboxPhase.PENDING  # untouched
    healthy = Reaper(stack.sessions, Cluster(settings_for(stack.url, standin)))
    healthy.sweep(when)
    assert record(stack, box.id).phase is SandboxPhase.TERMINATING
    assert standin.get(stack.object_name(box.id), NAMESPACE) is None


def test_a_sandbox_that_pauses_on_idle_is_paused_and_the_next_exec_wakes_it(
    stack_url: str, standin: StandIn
) -> None:
    with serve_stack(stack_url, standin, memory_capture=True, start_wait_s=0) as pausing:
        reaper = Reaper(pausing.sessions, Cluster(settings_for(pausing.url, standin)))
        org = pausing.org(idle_timeout_s=HOUR)
        box = org.client.create(IMAGE, on_idle="pause")
        assert box.spec["on_idle"] == "pause"
        reaper.sweep(utcnow() + timedelta(hours=2))
        paused = record(pausing, box.id)
        assert paused.phase is not SandboxPhase.TERMINATING and paused.spec["stopped"] is True
        assert next(c["message"] for c in paused.conditions if c["type"] == "Reaped").startswith("paused")
        spec = standin.get(pausing.object_name(box.id))["spec"]
        assert spec["stopped"] is True and spec["memoryCapture"] is True
        # Used again: the exec resumes it (no controller runs here, so the exec then says
        # it is still resuming; the cluster tier runs it through).
        with pytest.raises(WarrenError, match="still resuming"):
            org.client.run(box.id, ["true"])
        spec = standin.get(pausing.object_name(box.id))["spec"]
        assert spec["stopped"] is False and spec["coldStart"] is False
        assert record(pausing, box.id).spec["stopped"] is False


def test_pausing_on_idle_needs_memory_capture(stack: Stack) -> None:
    org = stack.org()
    with pytest.raises(WarrenError, match=r"on_idle pause.*memory capture is off"):
        org.client.create(IMAGE, on_idle="pause")
