"""GET /v1/sandboxes/{id}/workspace: what object storage proves about a sandbox's workspace,
read from the store by warren-blockd's own `replicated` command (its layout, its
environment). The store is a real file store and a real SeaweedFS is not needed: the
command is the same for both; the cluster tier reads SeaweedFS after a node loss."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from api_stack import StandIn, serve_stack
from warren_control.sdk import WarrenError
from warren_control.workspaces import BlockdStore

pytest_plugins = ["api_fixtures"]

IMAGE = "registry.example/tools/busybox:1.36"
BLOCKD_ENV = Path(
    os.environ.get("WARREN_BLOCKD_ENV") or Path(__file__).resolve().parents[2] / "warren-blockd" / ".venv"
)
TOOL = BLOCKD_ENV / "bin" / "warren-blockd"
needs_blockd = pytest.mark.skipif(
    not TOOL.is_file(), reason=f"warren-blockd's environment ({BLOCKD_ENV}) is not installed"
)

WRITE_RECORDS = """
import sys
from pathlib import Path
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.workspace import LogLane, Workspace
workspace = Workspace(PolicyStore(LocalDriver(Path(sys.argv[1]))), sys.argv[2])
workspace.create(64)
lane = LogLane(workspace, 1)
for block in range(int(sys.argv[3])):
    lane.publish([(block, bytes([block + 1]) * 4096)])
"""


def publish(root: Path, workspace_id: str, records: int) -> None:
    """What a node's blockd does: a workspace and `records` confirmed write records."""
    python = str(BLOCKD_ENV / "bin" / "python")
    subprocess.run([python, "-c", WRITE_RECORDS, str(root), workspace_id, str(records)], check=True)


@needs_blockd
def test_the_proof_is_read_from_the_store(stack_url: str, standin: StandIn, tmp_path: Path) -> None:
    store = BlockdStore(f"file://{tmp_path}", tool=str(TOOL))
    with serve_stack(stack_url, standin, workspace_store=store) as stack:
        org = stack.org()
        box = org.client.create(IMAGE, cpu_millis=100, memory_mib=128)
        assert box.workspace_id
        before = org.client.workspace_proof(box.id)  # no node has mounted it yet
        assert (before.workspace_id, before.replicated_sequence) == (box.workspace_id, None)
        publish(tmp_path, box.workspace_id, 3)
        proof = org.client.workspace_proof(box.id)
        assert proof.replicated_sequence == 3 and proof.checked_at is not None
        with pytest.raises(WarrenError) as other:  # another organization sees nothing
            stack.org().client.workspace_proof(box.id)
        assert other.value.code == "not_found"


@needs_blockd
def test_an_unreachable_store_is_unavailable_not_zero(stack_url: str, standin: StandIn) -> None:
    # A closed port: the answer must say the store did not answer, never claim "nothing proven".
    store = BlockdStore("s3://warren-workspaces", endpoint="http://127.0.0.1:9", tool=str(TOOL))
    with serve_stack(stack_url, standin, workspace_store=store) as stack:
        org = stack.org()
        box = org.client.create(IMAGE, cpu_millis=100, memory_mib=128)
        with pytest.raises(WarrenError) as refused:
            org.client.workspace_proof(box.id)
        assert refused.value.code == "unavailable"
        assert "did not answer" in refused.value.message


def test_without_a_store_or_a_workspace_the_answer_says_why(stack_url: str, standin: StandIn) -> None:
    with serve_stack(stack_url, standin) as stack:
        org = stack.org()
        box = org.client.create(IMAGE, cpu_millis=100, memory_mib=128)
        with pytest.raises(WarrenError) as refused:
            org.client.workspace_proof(box.id)
        assert refused.value.code == "unsupported_capability"
        assert "--workspace-store" in refused.value.message
    with serve_stack(stack_url, standin, workspaces=False) as bare:
        org = bare.org()
        box = org.client.create(IMAGE)
        with pytest.raises(WarrenError) as refused:
            org.client.workspace_proof(box.id)
        assert refused.value.code == "no_workspace"
