"""One local node per network namespace: the claim on what a node shares with its host.

A local node's network lives in its host's network namespace: the bridge, the CNI network
and its address leases, the kube-proxy and kubelet rules, and the egress floor's nftables
table, which every running sandbox pod is enrolled in. A second node in the same namespace
would share all of them, and its teardown would remove them under the first node's
sandboxes (they would run with no egress floor). So the first node to start claims them;
another node refuses to start and names what it would share; and a teardown removes them
only while its node holds the claim.

The claim is a file under /run (cleared at boot, like the kernel's network state it
stands for), named by the network namespace's inode and written under a lock.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from warren.cluster.local import STATE_MARKER

CLAIMS_DIR = Path("/run/warren/nodes")


class ClaimError(RuntimeError):
    """Another node holds this network namespace's shared state."""


@dataclass(frozen=True)
class Claim:
    state_dir: str  # the cluster state directory of the node that holds the claim
    bridge: str
    network: str
    floor_table: str  # family inet

    def shared(self) -> str:
        return (
            f"bridge {self.bridge}, CNI network '{self.network}' and its address leases, "
            f"the nftables table inet {self.floor_table} (the egress floor its sandboxes are "
            "enrolled in), and the kube-proxy and kubelet rules"
        )


def _netns_id() -> int:
    return Path("/proc/self/ns/net").stat().st_ino


def claim_path(claims_dir: Path = CLAIMS_DIR) -> Path:
    return claims_dir / f"netns-{_netns_id()}.json"


@contextmanager
def _locked(claims_dir: Path) -> Iterator[None]:
    claims_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    with (claims_dir / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def holder(claims_dir: Path = CLAIMS_DIR) -> Claim | None:
    path = claim_path(claims_dir)
    try:
        return Claim(**json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as exc:
        raise ClaimError(
            f"{path} is not a node claim ({exc}): remove it if no Warren node runs here"
        ) from None


def _present(wanted: Claim) -> list[str]:
    """What of the shared state exists already, though no node has claimed it."""
    found = []
    if (
        subprocess.run(["ip", "link", "show", wanted.bridge], capture_output=True, check=False).returncode
        == 0
    ):
        found.append(f"bridge {wanted.bridge}")
    table = subprocess.run(
        ["nft", "list", "table", "inet", wanted.floor_table], capture_output=True, check=False
    )
    if table.returncode == 0:
        found.append(f"nftables table inet {wanted.floor_table}")
    return found


def acquire(wanted: Claim, *, running_here: bool = False, claims_dir: Path = CLAIMS_DIR) -> str | None:
    """Claim this network namespace for the node at `wanted.state_dir`, or raise ClaimError
    naming the node that holds it and what the two would share. `running_here` says that
    node's own processes already run (a node started before claims existed owns what it
    made). Returns a note when a claim was taken over from a node whose state is gone."""
    with _locked(claims_dir):
        current = holder(claims_dir)
        note = None
        if current is not None and current.state_dir != wanted.state_dir:
            if (Path(current.state_dir) / STATE_MARKER).exists():
                raise ClaimError(
                    f"a Warren node already runs in this network namespace (cluster state "
                    f"{current.state_dir}); a second node here would share its {current.shared()}, "
                    "and taking that second node down would remove them under the first one's "
                    "sandboxes. Take that node down first (warren cluster down with its "
                    "WARREN_HOME), or run this cluster on another machine or network namespace."
                )
            note = f"took over the node claim of {current.state_dir} (its state is gone)"
        elif current is None and not running_here and (leftovers := _present(wanted)):
            raise ClaimError(
                f"{' and '.join(leftovers)} exist in this network namespace but no Warren node "
                "has claimed them: a node of an older Warren may be running. Take it down "
                "(warren cluster down with its WARREN_HOME) or, if none runs, remove them "
                f"(ip link delete {wanted.bridge}; nft delete table inet {wanted.floor_table})."
            )
        path = claim_path(claims_dir)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(wanted)))
        tmp.replace(path)
        return note


def holds(state_dir: Path, claims_dir: Path = CLAIMS_DIR) -> bool:
    current = holder(claims_dir)
    return current is not None and current.state_dir == str(state_dir)


def release(state_dir: Path, claims_dir: Path = CLAIMS_DIR) -> None:
    with _locked(claims_dir):
        if holds(state_dir, claims_dir):
            claim_path(claims_dir).unlink()
