"""One writer per workspace across the cluster: which node holds it, and the fence a new
holder puts up before it serves.

`workspaces/<id>/holder` names the node that has the workspace attached, when that node last
said so (its clock, seconds since the epoch) and the log record that fenced its takeover. The
holder renews it while attached. Another node's attach is refused while it is fresh; once it
has lapsed (the node is gone, or cut off), the new node takes over: it publishes an empty log
record at the next sequence number, create-only, and only then serves. Log records are
create-only per number, so a writer the takeover fenced off finds its next number taken and
stops as split brain: it can never publish after the takeover. Its own renewal finds the
newer fence and stops it too.

Clocks: a holder is judged lapsed by the new node's clock against the old node's; nodes'
clocks must agree to well within the hold (NTP does).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from warren_blockd.errors import NotFoundError, PreconditionFailedError
from warren_blockd.workspace import Workspace

# A takeover loses the race for the next record to a writer still publishing this often
# before it gives up and leaves the workspace to that writer.
TAKEOVER_ATTEMPTS = 3


class HeldError(RuntimeError):
    """Another node holds the workspace."""


class TakenOverError(RuntimeError):
    """This node held the workspace and another has taken it over since: stop writing."""


@dataclass(frozen=True)
class Holder:
    node: str
    renewed: float  # the holder's clock
    fence: int  # the log record its takeover published; 0: it took over from no one

    def lapsed(self, now: float, hold: float) -> bool:
        return now - self.renewed >= hold


def _key(ws: Workspace) -> str:
    return f"{ws.prefix}holder"


# Who holds a workspace whose hold record is torn (its writer killed mid-upload): a node
# that renewed long ago, so a new holder fences it off.
TORN = "(a torn hold record)"


def read(ws: Workspace) -> Holder | None:
    try:
        doc = json.loads(ws.store.get(_key(ws)))
        return Holder(str(doc["node"]), float(doc["renewed"]), int(doc["fence"]))
    except NotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return Holder(TORN, 0.0, 0)


def _write(ws: Workspace, holder: Holder) -> None:
    ws.store.put(_key(ws), json.dumps(asdict(holder)).encode())


def take(ws: Workspace, node: str, hold: float, now: float) -> tuple[int, Holder | None]:
    """Hold the workspace for `node`: (the fence, and the holder it took over from if it
    fenced one off). Refused (HeldError) while another node's hold is fresh. A node that holds
    it already (a restart, or a new daemon after a handoff) keeps its fence: its own unpublished
    writes may still go up."""
    held = read(ws)
    if held is not None and held.node != node and not held.lapsed(now, hold):
        raise HeldError(
            f"workspace {ws.workspace_id} is attached on node {held.node} (renewed {now - held.renewed:.0f}s "
            f"ago): a workspace has one writer; delete the pod there, or wait until its hold of {hold:.0f}s "
            "lapses once that node is gone"
        )
    if held is None or held.node == node:
        fence = held.fence if held is not None else 0
        _write(ws, Holder(node, now, fence))
        return fence, None
    fence = _fence(ws, node, held)
    _write(ws, Holder(node, now, fence))
    return fence, held


def _fence(ws: Workspace, node: str, held: Holder) -> int:
    """Publish the empty record that ends `held`'s writes: at the next number after every
    record stored now, so the new holder starts from all of them."""
    for _ in range(TAKEOVER_ATTEMPTS):
        seq = ws.replicated_seq() + 1
        body = {"seq": seq, "extents": [], "fence": {"node": node, "from": held.node}}
        try:
            ws.store.put(f"{ws.prefix}log/{seq:016d}", json.dumps(body).encode(), create_only=True)
        except PreconditionFailedError:
            continue  # the old writer published meanwhile: start after that too
        return seq
    raise HeldError(
        f"workspace {ws.workspace_id} is still being written by node {held.node} although its hold "
        "lapsed: stop that writer (its node's warren-blockd), then attach again"
    )


def renew(ws: Workspace, node: str, fence: int, now: float) -> None:
    """Say again that `node` holds the workspace; TakenOverError if a later takeover (a
    higher fence) holds it now. A record of an older holder written over ours (it renewed
    once more before it saw our fence) is written over in turn."""
    held = read(ws)
    if held is not None and held.node != node and held.fence > fence:
        raise TakenOverError(
            f"workspace {ws.workspace_id} was taken over by node {held.node} (its fence is log record "
            f"{held.fence}): this node's writes after that are not published"
        )
    _write(ws, Holder(node, now, fence))


def let_go(ws: Workspace, node: str, fence: int) -> None:
    """`node` (holding since the takeover `fence`) detached the workspace with every write in
    storage: another node may attach it at once. A record of an older holder (a lower fence)
    goes too: its last renewal landed over ours, and it can never write here again."""
    held = read(ws)
    if held is not None and (held.node == node or held.fence < fence):
        ws.store.delete(_key(ws))
