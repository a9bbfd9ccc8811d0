"""Memory images on the deployed platform's node (warren_blockd.memory): a sandbox whose
state lives only in a process's memory is captured by the node's warren-blockd (runsc
checkpoints its gVisor sandbox; the image goes to object storage as checksummed pieces,
bound to the write record its workspace had proven in storage), its pod goes, and a new pod
restored from the staged image carries on: the same process, its counter where it was, the
same workspace. Each image is proved by a restore (onto a fork of its workspace, released
after) before it is a restore point, and a fork of the paused sandbox restores every child
from it. A stored piece with one flipped byte is refused before runsc reads any of it, and
so is the image over the workspace once something wrote it after the capture."""

from __future__ import annotations

import base64
import copy
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from conftest import SYSTEM, WAIT_S, wait_for
from kubernetes import client
from kubernetes.stream import stream

from warren.conformance.kube import ready_nodes

pytestmark = pytest.mark.workloads

RESTORE_ANNOTATION = "dev.gvisor.internal.restore.image-path"  # warren_blockd.memory
# A secret drawn once and a counter, both only in the shell's memory; the loop shows them
# in /tmp/state (the sandbox's own memory-backed root) five times a second.
COUNTER = r"""
secret=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
n=0
while true; do
  n=$((n + 1))
  echo "$secret $n" > /tmp/state.new && mv /tmp/state.new /tmp/state
  sleep 0.2
done
"""


def pod_exec(core: client.CoreV1Api, pod: Any, command: list[str]) -> str:
    return str(
        stream(
            core.connect_get_namespaced_pod_exec,
            pod.metadata.name,
            pod.metadata.namespace,
            container="sandbox",
            command=command,
            stderr=True,
            stdin=False,
            stdout=True,
            tty=False,
        )
    )


def state(core: client.CoreV1Api, pod: Any) -> tuple[str, int]:
    secret, count = pod_exec(core, pod, ["cat", "/tmp/state"]).split()
    return secret, int(count)


@pytest.fixture(scope="module")
def binder(api: client.ApiClient) -> Any:
    """The control plane's client of the nodes' warren-blockd, with the deployment's token."""
    from warren_control.binder import Binder, BindOptions
    from warren_control.kube import Kube

    secret = client.CoreV1Api(api).read_namespaced_secret("warren-blockd-bind", SYSTEM)
    token = base64.b64decode(secret.data["token"]).decode().strip()
    return Binder(Kube(api), BindOptions(token=token))


def base_image(api: client.ApiClient) -> str:
    """The base template's image (the agent is in it: its pods have no init container, whose
    second run a restore would not know what to do with)."""
    deployment = client.AppsV1Api(api).read_namespaced_deployment("warren-control", SYSTEM)
    args = deployment.spec.template.spec.containers[0].args
    return next(a.split("=", 2)[2] for a in args if a.startswith("--template=base="))


@contextmanager
def counting(platform: Any, api: client.ApiClient, **options: Any) -> Iterator[tuple[str, str, Any]]:
    """A running sandbox whose counter has counted: (sandbox id, workspace id, its pod)."""
    core = client.CoreV1Api(api)
    command = ["sh", "-c", COUNTER]
    created = platform.create(base_image(api), command=command, cpu_millis=100, memory_mib=128, **options)
    sandbox_id = str(created.id)
    try:
        assert platform.wait_until(sandbox_id, "Running", timeout=WAIT_S).phase == "Running"
        platform.run(sandbox_id, ["sh", "-c", "echo kept > /workspace/kept && sync"], timeout=60)
        workspace = platform.workspace_proof(sandbox_id).workspace_id
        pods = core.list_pod_for_all_namespaces(label_selector=f"warren.dev/workspace={workspace}").items
        assert len(pods) == 1, f"one pod mounts workspace {workspace}"
        wait_for("the counter to count", lambda: state(core, pods[0])[1] > 5)
        yield sandbox_id, workspace, pods[0]
    finally:
        platform.delete(sandbox_id)
        platform.wait_until(sandbox_id, "Deleted", timeout=WAIT_S)


@pytest.fixture
def counter(platform: Any, api: client.ApiClient) -> Iterator[tuple[str, str, Any]]:
    with counting(platform, api) as made:
        yield made


def restore_pod(core: client.CoreV1Api, original: Any, path: str) -> Any:
    """The original pod made again under another name, restored from `path`: the same
    containers and workspace volume, no postStart (the restored agent already runs), none
    of the control plane's labels (it is this test's pod), the sandbox label the floor
    keys on."""
    spec = copy.deepcopy(core.api_client.sanitize_for_serialization(original.spec))
    for container in spec["containers"]:
        container.pop("lifecycle", None)
    spec.pop("nodeName", None)
    name = f"restored-{uuid.uuid4().hex[:8]}"
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"warren.dev/sandbox": "true"},
            "annotations": {RESTORE_ANNOTATION: path},
        },
        "spec": {**spec, "restartPolicy": "Never"},
    }
    core.create_namespaced_pod(original.metadata.namespace, body)

    def running() -> Any:
        pod = core.read_namespaced_pod(name, original.metadata.namespace)
        statuses = pod.status.container_statuses or []
        ended = [s.state.terminated for s in statuses if s.state.terminated]
        assert not ended, f"the restored pod's container ended: {ended}"
        return pod if statuses and all(s.ready for s in statuses) else None

    return wait_for(f"pod {name} restored", running, timeout=120)


def deleting(core: client.CoreV1Api, pod: Any) -> bool:
    try:
        return (
            core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace).metadata.deletion_timestamp
            is not None
        )
    except client.ApiException as exc:
        return exc.status == 404


def gone(core: client.CoreV1Api, pod: Any) -> None:
    core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)

    def absent() -> bool:
        try:
            core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        except client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for(f"pod {pod.metadata.name} gone", absent, timeout=120)


def in_blockd(core: client.CoreV1Api, script: str, node: str | None = None) -> str:
    """The last line a Python `script` prints, run in a node's warren-blockd (`node`'s, or
    any) with `store`, its own client of the deployment's object storage, and `state`, its
    state directory."""
    pods = core.list_namespaced_pod(SYSTEM, label_selector="app.kubernetes.io/name=warren-blockd").items
    blockd = next(p for p in pods if node in (None, p.spec.node_name))
    args = blockd.spec.containers[0].args

    def arg(name: str) -> str | None:
        return next((a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")), None)

    prelude = (
        "from pathlib import Path\nfrom warren_blockd.stores import open_store\n"
        f"store = open_store({arg('store')!r}, {arg('s3-endpoint')!r})\nstate = Path({arg('state-dir')!r})\n"
    )
    out = stream(
        core.connect_get_namespaced_pod_exec,
        blockd.metadata.name,
        SYSTEM,
        container="blockd",
        command=["/opt/warren/blockd/bin/python", "-c", prelude + script],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    return str(out).strip().splitlines()[-1]


def flip_kept(core: client.CoreV1Api, node: str, image: str) -> str:
    """Flip one byte of every file of `image` that `node`'s warren-blockd keeps (once per
    file: copies share files by links): the files' names."""
    return in_blockd(
        core,
        f"""
from warren_blockd.memory import STAGED_DIR
names, seen = set(), set()
for copy in (state / STAGED_DIR).glob("{image}.*"):
    for file in copy.iterdir():
        if file.stat().st_ino not in seen:
            seen.add(file.stat().st_ino)
            names.add(file.name)
            with file.open("r+b") as f:
                byte = f.read(1)
                f.seek(0)
                f.write(bytes([byte[0] ^ 1]))
print(sorted(names))
""",
        node,
    )


def flip_a_byte(core: client.CoreV1Api, image: str) -> str:
    """Flip one byte of the first stored piece of `image`'s first file, in object storage:
    the piece's key."""
    return in_blockd(
        core,
        f"""
import json
doc = json.loads(store.get("images/{image}"))
digest = doc["files"][0]["pieces"][0]
key = "images/chunks/" + digest[:2] + "/" + digest
data = bytearray(store.get(key))
data[len(data) // 2] ^= 0x01
store.put(key, bytes(data))
print(key)
""",
    )


def sandbox_status(api: client.ApiClient, pod: Any) -> dict[str, Any]:
    """The status of the Sandbox resource that owns `pod`."""
    owner = next(o for o in pod.metadata.owner_references if o.kind == "Sandbox")
    found = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "warren.dev", "v1alpha1", pod.metadata.namespace, "sandboxes", owner.name
    )
    return dict(found.get("status") or {})


def sealed_image(api: client.ApiClient, pod: Any) -> dict[str, Any] | None:
    """The Sandbox's memory image record, once it names the write record it is sealed over."""
    record = sandbox_status(api, pod).get("memoryImage") or {}
    return dict(record) if "sealedSeq" in record else None


def memory_condition(platform: Any, sandbox_id: str, reason: str) -> Any:
    """The sandbox's MemoryImage condition through the API, once it has `reason`."""
    found = [c for c in platform.get(sandbox_id).conditions if c.type == "MemoryImage"]
    return found[0] if found and found[0].reason == reason else None


def api_state(platform: Any, sandbox_id: str) -> tuple[str, int]:
    secret, count = platform.read_file(sandbox_id, "/tmp/state").decode().split()
    return secret, int(count)


def test_a_paused_sandbox_resumes_with_its_memory_and_a_bad_image_is_refused(
    api: client.ApiClient, platform: Any, binder: Any, counter: tuple[str, str, Any]
) -> None:
    from warren_control.binder import BindError

    core = client.CoreV1Api(api)
    sandbox_id, workspace, pod = counter
    node = pod.spec.node_name

    # Stop with memory: the controller has the node's warren-blockd capture the sandbox,
    # then its pod goes; the Sandbox keeps the image's record, sealed over the workspace's
    # write record once the pod is gone.
    before = state(core, pod)
    platform.stop(sandbox_id, memory=True)
    assert platform.wait_until(sandbox_id, "Stopped", timeout=WAIT_S).phase == "Stopped"
    pods = core.list_pod_for_all_namespaces(label_selector=f"warren.dev/workspace={workspace}").items
    assert pods == [], "a paused sandbox holds no pod"
    record = wait_for("the image sealed", lambda: sealed_image(api, pod))
    print("memory image:", record)
    assert re.fullmatch(r"[0-9a-f]{64}", record["image"]) and record["bytes"] > 0
    assert record["workspace"] == workspace and record["sealedSeq"] >= record["workspaceSeq"]
    # The API shows the restore point.
    captured = wait_for("the API to show it", lambda: memory_condition(platform, sandbox_id, "Captured"))
    assert f"write record {record['sealedSeq']}" in captured.message

    # Start: a new pod restored from the image; the process carries on with what it held
    # only in memory, read through the API.
    platform.start(sandbox_id)
    assert platform.wait_until(sandbox_id, "Running", timeout=WAIT_S).phase == "Running"
    secret, count = api_state(platform, sandbox_id)
    assert secret == before[0], "the restored process has the secret it drew before the pause"
    assert count >= before[1], "the counter carried on from where it stood"
    wait_for("the restored counter to count on", lambda: api_state(platform, sandbox_id)[1] > count)
    assert platform.read_file(sandbox_id, "/workspace/kept") == b"kept\n"
    restored = core.list_pod_for_all_namespaces(label_selector=f"warren.dev/workspace={workspace}").items
    assert len(restored) == 1 and restored[0].metadata.annotations.get(RESTORE_ANNOTATION)
    # The agent (an exec of the runtime's, which a restore does not bring back) was started
    # afresh in the restored sandbox by its postStart hook.
    assert "/warren/agent" in pod_exec(core, restored[0], ["ps", "-o", "args"])
    assert sandbox_status(api, restored[0]).get("restoredFrom") == record["image"]

    # Written after the capture (the resumed sandbox writes, it stops and the newer record
    # is proven): the image no longer fits the workspace and is refused by name.
    platform.run(sandbox_id, ["sh", "-c", "echo later > /workspace/later && sync"], timeout=60)
    platform.stop(sandbox_id)
    assert platform.wait_until(sandbox_id, "Stopped", timeout=WAIT_S).phase == "Stopped"
    sealed = int(record["sealedSeq"])
    with pytest.raises(BindError, match=f"is valid over record {sealed}"):
        binder.stage(node, record["image"], workspace, sealed)

    # One flipped byte in storage, and in the copies the node kept of the image (from its
    # capture and stagings, which a staging there would link instead of fetching): refused
    # before any of it is used.
    key = flip_a_byte(core, record["image"])
    kept = flip_kept(core, node, record["image"])
    print("flipped a byte of", key, "and of", kept)
    assert kept != "[]", "the node keeps the files of the image it captured and staged"
    with pytest.raises(BindError, match=r"piece [0-9a-f]{64} is corrupt"):
        binder.stage(
            node, record["image"], workspace, platform.workspace_proof(sandbox_id).replicated_sequence
        )


def proved_image(api: client.ApiClient, pod: Any) -> dict[str, Any] | None:
    """The memory image record once a restore proved it (a restore point)."""
    record = sealed_image(api, pod)
    done = record is not None and record.get("verifiedAt") and (record.get("verification") or {}).get("done")
    return record if done else None


def carried_on(
    api: client.ApiClient,
    platform: Any,
    sandbox_id: str,
    pod: Any,
    before: tuple[str, int],
    *,
    image: str,
    where: str,
) -> None:
    """The process restored in `pod` (`where`) from `image` has the secret it drew before the
    pause, its counter carries on from where it stood, and its workspace is the same."""
    assert sandbox_status(api, pod).get("restoredFrom") == image
    secret, count = api_state(platform, sandbox_id)
    assert secret == before[0], f"the process restored {where} has the secret it drew before"
    assert count >= before[1], "its counter carried on from where it stood"
    wait_for("the restored counter to count on", lambda: api_state(platform, sandbox_id)[1] > count)
    assert platform.read_file(sandbox_id, "/workspace/kept") == b"kept\n"


def test_a_paused_sandbox_resumes_with_its_memory_on_another_node_when_its_own_takes_no_pods(
    api: client.ApiClient, platform: Any, counter: tuple[str, str, Any]
) -> None:
    """Two nodes: the image is captured on the sandbox's node, which is then cordoned. The
    start stages the image from object storage on the other node, and the process carries
    on there with what it held only in memory, over the same workspace."""
    core = client.CoreV1Api(api)
    sandbox_id, workspace, pod = counter
    node = pod.spec.node_name
    others = [name for name in ready_nodes(core) if name != node]
    if not others:
        pytest.skip("needs a second Ready node (cluster.joined_nodes): there is no other node to resume on")
    before = state(core, pod)
    platform.stop(sandbox_id, memory=True)
    assert platform.wait_until(sandbox_id, "Stopped", timeout=WAIT_S).phase == "Stopped"
    record = wait_for("the image proved by a restore", lambda: proved_image(api, pod))
    core.patch_node(node, {"spec": {"unschedulable": True}})
    try:
        platform.start(sandbox_id)
        assert platform.wait_until(sandbox_id, "Running", timeout=WAIT_S).phase == "Running"
    finally:
        core.patch_node(node, {"spec": {"unschedulable": False}})
    (restored,) = core.list_pod_for_all_namespaces(label_selector=f"warren.dev/workspace={workspace}").items
    assert restored.spec.node_name in others, (restored.spec.node_name, node)
    carried_on(api, platform, sandbox_id, restored, before, image=record["image"], where="on the other node")


RESUMES = "test-resumes"


@contextmanager
def resume_pool(api: client.ApiClient, sandbox: dict[str, Any], size: int) -> Iterator[str]:
    """A resume pool (SandboxPool `resume: true`) of the Sandbox's image, command and size,
    with `size` slots waiting; its namespace. Deleted after, its slots with it."""
    objects = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    spec, namespace = sandbox["spec"], sandbox["metadata"]["namespace"]
    shape = {key: spec[key] for key in ("image", "command", "resources", "reservation") if spec.get(key)}
    body = {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": RESUMES},
        "spec": {**shape, "resume": True, "size": size, "refillPerSecond": 10},
    }
    objects.create_namespaced_custom_object("warren.dev", "v1alpha1", namespace, "sandboxpools", body)
    try:

        def waiting() -> bool:
            pool = objects.get_namespaced_custom_object(
                "warren.dev", "v1alpha1", namespace, "sandboxpools", RESUMES
            )
            return int((pool.get("status") or {}).get("ready") or 0) >= size

        wait_for(f"{size} resume slot(s) waiting", waiting, timeout=120)
        yield namespace
    finally:
        objects.delete_namespaced_custom_object("warren.dev", "v1alpha1", namespace, "sandboxpools", RESUMES)

        def slots_gone() -> bool:
            selector = f"warren.dev/pool={RESUMES}"
            return not core.list_namespaced_pod(namespace, label_selector=selector).items

        # A slot's sandbox waits for an image inside the runtime's request: deleting its pod
        # must end that wait, not outlast it.
        wait_for("the resume pool's slots gone", slots_gone, timeout=60)


def the_sandbox(api: client.ApiClient, pod: Any) -> dict[str, Any]:
    owner = next(o for o in pod.metadata.owner_references if o.kind == "Sandbox")
    found = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "warren.dev", "v1alpha1", pod.metadata.namespace, "sandboxes", owner.name
    )
    return dict(found)


def test_a_paused_sandbox_resumes_in_a_slot_made_ahead_with_its_memory(
    api: client.ApiClient, platform: Any, counter: tuple[str, str, Any]
) -> None:
    """A resume pool of the sandbox's shape keeps a pod waiting for an image: the resume
    claims it, binds the workspace there and puts the image in place, and the process
    carries on in that pod (no pod made at the resume) with what it held in memory."""
    core = client.CoreV1Api(api)
    sandbox_id, workspace, pod = counter
    with resume_pool(api, the_sandbox(api, pod), 1) as namespace:
        (slot,) = core.list_namespaced_pod(namespace, label_selector=f"warren.dev/pool={RESUMES}").items
        assert slot.status.phase == "Pending", "a slot's sandbox waits for its image"
        assert slot.metadata.annotations[RESTORE_ANNOTATION].endswith(f"/slot-{slot.metadata.name}")
        before = state(core, pod)
        platform.stop(sandbox_id, memory=True)
        assert platform.wait_until(sandbox_id, "Stopped", timeout=WAIT_S).phase == "Stopped"
        record = wait_for("the image proved by a restore", lambda: proved_image(api, pod))
        platform.start(sandbox_id)
        assert platform.wait_until(sandbox_id, "Running", timeout=WAIT_S).phase == "Running"
        (resumed,) = core.list_pod_for_all_namespaces(
            label_selector=f"warren.dev/workspace={workspace}"
        ).items
        assert resumed.metadata.uid == slot.metadata.uid, "resumed in the slot, not in a pod made for it"
        assert resumed.metadata.annotations.get("warren.dev/claimed-from") == RESUMES
        carried_on(api, platform, sandbox_id, resumed, before, image=record["image"], where="in the slot")
        platform.run(sandbox_id, ["sh", "-c", "echo resumed > /workspace/resumed && sync"], timeout=60)
        assert platform.read_file(sandbox_id, "/workspace/resumed") == b"resumed\n"
        # The slot taken, the pool makes another.
        wait_for(
            "a new slot waiting",
            lambda: [
                p
                for p in core.list_namespaced_pod(
                    namespace, label_selector=f"warren.dev/pool={RESUMES}"
                ).items
                if p.metadata.uid != slot.metadata.uid and p.spec.node_name
            ],
        )


# Run in a warren-control pod with its own database settings: the sandbox id is argv[1].
IDLE_SINCE_A_MINUTE = """
import os, sys
import sqlalchemy
moving = "UPDATE sandboxes SET idle_deadline_at = idle_deadline_at - interval '60 seconds' WHERE id = :id"
with sqlalchemy.create_engine(os.environ["WARREN_DATABASE_URL"]).begin() as db:
    print(db.execute(sqlalchemy.text(moving), {"id": sys.argv[1]}).rowcount)
"""


def idle_since_a_minute(core: client.CoreV1Api, sandbox_id: str) -> None:
    """Move the sandbox's idle deadline a minute earlier in the control plane's records."""
    selector = "app.kubernetes.io/name=warren-control"
    control = next(
        p
        for p in core.list_namespaced_pod(SYSTEM, label_selector=selector).items
        if p.status.phase == "Running"
    )
    out = stream(
        core.connect_get_namespaced_pod_exec,
        control.metadata.name,
        SYSTEM,
        container=control.spec.containers[0].name,
        command=["/opt/warren/control/bin/python", "-c", IDLE_SINCE_A_MINUTE, sandbox_id],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
    )
    assert str(out).strip().splitlines()[-1] == "1", out


def test_an_idle_sandbox_that_pauses_is_paused_and_its_next_exec_resumes_it(
    api: client.ApiClient, platform: Any
) -> None:
    core = client.CoreV1Api(api)
    with counting(platform, api, on_idle="pause", idle_timeout_s=60) as (sandbox_id, workspace, pod):
        before = state(core, pod)
        # The reaper (every few seconds) pauses it once its idle deadline passes: a minute
        # with no use at the shortest, which the test does not sit through. It moves the
        # deadline the last use set a minute earlier in the records, as a minute would.
        idle_since_a_minute(core, sandbox_id)
        paused = platform.wait_until(sandbox_id, "Stopped", timeout=WAIT_S)
        assert paused.phase == "Stopped"
        print("paused:", paused.conditions)
        wait_for("the image sealed", lambda: sealed_image(api, pod))  # paused, not only stopped
        listed = core.list_pod_for_all_namespaces(label_selector=f"warren.dev/workspace={workspace}").items
        assert listed == [], "a paused sandbox holds no pod"
        # An exec is use: it resumes the sandbox and then runs, in the restored process's
        # sandbox (the counter carried on).
        done = platform.run(sandbox_id, ["cat", "/tmp/state"], timeout=120)
        assert done.exit_code == 0, done
        secret, count = done.stdout.decode().split()
        assert secret == before[0] and int(count) >= before[1]
        assert platform.get(sandbox_id).phase == "Running"


def in_storage(core: client.CoreV1Api, workspace: str) -> bool:
    """Whether object storage still holds `workspace`."""
    script = f"""
from warren_blockd.workspace import Workspace
try:  # a released workspace, or one never stored, is refused
    Workspace(store, {workspace!r}).replicated_seq()
    print("kept")
except Exception:
    print("gone")
"""
    return in_blockd(core, script) == "kept"


def test_a_paused_sandbox_is_proved_by_a_restore_and_forks_with_its_memory(
    api: client.ApiClient, platform: Any, counter: tuple[str, str, Any]
) -> None:
    core = client.CoreV1Api(api)
    sandbox_id, workspace, pod = counter
    before = state(core, pod)
    platform.stop(sandbox_id, memory=True)
    assert platform.wait_until(sandbox_id, "Stopped", timeout=WAIT_S).phase == "Stopped"

    # A restore point only once a pod restored from it ran: onto a fork of the workspace,
    # in a pod nothing serves, which then goes with its workspace.
    wait_for("the API to show the proof", lambda: memory_condition(platform, sandbox_id, "Captured"))
    record = sandbox_status(api, pod)["memoryImage"]
    print("proved:", record)
    check = record["verification"]
    assert record["verifiedAt"] and check["done"] and check["ms"] > 0
    assert check["workspace"].startswith(f"{workspace}-v")
    assert not core.list_pod_for_all_namespaces(label_selector="warren.dev/verifies").items
    assert not in_storage(core, check["workspace"]), "the proof's workspace is released"
    assert in_storage(core, workspace)

    # A fork of the paused sandbox: each child is restored from its memory image onto its
    # own fork of the workspace, so it carries the parent's process on from the pause.
    results = platform.fork(sandbox_id, count=2)
    assert all(r.ok for r in results), results
    children = [str(r.sandbox.id) for r in results if r.sandbox is not None]
    try:
        for child in children:
            assert platform.wait_until(child, "Running", timeout=WAIT_S).phase == "Running"
            secret, count = api_state(platform, child)
            assert secret == before[0], "the child has the secret the parent drew before the pause"
            assert count >= before[1]
            wait_for(
                "the child's counter to count on", lambda c=child, n=count: api_state(platform, c)[1] > n
            )
            assert platform.read_file(child, "/workspace/kept") == b"kept\n"
            assert memory_condition(platform, child, "Restored") is not None
            names = platform.run(child, ["sh", "-c", "hostname; cat /proc/sys/kernel/random/boot_id"])
            print("child", child, "hostname and boot id:", names.stdout.decode().split())
        # Fresh entropy: the first bytes each child's kernel gives after the restore differ
        # (a random generator restored with the image would give every child the same).
        draw = ["sh", "-c", "head -c 16 /dev/urandom | od -An -tx1"]
        drawn = {platform.run(child, draw).stdout for child in children}
        assert len(drawn) == len(children), "two children of one image drew the same random bytes"
        # Each its own sandbox: a write in one is seen in no other, nor in the parent's.
        platform.run(children[0], ["sh", "-c", "echo mine > /workspace/mine && sync"], timeout=60)
        seen = platform.run(children[1], ["cat", "/workspace/mine"], timeout=60)
        assert seen.exit_code != 0, "a write of one child shows in another"
    finally:
        for child in children:
            platform.delete(child)

    # The parent's image is still its restore point: it resumes from it.
    platform.start(sandbox_id)
    assert platform.wait_until(sandbox_id, "Running", timeout=WAIT_S).phase == "Running"
    assert api_state(platform, sandbox_id)[0] == before[0]
    from warren_control.sdk import WarrenError

    with pytest.raises(WarrenError) as missing:
        platform.read_file(sandbox_id, "/workspace/mine")
    assert missing.value.status == 404, "a child's write shows in its parent"
