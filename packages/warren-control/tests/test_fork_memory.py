"""A fork of a sandbox paused with memory: once its image is a restore point (proved by a
restore), each child's resource names it (spec.memoryFrom, for the controller to restore the
child from) and the child's workspace is forked in the real store (warren-blockd's own
command on a file store) at the image's write record while the parent is still paused. An
image not yet proved is no restore point: the children start afresh. The restore itself is
the controller's (test_memory_resume.py) and the cluster tier's (test_memory_images.py)."""

from __future__ import annotations

import json
from pathlib import Path

from api_stack import StandIn, serve_stack
from test_workspace_proof import IMAGE, TOOL, needs_blockd, publish
from warren_control.workspaces import BlockdStore

pytest_plugins = ["api_fixtures"]

MEMORY_IMAGE = "cd" * 32


@needs_blockd
def test_a_fork_of_a_paused_sandbox_restores_its_children_from_its_proved_image(
    stack_url: str, standin: StandIn, tmp_path: Path
) -> None:
    store = BlockdStore(f"file://{tmp_path}", tool=str(TOOL))
    with serve_stack(stack_url, standin, workspace_store=store, memory_capture=True) as stack:
        org = stack.org()
        parent = org.client.create(IMAGE, cpu_millis=100, memory_mib=128)
        assert parent.workspace_id
        publish(tmp_path, parent.workspace_id, 3)
        org.client.stop(parent.id, memory=True)
        name = stack.object_name(parent.id)
        image = {
            "image": MEMORY_IMAGE,
            "workspace": parent.workspace_id,
            "workspaceSeq": 2,
            "sealedSeq": 3,
            "node": "node-a",
            "bytes": 1 << 20,
            "verification": {"workspace": f"{parent.workspace_id}-vabc", "startedAt": "x"},
        }
        standin.set_status(name, {"phase": "Stopped", "memoryImage": image})

        # Still being proved: no restore point, so the children start afresh.
        (fresh,) = org.client.fork(parent.id, 1)
        assert fresh.sandbox is not None and "memory_from" not in fresh.sandbox.spec
        fresh_obj = standin.get(stack.object_name(fresh.sandbox.id)) or {}
        assert "memoryFrom" not in fresh_obj["spec"]

        proved = {**image, "verifiedAt": "y", "verification": {**image["verification"], "done": True}}
        standin.set_status(name, {"phase": "Stopped", "memoryImage": proved})
        results = org.client.fork(parent.id, 2)
        children = [r.sandbox for r in results if r.sandbox is not None]
        assert len(children) == 2
        for child in children:
            assert child.spec["memory_from"] == MEMORY_IMAGE
            obj = standin.get(stack.object_name(child.id)) or {}
            assert obj["spec"]["memoryFrom"] == {
                "image": MEMORY_IMAGE,
                "workspace": parent.workspace_id,
                "workspaceSeq": 3,
                "node": "node-a",
            }
            assert "pool" not in obj["spec"]  # a pool pod is running already: it cannot be restored
            # Forked now, while the parent is paused: it stands on the record the image is
            # valid over (the store proves nothing of its own yet).
            assert child.workspace_id
            assert store.proof(child.workspace_id).replicated_sequence == 0
            # The node the image is on is the cluster's business, never the API's answer.
            assert "node-a" not in json.dumps(org.client.get(child.id).spec)
