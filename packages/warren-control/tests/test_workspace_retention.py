"""A deleted sandbox's workspace stays in object storage for the retention period (a new
sandbox may start from it), then the reaper releases it through warren-blockd's own
`release` and collects what nothing references with its `gc`. The store is a real file
store written by warren-blockd's code; the records are SQLite and a real PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from api_stack import Stack, StandIn, serve_stack, settings_for
from test_workspace_proof import IMAGE, TOOL, needs_blockd, publish
from warren_control.api.cluster import Cluster
from warren_control.models import Sandbox, SandboxPhase, utcnow
from warren_control.reaper import Reaper, ReaperOptions
from warren_control.sdk import Client, WarrenError
from warren_control.workspaces import BlockdStore

pytest_plugins = ["api_fixtures"]
pytestmark = needs_blockd

HOUR = 3600
RETENTION = 48 * HOUR


def deleted(stack: Stack, org_client: Client, sandbox_id: str) -> Sandbox:
    """Delete through the API and let the resource go, as its finalizer would."""
    org_client.delete(sandbox_id)
    stack.standin.finish_deletes()
    with pytest.raises(WarrenError):
        org_client.get(sandbox_id)  # the read sees it gone and retires the record
    with stack.sessions() as session:
        found = session.get(Sandbox, sandbox_id)
        assert found is not None and found.phase is SandboxPhase.DELETED and found.deleted_at
        return found


def test_a_deleted_workspace_is_kept_then_released(stack_url: str, standin: StandIn, tmp_path: Path) -> None:
    store = BlockdStore(f"file://{tmp_path}", tool=str(TOOL))
    changes = {"workspace_store": store, "workspace_retention_s": RETENTION}
    with serve_stack(stack_url, standin, **changes) as stack:
        org = stack.org()
        box = org.client.create(IMAGE, cpu_millis=100, memory_mib=128)
        assert box.workspace_id
        publish(tmp_path, box.workspace_id, 2)
        gone = deleted(stack, org.client, box.id)
        reaper = Reaper(
            stack.sessions,
            Cluster(settings_for(stack.url, standin, **changes)),
            ReaperOptions(workspace_retention_s=RETENTION),
            store,
        )

        # Within the retention: kept, and a new sandbox may start from it.
        assert gone.deleted_at is not None
        reaper.sweep(gone.deleted_at + timedelta(hours=47))
        assert box.workspace_id not in reaper.released
        assert store.proof(box.workspace_id).replicated_sequence == 2
        seeded = org.client.create(IMAGE, cpu_millis=100, memory_mib=128, workspace_template=box.workspace_id)
        assert seeded.spec["workspace"]["template"] == box.workspace_id

        # Past it: released from storage, recorded, and no longer a template.
        reaper.sweep(gone.deleted_at + timedelta(hours=49))
        assert box.workspace_id in reaper.released
        assert reaper.collected, "a release is followed by a collection"
        with pytest.raises(Exception, match="nothing in storage"):
            store.proof(box.workspace_id)
        with stack.sessions() as session:
            released = session.get(Sandbox, box.id)
            assert released is not None and released.workspace_released_at is not None
        with pytest.raises(WarrenError) as refused:
            org.client.create(IMAGE, workspace_template=box.workspace_id)
        assert refused.value.code == "not_found"
        # Released once: the next sweep does not ask again.
        count = len(reaper.released)
        reaper.sweep(gone.deleted_at + timedelta(hours=50))
        assert len(reaper.released) == count


def test_an_unreachable_store_keeps_the_record_for_the_next_sweep(
    stack_url: str, standin: StandIn, tmp_path: Path
) -> None:
    nowhere = BlockdStore("s3://warren-workspaces", endpoint="http://127.0.0.1:9", tool=str(TOOL))
    with serve_stack(stack_url, standin, workspace_retention_s=HOUR) as stack:
        org = stack.org()
        box = org.client.create(IMAGE, cpu_millis=100, memory_mib=128)
        gone = deleted(stack, org.client, box.id)
        assert gone.deleted_at is not None
        cluster = Cluster(settings_for(stack.url, standin))
        broken = Reaper(stack.sessions, cluster, ReaperOptions(workspace_retention_s=HOUR), nowhere)
        broken.sweep(gone.deleted_at + timedelta(hours=2))
        assert broken.released == []
        with stack.sessions() as session:
            kept = session.get(Sandbox, box.id)
            assert kept is not None and kept.workspace_released_at is None
        # The store back: the next sweep (here another reaper) finishes the release.
        store = BlockdStore(f"file://{tmp_path}", tool=str(TOOL))
        healthy = Reaper(stack.sessions, cluster, ReaperOptions(workspace_retention_s=HOUR), store)
        healthy.sweep(utcnow() + timedelta(hours=2))
        assert box.workspace_id in healthy.released
