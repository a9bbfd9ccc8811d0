"""The control plane deployed on the local cluster as `make deploy` deploys it (tests/cluster/run.sh
runs playbooks/site.yml with the local inventory), and the issue's acceptance path through the
`warren sandbox` CLI against it: create a sandbox, `echo hi` in it, fork it, read a file from
the children, delete them all.

Forking needs the workspace layer (warren-blockd and the object store). With it, the
parent writes a file in /workspace, is forked twice in one call and once more, every child sees
the file, a change in one child shows in no other sandbox, and all four are deleted. A deployment
without it (`cluster.workspaces.enabled: false`) must refuse the fork with exactly the API's named
`unsupported_capability`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from warren_common.testing import wait_for

from warren.config import ClusterConfig

pytestmark = pytest.mark.cluster

WAIT = "400"  # seconds a CLI command waits for a phase: a cold gVisor start on a busy 2-core machine
SMALL = ("--cpu-millis", "100", "--memory-mib", "128")
FORK_REFUSED = (
    "error: unsupported_capability: workspaces: a fork needs the workspace layer, "
    "which this deployment does not have\n"
)


def run(
    env: dict[str, str], program: str, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """A program of this environment (kubectl: from the cluster binaries on PATH)."""
    local = Path(sys.executable).parent / program
    cmd = [str(local) if local.exists() else program, *args]
    return subprocess.run(cmd, input=stdin, capture_output=True, env=env, check=False, timeout=900)


def ok(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, f"{result.args}:\n{result.stdout!r}\n{result.stderr.decode()}"
    return result.stdout.decode()


def sandbox(
    env: dict[str, str], *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    return run(env, "warren", "sandbox", "--timeout", WAIT, *args, stdin=stdin)


def read(env: dict[str, str], sandbox_id: str, path: str) -> bytes:
    got = sandbox(env, "read-file", sandbox_id, path)
    assert got.returncode == 0, got.stderr.decode()
    return got.stdout


CONTROL = "/opt/warren/control/bin/warren-control"  # in the warren-control image


def admin(env: dict[str, str], state: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """`warren-control admin` in a control-plane pod, on the records it serves from."""
    kubeconfig = str(state / "admin.kubeconfig")
    where = ["-n", "warren-system", "exec", "deployment/warren-control", "-c", "control", "--"]
    return run(env, "kubectl", "--kubeconfig", kubeconfig, *where, CONTROL, "admin", *args)


def test_admin_commands_on_the_live_records(env: dict[str, str], state: Path) -> None:
    token = ok(admin(env, state, "issue-key", "default", "tester")).strip()
    with_token = {**env, "WARREN_API_KEY": token}
    ok(sandbox(with_token, "list"))
    key_id = ok(admin(env, state, "revoke-key", token)).strip()
    listed = ok(admin(env, state, "list-keys", "--json", "--org", "default"))
    rows = {row["key_id"]: row for row in map(json.loads, listed.splitlines())}
    assert rows[key_id]["revoked_at"] and rows[key_id]["user"] == "tester"
    refused = sandbox(with_token, "list")
    assert refused.returncode == 1
    assert refused.stderr.decode().startswith("error: unauthenticated:")


@pytest.fixture
def made(env: dict[str, str]) -> Iterator[list[str]]:
    """Sandboxes a test made; whatever it did not delete itself is deleted afterwards."""
    ids: list[str] = []
    yield ids
    for sandbox_id in ids:
        sandbox(env, "delete", "--no-wait", sandbox_id)


def test_acceptance_path_through_the_cli(
    env: dict[str, str], settings: ClusterConfig, made: list[str]
) -> None:
    from warren.node.images import busybox_image

    started = time.monotonic()
    parent = ok(sandbox(env, "create", *SMALL, busybox_image(), "--", "sleep", "86400")).strip()
    made.append(parent)
    assert parent.startswith("sbx_")
    print(f"timing: create to Running through the CLI: {time.monotonic() - started:.1f} s")

    hi = sandbox(env, "exec", parent, "--", "echo", "hi")
    assert (hi.returncode, hi.stdout, hi.stderr) == (0, b"hi\n", b"")
    assert sandbox(env, "exec", parent, "--", "sh", "-c", "exit 3").returncode == 3
    # Through the sandbox's agent (the command's parent), not Kubernetes exec; stdin too.
    parent_of = ok(sandbox(env, "exec", parent, "--", "sh", "-c", "cat /proc/$PPID/cmdline"))
    assert "/.warren/agent" in parent_of, parent_of
    piped = sandbox(env, "exec", "--stdin", parent, "--", "wc", "-c", stdin=b"\x00y" * 50_000)
    assert (piped.returncode, piped.stdout.strip()) == (0, b"100000")

    # The workspace is what a fork carries; without one, /tmp stands in for the file checks.
    workspaces = settings.sandbox_workspaces
    path = "/workspace/note" if workspaces else "/tmp/note"
    note = b"written in the parent\n\x00\xff"
    ok(sandbox(env, "write-file", parent, path, stdin=note))
    assert read(env, parent, path) == note
    assert parent in ok(sandbox(env, "list"))

    started = time.monotonic()
    forked = sandbox(env, "fork", "--count", "2", parent)
    if not workspaces:
        assert (forked.returncode, forked.stdout, forked.stderr.decode()) == (1, b"", FORK_REFUSED)
        assert len(ok(sandbox(env, "--json", "list")).splitlines()) == 1
    else:
        children = ok(forked).split()
        made.extend(children)
        children += ok(sandbox(env, "fork", parent)).split()
        made.extend(children[2:])
        elapsed = time.monotonic() - started
        print(f"timing: two forks (2 + 1 children) to Running through the CLI: {elapsed:.1f} s")
        assert len(set(children)) == 3 and parent not in children
        for child in children:
            assert read(env, child, path) == note
        assert ok(sandbox(env, "exec", children[1], "--", "echo", "hi")) == "hi\n"
        # A change in one child stays in that child.
        changed = b"changed in the first child only\n"
        ok(sandbox(env, "write-file", children[0], path, stdin=changed))
        assert read(env, children[0], path) == changed
        for other in (parent, *children[1:]):
            assert read(env, other, path) == note

    for sandbox_id in list(made):
        assert ok(sandbox(env, "delete", sandbox_id)).strip() == sandbox_id
        made.remove(sandbox_id)
        gone = sandbox(env, "get", sandbox_id)
        assert gone.returncode == 1 and gone.stderr.decode().startswith("error: not_found:"), gone.stderr
    assert ok(sandbox(env, "--json", "list")) == ""


def pool(env: dict[str, str], state: Path, name: str = "base") -> dict[str, Any]:
    kubeconfig = str(state / "admin.kubeconfig")
    found = ok(
        run(
            env,
            "kubectl",
            "--kubeconfig",
            kubeconfig,
            "-n",
            "warren-sandboxes",
            "get",
            "sandboxpool",
            name,
            "-o",
            "json",
        )
    )
    got: dict[str, Any] = json.loads(found)
    return got


def full(env: dict[str, str], state: Path, name: str = "base") -> dict[str, Any] | None:
    found = pool(env, state, name)
    return found if (found.get("status") or {}).get("ready") == found["spec"]["size"] else None


def test_a_create_of_the_base_template_claims_a_warm_pod_with_a_new_workspace_of_its_own(
    env: dict[str, str], state: Path, settings: ClusterConfig, made: list[str]
) -> None:
    """The deployment keeps a pool of the base template (services.pools): a create of base's
    image and size claims one of its ready pods, is bound to that pod's new, empty workspace,
    writes to it and forks it like any other sandbox; the pool refills."""
    if not settings.sandbox_workspaces:
        pytest.skip("the pool's pods carry workspaces, which this deployment does not have")
    image = wait_for(lambda: full(env, state), 300, "the base pool to be full")["spec"]["image"]
    box = json.loads(ok(sandbox(env, "--json", "create", image)))
    made.append(box["id"])
    seen = json.loads(ok(sandbox(env, "get", box["id"])))
    (claimed,) = [c for c in seen["conditions"] if c["type"] == "PoolClaimed"]
    assert (claimed["status"], claimed["reason"]) == ("True", "Claimed"), seen
    assert seen["workspace_id"], seen
    # Nothing of anyone before: a new ext4 file system, on the workspace's own device.
    listed = ok(sandbox(env, "exec", box["id"], "--", "ls", "-A", "/workspace")).split()
    assert listed in ([], ["lost+found"]), listed
    note = b"written in a claimed pool pod\n"
    ok(sandbox(env, "write-file", box["id"], "/workspace/note", stdin=note))
    (child,) = ok(sandbox(env, "fork", box["id"])).split()
    made.append(child)
    assert read(env, child, "/workspace/note") == note
    child_seen = json.loads(ok(sandbox(env, "get", child)))
    assert child_seen["workspace_id"] not in (None, seen["workspace_id"])
    wait_for(lambda: full(env, state), 300, "the base pool to refill")
    for sandbox_id in (child, box["id"]):
        ok(sandbox(env, "delete", sandbox_id))
        made.remove(sandbox_id)


def test_the_children_of_a_fork_of_base_claim_fork_pool_pods_and_take_their_fork_there(
    env: dict[str, str], state: Path, settings: ClusterConfig, made: list[str]
) -> None:
    """With services.pools.base.forks (warren-test.yaml: 3), a fork of a base sandbox into
    four children: three claim pods of base-forks, whose sandbox container already runs:
    the node's warren-blockd binds each child's fork beneath that container's root file
    system (the local node's containerd state is a shared mount), and nothing starts. The
    fourth finds the pool empty and starts cold, saying so. Every child has the parent's
    files, a write in one shows nowhere else, and reaches that child's workspace itself (a
    fork of the child has it)."""
    if not settings.sandbox_workspaces:
        pytest.skip("forks need workspaces, which this deployment does not have")
    image = wait_for(lambda: full(env, state), 300, "the base pool to be full")["spec"]["image"]
    forks = wait_for(lambda: full(env, state, "base-forks"), 300, "the fork pool to be full")
    assert forks is not None
    size = int(forks["spec"]["size"])
    parent = json.loads(ok(sandbox(env, "--json", "create", image)))["id"]
    made.append(parent)
    note = b"written in the parent before the fork\n"
    ok(sandbox(env, "write-file", parent, "/workspace/note", stdin=note))
    children = ok(sandbox(env, "fork", "--count", str(size + 1), parent)).split()
    made.extend(children)
    how: dict[str, tuple[str, str, str]] = {}
    for child in children:
        seen = json.loads(ok(sandbox(env, "get", child)))
        (claimed,) = [c for c in seen["conditions"] if c["type"] == "PoolClaimed"]
        how[child] = (claimed["status"], claimed["reason"], claimed["message"])
        # The pod it claimed is the cluster's business: no answer names it.
        assert not re.search(r"pool-base-forks-[0-9a-f]{10}", json.dumps(seen)), seen
        assert read(env, child, "/workspace/note") == note
    from_pool = [c for c, (status, _, message) in how.items() if status == "True" and "base-forks" in message]
    assert len(from_pool) == size, how
    assert all("beneath its running container" in how[c][2] for c in from_pool), how
    (cold,) = [c for c in children if c not in from_pool]
    assert how[cold][:2] == ("False", "PoolEmpty"), how[cold]
    # The claimed child's workspace is its own, and what it writes there is in it: not in
    # its container's root file system (gVisor's root overlay is off for these pods).
    changed = b"changed in one child only\n"
    ok(sandbox(env, "write-file", from_pool[0], "/workspace/note", stdin=changed))
    assert read(env, from_pool[0], "/workspace/note") == changed
    for other in (parent, cold, *from_pool[1:]):
        assert read(env, other, "/workspace/note") == note
    (grandchild,) = ok(sandbox(env, "fork", "--count", "1", from_pool[0])).split()
    made.append(grandchild)
    assert read(env, grandchild, "/workspace/note") == changed
    for sandbox_id in (grandchild, *children, parent):
        ok(sandbox(env, "delete", sandbox_id))
        made.remove(sandbox_id)
    wait_for(lambda: full(env, state, "base-forks"), 300, "the fork pool to refill")


def kube(env: dict[str, str], state: Path, *args: str) -> str:
    return ok(run(env, "kubectl", "--kubeconfig", str(state / "admin.kubeconfig"), *args))


def node_of_workspace(env: dict[str, str], state: Path, workspace: str) -> str:
    pods = json.loads(
        kube(env, state, "get", "pods", "-A", "-l", f"warren.dev/workspace={workspace}", "-o", "json")
    )
    (node,) = {p["spec"]["nodeName"] for p in pods["items"] if not p["metadata"].get("deletionTimestamp")}
    return str(node)


def test_a_forks_child_on_another_node_starts_from_every_write_its_source_made(
    env: dict[str, str], state: Path, settings: ClusterConfig, made: list[str]
) -> None:
    """Two nodes: the parent runs on one and every ready pod of the fork pool on the other,
    so its child claims one there. The parent's node forks the child (freezing the parent
    until its writes are in object storage) and the child's node binds it as stored: the
    child has the note written just before the fork, and its PoolClaimed condition says it
    crossed nodes."""
    if not settings.sandbox_workspaces:
        pytest.skip("forks need workspaces, which this deployment does not have")
    if not settings.joined_nodes:
        pytest.fail("the cross-node fork needs a second node: cluster.joined_nodes in warren-test.yaml")
    image = wait_for(lambda: full(env, state), 300, "the base pool to be full")["spec"]["image"]
    parent = json.loads(ok(sandbox(env, "--json", "create", image)))
    made.append(parent["id"])
    here = node_of_workspace(env, state, json.loads(ok(sandbox(env, "get", parent["id"])))["workspace_id"])
    kube(env, state, "cordon", here)
    try:  # the fork pool's pods beside the parent go, and come back on the other node
        pods = ("-n", "warren-sandboxes", "-l", "warren.dev/pool=base-forks")
        kube(env, state, "delete", "pods", *pods, "--field-selector", f"spec.nodeName={here}", "--wait=false")

        def elsewhere() -> bool:
            found = json.loads(kube(env, state, "get", "pods", *pods, "-o", "json"))["items"]
            nodes = {p["spec"].get("nodeName") for p in found if not p["metadata"].get("deletionTimestamp")}
            return here not in nodes and full(env, state, "base-forks") is not None

        wait_for(elsewhere, 300, f"the fork pool's ready pods all off {here}")
    finally:
        kube(env, state, "uncordon", here)
    note = b"written in the parent just before the fork\n"
    ok(sandbox(env, "write-file", parent["id"], "/workspace/note", stdin=note))
    (child,) = ok(sandbox(env, "fork", parent["id"])).split()
    made.append(child)
    seen = json.loads(ok(sandbox(env, "get", child)))
    (claimed,) = [c for c in seen["conditions"] if c["type"] == "PoolClaimed"]
    assert claimed["status"] == "True" and "forked on its source's node" in claimed["message"], claimed
    assert node_of_workspace(env, state, seen["workspace_id"]) != here
    assert read(env, child, "/workspace/note") == note
    for sandbox_id in (child, parent["id"]):
        ok(sandbox(env, "delete", sandbox_id))
        made.remove(sandbox_id)


def listed(env: dict[str, str]) -> set[str]:
    return {json.loads(line)["id"] for line in ok(sandbox(env, "--json", "list")).splitlines()}


def test_a_fork_whose_children_no_node_can_take_ends_with_the_schedulers_reason(
    env: dict[str, str], state: Path, settings: ClusterConfig, made: list[str]
) -> None:
    """A fork's cold children go to their parent's node; with that node cordoned, none can
    be placed. `warren sandbox fork` ends (exit 1) within its --unschedulable-for, naming
    each child with the scheduler's own reason, instead of waiting out its timeout."""
    if not settings.sandbox_workspaces:
        pytest.skip("forks need workspaces, which this deployment does not have")
    from warren.node.images import busybox_image

    parent = ok(sandbox(env, "create", *SMALL, busybox_image(), "--", "sleep", "86400")).strip()
    made.append(parent)
    before = listed(env)
    here = node_of_workspace(env, state, json.loads(ok(sandbox(env, "get", parent)))["workspace_id"])
    kube(env, state, "cordon", here)
    try:
        forked = sandbox(env, "--unschedulable-for", "10", "fork", "--count", "2", parent)
    finally:
        kube(env, state, "uncordon", here)
    children = listed(env) - before
    made.extend(children)
    err = forked.stderr.decode()
    assert forked.returncode == 1 and forked.stdout == b"", err
    failures = [line for line in err.splitlines() if line.startswith("child ")]
    assert len(failures) == 2 and len(children) == 2, err
    # cannot_start with the scheduler's words: the command ended before its --timeout.
    assert all("cannot_start" in line and "nodes are available" in line for line in failures), err


def pool_pod_on(env: dict[str, str], state: Path, node: str, pool: str = "base") -> dict[str, Any]:
    """A ready pod of `pool` on `node`: one there already, or a pod elsewhere deleted while
    the other nodes are cordoned, so that the pool refills on `node`."""
    pods = ("-n", "warren-sandboxes", "-l", f"warren.dev/pool={pool}")

    def found() -> dict[str, Any] | None:
        items = json.loads(kube(env, state, "get", "pods", *pods, "-o", "json"))["items"]
        ready = [
            p
            for p in items
            if p["spec"].get("nodeName") == node
            and not p["metadata"].get("deletionTimestamp")
            and any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []
            )
        ]
        return ready[0] if ready and full(env, state, pool) else None

    if (pod := found()) is not None:
        return pod
    others = [str(n) for n in kube(env, state, "get", "nodes", "-o", "name").split() if n != f"node/{node}"]
    for other in others:
        kube(env, state, "cordon", other)
    try:
        kube(
            env, state, "delete", "pods", *pods, "--field-selector", f"spec.nodeName!={node}", "--wait=false"
        )
        placed: dict[str, Any] = wait_for(found, 300, f"a ready pod of pool {pool} on {node}")
    finally:
        for other in others:
            kube(env, state, "uncordon", other)
    return placed


def test_a_mount_made_under_a_running_pool_pods_workspace_is_seen_only_by_a_container_started_after_it(
    env: dict[str, str], state: Path, settings: ClusterConfig, first_node: str
) -> None:
    """What a fork's children can take from a pool under gVisor. A pool pod would have to take
    the forked workspace after its gVisor sandbox started. The host mounts a file system
    beneath a ready pool pod's workspace, as a claim would have to. The container already
    running still sees its own empty directory there (its gofer serves the mounts it was
    given when it started), never what was mounted later; a container started in the same
    sandbox afterwards (an ephemeral container through the pod's ephemeralcontainers
    subresource, allowed by the floor) mounts the same volume and sees the new file system,
    and its writes reach the host's."""
    if not settings.sandbox_workspaces:
        pytest.skip("the pool's pods carry workspaces, which this deployment does not have")
    # On the first node: its pods' volumes are mounted where the host sees them (a joined
    # node's stay in its own mount namespace).
    pod = pool_pod_on(env, state, first_node)
    kube = ("--kubeconfig", str(state / "admin.kubeconfig"), "-n", "warren-sandboxes")
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    volume = state / "node" / "kubelet" / "pods" / uid / "volumes" / "kubernetes.io~csi" / "workspace"
    late = volume / "mount" / "late"
    late.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "late", str(late)], check=True)

    def listing(container: str) -> list[str]:
        inside = run(
            env, "kubectl", *kube, "exec", name, "-c", container, "--", "ls", "-A", "/workspace/late"
        )
        assert inside.returncode == 0, inside.stderr.decode()
        return inside.stdout.decode().split()

    try:
        (late / "marker").write_text("mounted after the sandbox started\n")
        assert listing("sandbox") == []
        container = {
            "name": "late",
            "image": pod["spec"]["containers"][0]["image"],
            "imagePullPolicy": "Never",
            "command": ["sleep", "600"],
            "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}],
        }
        patch = json.dumps({"spec": {"ephemeralContainers": [container]}})
        ok(
            run(
                env,
                "kubectl",
                *kube,
                "patch",
                "pod",
                name,
                "--subresource",
                "ephemeralcontainers",
                "-p",
                patch,
            )
        )

        def late_running() -> bool:
            seen = json.loads(ok(run(env, "kubectl", *kube, "get", "pod", name, "-o", "json")))
            statuses = seen["status"].get("ephemeralContainerStatuses") or []
            return any("running" in (status.get("state") or {}) for status in statuses)

        wait_for(late_running, 120, "the ephemeral container to run")
        assert listing("late") == ["marker"]
        written = run(
            env, "kubectl", *kube, "exec", name, "-c", "late", "--", "touch", "/workspace/late/written"
        )
        assert written.returncode == 0, written.stderr.decode()
        assert (late / "written").exists()
        assert listing("sandbox") == []  # the first container's view never changes
    finally:
        subprocess.run(["umount", str(late)], check=True)
        late.rmdir()
        # The pod saw the experiment: it goes, its workspace with it, and the pool refills.
        ok(run(env, "kubectl", *kube, "delete", "pod", name, "--wait=false"))
    wait_for(lambda: full(env, state), 300, "the base pool to refill")


def test_an_image_the_node_lacks_is_never_pulled(env: dict[str, str], made: list[str]) -> None:
    """The local node has no registry: the deployment's pods never pull, and say so."""
    absent = "warren.invalid/no-such-image:0"
    box = ok(sandbox(env, "create", "--no-wait", *SMALL, absent, "--", "sleep", "60")).strip()
    made.append(box)
    deadline = time.monotonic() + 180
    while True:
        seen = json.loads(ok(sandbox(env, "get", box)))
        if "ErrImageNeverPull" in [c.get("reason") for c in seen["conditions"]]:
            break
        assert time.monotonic() < deadline, seen
        time.sleep(1)
    assert seen["phase"] == "Pending"
    ok(sandbox(env, "delete", box))
    made.remove(box)
