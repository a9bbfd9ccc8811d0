"""One writer per workspace across nodes (holder.py), over a real store: a second node is
refused while the first holds the workspace, takes it over with a fence once that hold has
lapsed, and the first can publish nothing after the fence."""

from __future__ import annotations

import json

import pytest
from warren_blockd import holder
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.workspace import LogLane, SplitBrainError, Workspace

BLOCK = 4096
HOLD = 30.0


def test_a_second_node_is_refused_while_the_first_holds_and_fences_it_off_once_it_lapsed(
    store: PolicyStore,
) -> None:
    ws = Workspace(store, "held")
    ws.create(1024)
    assert holder.take(ws, "node-a", HOLD, now=1000.0) == (0, None)
    a = LogLane(ws, next_seq=1)
    a.publish([(0, b"a" * BLOCK)])  # seq 1: replicated while a held it

    with pytest.raises(holder.HeldError, match="attached on node node-a") as refused:
        holder.take(ws, "node-b", HOLD, now=1000.0 + HOLD - 1)
    assert "delete the pod there" in str(refused.value)
    holder.renew(ws, "node-a", 0, now=1000.0 + HOLD - 1)  # a renewed: still held later on
    with pytest.raises(holder.HeldError):
        holder.take(ws, "node-b", HOLD, now=1000.0 + HOLD + 1)

    # a is gone: its hold lapses and b takes over with the next record as its fence.
    fence, previous = holder.take(ws, "node-b", HOLD, now=1000.0 + 2 * HOLD)
    assert fence == 2 and previous is not None and previous.node == "node-a"
    record = json.loads(store.get(f"{ws.prefix}log/{fence:016d}"))
    assert record["extents"] == [] and record["fence"] == {"node": "node-b", "from": "node-a"}
    assert ws.effective().log_seq == fence and ws.effective().lookup(0) is not None  # a's record kept
    assert holder.read(ws) == holder.Holder("node-b", 1000.0 + 2 * HOLD, fence)

    # a comes back: its next record is the fence's number, so it cannot publish ...
    with pytest.raises(SplitBrainError, match="published by another writer"):
        a.publish([(1, b"x" * BLOCK)])
    # ... and its renewal learns it was taken over.
    with pytest.raises(holder.TakenOverError, match="taken over by node node-b"):
        holder.renew(ws, "node-a", 0, now=1000.0 + 2 * HOLD + 1)
    b = LogLane(ws, next_seq=fence + 1)
    assert b.publish([(1, b"b" * BLOCK)]) == fence + 1


def test_a_holder_that_renews_over_a_takeover_is_written_over_in_turn(store: PolicyStore) -> None:
    """The old holder's last renewal can land after the new holder's record: the new one
    (the higher fence) writes its own back at its next renewal; the old one stops."""
    ws = Workspace(store, "raced")
    ws.create(1024)
    holder.take(ws, "node-a", HOLD, now=0.0)
    fence, _ = holder.take(ws, "node-b", HOLD, now=HOLD)
    holder._write(ws, holder.Holder("node-a", HOLD + 1, 0))  # a's late renewal, written over b's
    holder.renew(ws, "node-b", fence, now=HOLD + 2)
    assert holder.read(ws) == holder.Holder("node-b", HOLD + 2, fence)
    with pytest.raises(holder.TakenOverError):
        holder.renew(ws, "node-a", 0, now=HOLD + 3)


def test_a_detach_takes_a_fenced_off_holders_late_record_with_it(store: PolicyStore) -> None:
    """The old holder's last renewal landed over the new holder's record, and the new one
    detaches before its next renewal writes its own back: the stale record (a lower fence)
    goes with the detach, so a later attach is not refused for a writer fenced off for good."""
    ws = Workspace(store, "late")
    ws.create(1024)
    holder.take(ws, "node-a", HOLD, now=0.0)
    fence, _ = holder.take(ws, "node-b", HOLD, now=HOLD)
    holder._write(ws, holder.Holder("node-a", HOLD + 1, 0))  # a's late renewal, over b's
    holder.let_go(ws, "node-b", fence)
    assert holder.read(ws) is None
    assert holder.take(ws, "node-b", HOLD, now=HOLD + 1.5)[1] is None  # at once, not after a's hold


def test_the_same_node_keeps_its_hold_and_a_clean_detach_lets_go_at_once(store: PolicyStore) -> None:
    ws = Workspace(store, "mine")
    ws.create(1024)
    holder.take(ws, "node-a", HOLD, now=0.0)
    # A restart or a handoff on the same node: no fence, its unpublished writes may go up.
    assert holder.take(ws, "node-a", HOLD, now=1.0) == (0, None)
    assert ws.replicated_seq() == 0
    holder.let_go(ws, "node-b", 0)  # not b's to let go of
    assert holder.read(ws) is not None
    holder.let_go(ws, "node-a", 0)
    assert holder.read(ws) is None
    assert holder.take(ws, "node-b", HOLD, now=2.0) == (0, None)  # nothing to fence off


def test_a_torn_hold_record_is_fenced_off_like_a_lapsed_one(store: PolicyStore) -> None:
    """A hold record cut off mid-upload (its node killed while renewing) names no one who can
    still be waited for: the next node takes over behind a fence."""
    ws = Workspace(store, "torn")
    ws.create(1024)
    holder.take(ws, "node-a", HOLD, now=1000.0)
    LogLane(ws, next_seq=1).publish([(0, b"a" * BLOCK)])
    store.put(f"{ws.prefix}holder", b'{"node": "no')
    assert holder.read(ws) == holder.Holder(holder.TORN, 0.0, 0)
    fence, previous = holder.take(ws, "node-b", HOLD, now=1001.0)
    assert fence == 2 and previous is not None and previous.node == holder.TORN
    assert holder.read(ws) == holder.Holder("node-b", 1001.0, 2)
