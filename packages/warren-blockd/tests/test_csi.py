"""The CSI node plugin end to end: real gRPC over unix sockets (the generated stubs as the
client, as kubelet would call), a real warren-blockd daemon, a real SeaweedFS, real mounts."""

from __future__ import annotations

import json
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import Blockd, Weed, make_bucket
from warren_blockd.csi.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from warren_blockd.testing import CsiPluginProcess

pytestmark = pytest.mark.integration

Mode = csi_pb2.VolumeCapability.AccessMode


def capability(mode: int = Mode.SINGLE_NODE_WRITER, *, block: bool = False) -> csi_pb2.VolumeCapability:
    access = Mode(mode=mode)  # type: ignore[arg-type]
    if block:
        return csi_pb2.VolumeCapability(block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=access)
    return csi_pb2.VolumeCapability(mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=access)


def pod_context(pod: str = "pod-1", **attributes: str) -> dict[str, str]:
    """What kubelet sends for an inline volume of a driver with podInfoOnMount."""
    return {
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.name": pod,
        "csi.storage.k8s.io/pod.namespace": "sandboxes",
        "csi.storage.k8s.io/pod.uid": f"uid-{pod}",
        "csi.storage.k8s.io/serviceAccount.name": "default",
        **attributes,
    }


def mount_options(target: Path) -> set[str] | None:
    """The per-mount options of the mount on top at `target`, read from the mount table."""
    found = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4] == str(target):
            found = set(fields[5].split(","))
    return found


def mounts_at(target: Path) -> int:
    return sum(
        1
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split(" ")[4] == str(target)
    )


def events(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


@dataclass
class Csi:
    plugin: CsiPluginProcess
    identity: csi_pb2_grpc.IdentityStub
    node: csi_pb2_grpc.NodeStub
    registration: pluginregistration_pb2_grpc.RegistrationStub
    pods: Path

    def target(self, volume_id: str) -> Path:
        """Kubelet's layout: it makes the volume's directory, the plugin makes `mount`."""
        volume_dir = self.pods / volume_id
        volume_dir.mkdir(parents=True, exist_ok=True)
        return volume_dir / "mount"

    def publish(
        self,
        volume_id: str,
        context: dict[str, str],
        *,
        readonly: bool = False,
        cap: csi_pb2.VolumeCapability | None = None,
    ) -> Path:
        target = self.target(volume_id)
        self.node.NodePublishVolume(
            csi_pb2.NodePublishVolumeRequest(
                volume_id=volume_id,
                target_path=str(target),
                volume_capability=cap or capability(),
                readonly=readonly,
                volume_context=context,
            ),
            timeout=120,
        )
        return target

    def unpublish(self, volume_id: str) -> None:
        self.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=str(self.target(volume_id))),
            timeout=120,
        )


@pytest.fixture
def node(blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str) -> Blockd:
    return blockd_factory(f"s3://{bucket}", seaweedfs)


def start_plugin(root: Path, node: Blockd, replicate_wait: str = "60") -> tuple[Csi, list[grpc.Channel]]:
    plugin = CsiPluginProcess(root, node.socket, "test-node", "--replicate-wait", replicate_wait)
    csi_channel = grpc.insecure_channel(f"unix:{plugin.endpoint}")
    registration_channel = grpc.insecure_channel(f"unix:{plugin.registration_socket}")
    csi = Csi(
        plugin,
        csi_pb2_grpc.IdentityStub(csi_channel),
        csi_pb2_grpc.NodeStub(csi_channel),
        pluginregistration_pb2_grpc.RegistrationStub(registration_channel),
        root / "pods",
    )
    return csi, [csi_channel, registration_channel]


def stop_plugin(csi: Csi, channels: list[grpc.Channel]) -> None:
    for channel in channels:
        channel.close()
    csi.plugin.stop()
    # Binds a failed test left behind go before the daemons stop (their fixture is next).
    mounts = subprocess.run(
        ["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True, check=False
    ).stdout.split()
    for target in sorted((m for m in mounts if m.startswith(str(csi.pods))), reverse=True):
        subprocess.run(["umount", "-l", target], check=False, capture_output=True)


@pytest.fixture
def csi(node: Blockd, tmp_path: Path) -> Iterator[Csi]:
    plugin, channels = start_plugin(tmp_path / "csi", node)
    yield plugin
    stop_plugin(plugin, channels)


def rpc_error(call: Callable[[], object]) -> grpc.Call:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error = caught.value
    assert isinstance(error, grpc.Call)
    return error


# -- registration and identity ---------------------------------------------------------


def test_kubelet_registration_and_identity(csi: Csi) -> None:
    info = csi.registration.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=10)
    assert info.type == "CSIPlugin"
    assert info.name == "blockd.warren.dev"
    assert info.endpoint == str(csi.plugin.endpoint)
    assert "1.0.0" in info.supported_versions
    csi.registration.NotifyRegistrationStatus(
        pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=10
    )
    assert csi.plugin.proc.poll() is None

    plugin_info = csi.identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10)
    assert plugin_info.name == "blockd.warren.dev" and plugin_info.vendor_version
    assert csi.identity.Probe(csi_pb2.ProbeRequest(), timeout=10).ready.value is True
    assert csi.node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=10).node_id == "test-node"
    assert (
        list(csi.node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=10).capabilities)
        == []
    )
    staged = rpc_error(lambda: csi.node.NodeStageVolume(csi_pb2.NodeStageVolumeRequest(), timeout=10))
    assert staged.code() == grpc.StatusCode.UNIMPLEMENTED
    # Both sockets are root's alone: whoever reaches them can mount workspaces.
    assert csi.plugin.endpoint.stat().st_mode & 0o077 == 0
    assert csi.plugin.registration_socket.stat().st_mode & 0o077 == 0


def test_a_refused_registration_ends_the_plugin_and_probe_needs_the_daemon(
    csi: Csi, node: Blockd, tmp_path: Path
) -> None:
    other, channels = start_plugin(tmp_path / "other-csi", node)
    try:
        other.registration.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error="version mismatch"),
            timeout=10,
        )
        assert other.plugin.proc.wait(timeout=30) == 1
        assert not other.plugin.registration_socket.exists()
        refused = [e for e in events(other.plugin.log()) if e["event"].startswith("kubelet refused")]
        assert refused and refused[0]["error"] == "version mismatch"
    finally:
        for channel in channels:
            channel.close()
        other.plugin.stop()
    node.stop()
    probe = rpc_error(lambda: csi.identity.Probe(csi_pb2.ProbeRequest(), timeout=10))
    assert probe.code() == grpc.StatusCode.UNAVAILABLE
    assert "is `warren-blockd serve` running" in (probe.details() or "")


# -- publish and unpublish -------------------------------------------------------------


def test_publish_new_workspace_then_unpublish_replicates_and_restores_on_an_empty_node(
    csi: Csi, node: Blockd, blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str
) -> None:
    target = csi.publish("csi-vol-1", pod_context(workspace="ws_first", size="64Mi"))
    options = mount_options(target)
    assert options is not None and {"nosuid", "nodev", "rw"} <= options
    (target / "hello.txt").write_text("hello from the pod\n")
    published = [e for e in events(csi.plugin.log()) if e["event"] == "published"]
    assert published[-1]["how"] == "created" and published[-1]["pod"] == "sandboxes/pod-1"

    csi.unpublish("csi-vol-1")
    assert mount_options(target) is None and not target.exists()
    done = [e for e in events(csi.plugin.log()) if e["event"] == "unpublished"]
    assert done[-1]["workspace"] == "ws_first" and done[-1]["receipt"] == "replicated"
    flushed = [e for e in events(csi.plugin.log()) if e["event"] == "flushed"]
    assert flushed[-1]["receipt"] == "replicated"
    assert node.client.stats()["workspaces"] == {}  # detached: durable in storage, not held here

    # The daemon restarts with an empty node disk: the workspace comes back from storage.
    node.stop()
    shutil.rmtree(node.state / "node")
    blockd_factory(f"s3://{bucket}", seaweedfs, name="node")
    again = csi.publish("csi-vol-2", pod_context(pod="pod-2", workspace="ws_first", size="64Mi"))
    assert (again / "hello.txt").read_text() == "hello from the pod\n"
    published = [e for e in events(csi.plugin.log()) if e["event"] == "published"]
    assert published[-1]["how"] == "restored"
    csi.unpublish("csi-vol-2")


def test_unpublish_during_a_storage_outage_goes_on_with_a_local_receipt_and_the_spool_replays(
    blockd_factory: Callable[..., Blockd], tmp_path: Path
) -> None:
    weed = Weed(tmp_path / "weed")
    (tmp_path / "weed").mkdir()
    weed.start()
    csi: Csi | None = None
    channels: list[grpc.Channel] = []
    try:
        node = blockd_factory(f"s3://{make_bucket(weed.endpoint)}", weed.endpoint)
        csi, channels = start_plugin(tmp_path / "csi", node, replicate_wait="2")
        target = csi.publish("csi-vol-1", pod_context(workspace="ws-outage", size="64Mi"))
        # Warm the node cache: cold reads during an outage fail; only writes are under test.
        device = node.client.stats()["workspaces"]["ws-outage"]["device"]
        subprocess.run(["dd", f"if={device}", "of=/dev/null", "bs=1M"], check=True, capture_output=True)
        weed.stop()
        (target / "late.txt").write_text("written while storage was down\n")
        csi.unpublish("csi-vol-1")  # bounded: the pod can go although storage is away
        assert mount_options(target) is None
        warned = [e for e in events(csi.plugin.log()) if e["event"].startswith("not replicated within 2s")]
        assert warned and warned[0]["receipt"] == "local"
        done = [e for e in events(csi.plugin.log()) if e["event"] == "unpublished"]
        assert done[-1]["receipt"] == "local"

        weed.start()  # the daemon's spool drains; the next publish waits for it (kubelet retries)
        deadline = time.monotonic() + 120
        while True:
            try:
                again = csi.publish("csi-vol-2", pod_context(pod="pod-2", workspace="ws-outage"))
                break
            except grpc.RpcError as exc:
                assert isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert time.monotonic() < deadline, exc
                time.sleep(1)
        assert (again / "late.txt").read_text() == "written while storage was down\n"
        csi.unpublish("csi-vol-2")
    finally:
        if csi is not None:
            stop_plugin(csi, channels)
        weed.stop()


def test_fork_of_a_published_workspace_sees_its_files_and_diverges(csi: Csi) -> None:
    a = csi.publish("csi-vol-a", pod_context(pod="pod-a", workspace="ws-a", size="64Mi"))
    (a / "note.txt").write_text("original\n")
    # A stays published: the daemon freezes it while its writes reach storage.
    b = csi.publish("csi-vol-b", pod_context(pod="pod-b", workspace="ws-b", size="64Mi", forkOf="ws-a"))
    assert (b / "note.txt").read_text() == "original\n"
    (b / "note.txt").write_text("changed in b\n")
    (b / "only-in-b").write_text("b\n")
    assert (a / "note.txt").read_text() == "original\n"
    assert not (a / "only-in-b").exists()
    (a / "note.txt").write_text("changed in a\n")
    assert (b / "note.txt").read_text() == "changed in b\n"
    published = [e for e in events(csi.plugin.log()) if e["event"] == "published"]
    assert published[-1]["workspace"] == "ws-b" and published[-1]["how"] == "forked"
    csi.unpublish("csi-vol-b")
    csi.unpublish("csi-vol-a")


def bind_call(
    port: int, token: str, body: dict[str, Any], route: str = "/v1/bind"
) -> tuple[int, dict[str, Any]]:
    """One call to the plugin's bind API, as the controller makes it."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{route}",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:  # noqa: S310 (an http URL made here)
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@contextmanager
def bind_api(node: Blockd, tmp_path: Path, *extra: str) -> Iterator[tuple[Csi, int, str]]:
    """A CSI plugin serving its bind API on a TCP port with a token: (csi, port, token)."""
    token = secrets.token_hex(16)
    (tmp_path / "token").write_text(token + "\n")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    plugin = CsiPluginProcess(
        tmp_path / "csi",
        node.socket,
        "test-node",
        "--bind-listen",
        f"127.0.0.1:{port}",
        "--bind-token-file",
        str(tmp_path / "token"),
        *extra,
    )
    channel = grpc.insecure_channel(f"unix:{plugin.endpoint}")
    csi = Csi(
        plugin, csi_pb2_grpc.IdentityStub(channel), csi_pb2_grpc.NodeStub(channel), None, tmp_path / "pods"
    )  # type: ignore[arg-type]
    try:
        yield csi, port, token
    finally:
        channel.close()
        plugin.stop()


def test_a_bind_at_claim_volume_is_published_empty_and_takes_its_workspace_at_the_bind(
    node: Blockd, tmp_path: Path
) -> None:
    """A warm pool pod's volume for a fork's child: published with nothing mounted, then
    bound through the bind API (real TCP, the token) to a fork of a published workspace."""
    with bind_api(node, tmp_path) as (csi, port, token):
        parent = csi.publish("csi-parent", pod_context(pod="parent", workspace="ws-parent", size="64Mi"))
        (parent / "note.txt").write_text("the parent's\n")
        waiting = csi.publish("csi-pool", pod_context(pod="pool-1", bindAtClaim="true"))
        assert waiting.is_dir() and mounts_at(waiting) == 0
        csi.publish("csi-pool", pod_context(pod="pool-1", bindAtClaim="true"))  # a repeat: the same

        body = {"pod_uid": "uid-pool-1", "workspace": "ws-child", "forkOf": "ws-parent"}
        status, answer = bind_call(port, "not-the-token", body)
        assert (status, answer["error"]) == (401, "unauthorized")
        assert mounts_at(waiting) == 0
        status, answer = bind_call(port, token, {**body, "pod_uid": "uid-nobody"})
        assert (status, answer["error"]) == (404, "not_found"), answer
        status, answer = bind_call(port, token, {**body, "forkOf": "ws-absent"})
        assert (status, answer["error"]) == (404, "not_found"), answer
        assert mounts_at(waiting) == 0  # a failed bind leaves the volume awaiting its claim
        status, answer = bind_call(port, token, {**body, "size": "huge"})
        assert (status, answer["error"]) == (400, "bad_request"), answer

        status, answer = bind_call(port, token, body)
        assert status == 200, answer
        assert answer == {"workspace": "ws-child", "how": "forked"}
        assert (waiting / "note.txt").read_text() == "the parent's\n"
        assert mount_options(waiting) is not None and {"nosuid", "nodev"} <= mount_options(waiting)  # type: ignore[operator]
        (waiting / "note.txt").write_text("the child's\n")
        assert (parent / "note.txt").read_text() == "the parent's\n"
        assert bind_call(port, token, body) == (200, {"workspace": "ws-child", "how": "already bound"})
        status, answer = bind_call(port, token, {**body, "workspace": "ws-other"})
        assert (status, answer["error"]) == (409, "conflict"), answer

        # Never bound: its unpublish removes the directory and the record, nothing else.
        idle = csi.publish("csi-idle", pod_context(pod="pool-2", bindAtClaim="true"))
        csi.unpublish("csi-idle")
        assert not idle.exists()
        status, answer = bind_call(port, token, {**body, "pod_uid": "uid-pool-2", "workspace": "ws-late"})
        assert (status, answer["error"]) == (404, "not_found"), answer

        csi.unpublish("csi-pool")  # bound: flushed and replicated like any publication
        again = csi.publish("csi-again", pod_context(pod="later", workspace="ws-child"))
        assert (again / "note.txt").read_text() == "the child's\n"
        csi.unpublish("csi-again")
        csi.unpublish("csi-parent")


def runtime_bundle(state: Path, container_id: str, pod_uid: str, kind: str = "container") -> Path:
    """A running container as containerd keeps it for its shim: its bundle's config.json
    with the annotations CRI gives it, and its root file system mounted (a tmpfs stands in
    for the image's overlay; the cluster tier does this with a real gVisor pod)."""
    bundle = state / "io.containerd.runtime.v2.task" / "k8s.io" / container_id
    (bundle / "rootfs").mkdir(parents=True)
    notes = {"io.kubernetes.cri.sandbox-uid": pod_uid, "io.kubernetes.cri.container-type": kind}
    (bundle / "config.json").write_text(json.dumps({"annotations": notes}))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "rootfs", str(bundle / "rootfs")], check=True)
    return bundle / "rootfs"


def test_a_bind_naming_a_running_container_mounts_the_workspace_beneath_its_root_file_system(
    node: Blockd, tmp_path: Path
) -> None:
    """A bind-in-place pool pod: the bind names the pod's running container, and the child's
    fork is mounted at /workspace of that container's root file system, nosuid,nodev. Only a
    container of the pod the bind names, only a real directory there (never a symlink out of
    the root file system); the volume's unpublish takes the bind down and replicates."""
    state = tmp_path / "runtime-state"
    ours, theirs, sandbox = "a" * 64, "b" * 64, "c" * 64
    rootfs = runtime_bundle(state, ours, "uid-pool-1")
    runtime_bundle(state, theirs, "uid-someone-else")
    runtime_bundle(state, sandbox, "uid-pool-1", kind="sandbox")
    linked = runtime_bundle(state, "d" * 64, "uid-pool-3")
    outside = tmp_path / "outside"
    outside.mkdir()
    (linked / "workspace").symlink_to(outside)
    try:
        with bind_api(node, tmp_path, "--runtime-state", str(state)) as (csi, port, token):
            parent = csi.publish("csi-parent", pod_context(pod="parent", workspace="ws-parent", size="64Mi"))
            (parent / "note.txt").write_text("the parent's\n")
            waiting = csi.publish("csi-pool", pod_context(pod="pool-1", bindAtClaim="true"))
            csi.publish("csi-pool-3", pod_context(pod="pool-3", bindAtClaim="true"))
            body = {"pod_uid": "uid-pool-1", "workspace": "ws-child", "forkOf": "ws-parent"}
            for container, code in ((theirs, 409), (sandbox, 409), ("e" * 64, 404), ("../" + ours, 400)):
                status, answer = bind_call(port, token, {**body, "container_id": container})
                assert status == code, answer
                assert "fix" in answer and not (rootfs / "workspace").is_mount()
            status, answer = bind_call(
                port,
                token,
                {**body, "pod_uid": "uid-pool-3", "workspace": "ws-linked", "container_id": "d" * 64},
            )
            assert (status, answer["error"]) == (409, "conflict"), answer
            assert "symlink" in answer["message"] and not outside.is_mount() and not any(outside.iterdir())

            status, answer = bind_call(port, token, {**body, "container_id": ours})
            assert (status, answer) == (200, {"workspace": "ws-child", "how": "forked"}), answer
            inside = rootfs / "workspace"
            assert (inside / "note.txt").read_text() == "the parent's\n"
            assert {"nosuid", "nodev"} <= (mount_options(inside) or set())
            assert mounts_at(waiting) == 0  # the volume itself stays an empty directory
            (inside / "note.txt").write_text("the child's\n")

            csi.unpublish("csi-pool")  # the pod's end: the bind goes, the child's writes are stored
            assert not inside.is_mount()
            again = csi.publish("csi-again", pod_context(pod="later", workspace="ws-child"))
            assert (again / "note.txt").read_text() == "the child's\n"
            for volume in ("csi-again", "csi-pool-3", "csi-parent"):
                csi.unpublish(volume)
    finally:
        for bundle in (state / "io.containerd.runtime.v2.task" / "k8s.io").iterdir():
            subprocess.run(["umount", "-l", str(bundle / "rootfs")], check=False, capture_output=True)


def test_a_fork_for_another_node_is_made_where_its_source_is_mounted_and_bound_as_stored(
    node: Blockd, tmp_path: Path
) -> None:
    """A fork's child for a pool pod on another node: the source's node forks it through its
    bind API (freezing the source until its writes are in storage), and the child is then
    bound by workspace alone, restored from storage as the other node would."""
    with bind_api(node, tmp_path) as (csi, port, token):
        parent = csi.publish("csi-parent", pod_context(pod="parent", workspace="ws-parent", size="64Mi"))
        # The parent's last write, not yet replicated when the fork is asked for.
        (parent / "note.txt").write_text("the parent's, just before the fork\n")
        fork = {"source": "ws-parent", "children": ["ws-far"], "siblings": 1}
        status, answer = bind_call(port, token, fork, "/v1/fork")
        assert status == 200 and answer["children"] == {"ws-far": None}, answer
        assert isinstance(answer["fork_ms"], int)
        status, answer = bind_call(port, token, fork, "/v1/fork")
        assert status == 200 and "already exists" in answer["children"]["ws-far"], answer
        for bad, problem in (
            ({**fork, "children": []}, "children is missing"),
            ({**fork, "source": "Not.Valid"}, "is not a workspace id"),
            ({**fork, "children": ["ws-parent"]}, "cannot be made from itself"),
            ({**fork, "sibling": 2}, "unknown field(s) sibling"),
            ({**fork, "siblings": 0}, "is not a count of a fork's children"),
        ):
            status, answer = bind_call(port, token, bad, "/v1/fork")
            assert (status, answer["error"]) == (400, "bad_request") and problem in answer["message"], answer
        status, answer = bind_call(port, "not-the-token", fork, "/v1/fork")
        assert (status, answer["error"]) == (401, "unauthorized")

        far = csi.publish("csi-far", pod_context(pod="pool-3", bindAtClaim="true"))
        status, answer = bind_call(port, token, {"pod_uid": "uid-pool-3", "workspace": "ws-far"})
        assert (status, answer) == (200, {"workspace": "ws-far", "how": "restored"}), answer
        assert (far / "note.txt").read_text() == "the parent's, just before the fork\n"
        (far / "note.txt").write_text("the child's\n")
        assert (parent / "note.txt").read_text() == "the parent's, just before the fork\n"
        # Bound by workspace alone, a workspace that does not exist needs a size.
        waiting = csi.publish("csi-none", pod_context(pod="pool-4", bindAtClaim="true"))
        status, answer = bind_call(port, token, {"pod_uid": "uid-pool-4", "workspace": "ws-nowhere"})
        assert (status, answer["error"]) == (400, "bad_request") and "gives no size" in answer["message"], (
            answer
        )
        assert mounts_at(waiting) == 0
        for volume in ("csi-none", "csi-far", "csi-parent"):
            csi.unpublish(volume)


def test_invalid_requests_are_refused_with_the_problem_named(csi: Csi) -> None:
    cases = [
        (pod_context(size="64Mi"), "workspace is missing"),
        (pod_context(workspace="Not.Valid", size="64Mi"), "is not a workspace id"),
        (pod_context(workspace="ws-x", size="10GB"), "is not a size"),
        (pod_context(workspace="ws-x", size="1Mi"), "between 16Mi and 16Ti"),
        (pod_context(workspace="ws-x", forkOf="ws-y", template="ws-z"), "exclude each other"),
        (pod_context(workspace="ws-x", forkof="ws-y"), "unknown volume attribute(s) forkof"),
        ({"workspace": "ws-x", "size": "64Mi"}, "inline ephemeral volumes only"),
        (pod_context(workspace="ws-x"), "does not exist yet and the volume gives no size"),
    ]
    for number, (context, problem) in enumerate(cases):
        error = rpc_error(lambda c=context, n=number: csi.publish(f"csi-bad-{n}", c))  # type: ignore[misc]
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (context, error.details())
        assert problem in (error.details() or ""), (problem, error.details())
        assert mount_options(csi.target(f"csi-bad-{number}")) is None

    missing = rpc_error(
        lambda: csi.publish("csi-bad-fork", pod_context(workspace="ws-x", forkOf="ws-nowhere"))
    )
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert "ws-nowhere does not exist" in (missing.details() or "")
    block = rpc_error(
        lambda: csi.publish(
            "csi-bad-block", pod_context(workspace="ws-x", size="64Mi"), cap=capability(block=True)
        )
    )
    assert block.code() == grpc.StatusCode.FAILED_PRECONDITION and "volumeMode Filesystem" in (
        block.details() or ""
    )
    multi = rpc_error(
        lambda: csi.publish(
            "csi-bad-multi",
            pod_context(workspace="ws-x", size="64Mi"),
            cap=capability(Mode.MULTI_NODE_MULTI_WRITER),
        )
    )
    assert multi.code() == grpc.StatusCode.FAILED_PRECONDITION and "one writer" in (multi.details() or "")
    # Nothing refused left a record behind.
    assert list((csi.plugin.plugin_dir / "volumes").glob("*.json")) == []


def test_publish_and_unpublish_are_idempotent_and_a_workspace_has_one_writer(csi: Csi) -> None:
    context = pod_context(workspace="ws-once", size="64Mi")
    target = csi.publish("csi-vol-1", context)
    (target / "f").write_text("x\n")
    assert csi.publish("csi-vol-1", context) == target  # a repeat: OK, no second mount
    assert mounts_at(target) == 1
    changed = rpc_error(lambda: csi.publish("csi-vol-1", context, readonly=True))
    assert changed.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "read-write, not ws-once read-only" in (changed.details() or "")

    second_pod = rpc_error(lambda: csi.publish("csi-vol-2", pod_context(pod="pod-2", workspace="ws-once")))
    assert second_pod.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = second_pod.details() or ""
    assert "already published on this node for pod sandboxes/pod-1" in details and "one writer" in details
    assert mount_options(csi.target("csi-vol-2")) is None

    csi.unpublish("csi-vol-1")
    csi.unpublish("csi-vol-1")  # again: nothing published, still OK
    csi.unpublish("csi-never")  # never published: OK
    assert mounts_at(target) == 0

    # Read-only: the bind is ro as well as nosuid,nodev; the workspace itself is unchanged.
    ro = csi.publish("csi-vol-3", pod_context(pod="pod-3", workspace="ws-once"), readonly=True)
    options = mount_options(ro)
    assert options is not None and {"ro", "nosuid", "nodev"} <= options
    assert (ro / "f").read_text() == "x\n"
    with pytest.raises(OSError, match="Read-only file system"):
        (ro / "g").write_text("no\n")
    csi.unpublish("csi-vol-3")
    deadline = time.monotonic() + 5
    while mounts_at(ro) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mounts_at(ro) == 0


def test_a_daemon_stopped_under_a_published_workspace_leaves_no_mount_behind(
    csi: Csi, node: Blockd, blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str
) -> None:
    """Node shutdown order is not always kind (the pods' volumes may still be bound when the
    daemon goes): the daemon takes every mount of its workspaces with it, so its FUSE file
    system unmounts cleanly, and what it flushed is in storage."""
    target = csi.publish("csi-vol-stop", pod_context(workspace="ws_stopped", size="64Mi"))
    (target / "kept.txt").write_text("flushed at shutdown\n")
    fuse_dir = node.state / "node" / "fuse"
    node.stop()
    assert mount_options(target) is None  # the pod's bind went with the device
    table = Path("/proc/self/mountinfo").read_text()
    assert str(fuse_dir) not in table
    # The next daemon (an empty node) has the file back from storage.
    shutil.rmtree(node.state / "node")
    blockd_factory(f"s3://{bucket}", seaweedfs, name="node")
    csi.unpublish("csi-vol-stop")  # kubelet's, once the old pod is gone: nothing left to undo
    again = csi.publish("csi-vol-stop-2", pod_context(pod="pod-9", workspace="ws_stopped", size="64Mi"))
    assert (again / "kept.txt").read_text() == "flushed at shutdown\n"
    csi.unpublish("csi-vol-stop-2")


def test_a_bind_that_outlives_the_daemon_keeps_nothing_written_from_storage(
    csi: Csi, node: Blockd, blockd_factory: Callable[..., Blockd], seaweedfs: str, bucket: str
) -> None:
    """A process still inside a pod's volume when the daemon stops keeps that bind, and with it
    the file system, alive past the daemon's own unmount: the daemon's umount then does not end
    the file system, so it writes the file system's dirty data to the device before it goes
    (without that, data written but not yet synced never reached storage)."""
    target = csi.publish("csi-vol-held", pod_context(workspace="ws_held", size="64Mi"))
    (target / "kept.txt").write_text("written, never synced\n")
    holder = subprocess.Popen(["sleep", "600"], cwd=target)  # a process of the pod's, inside it
    try:
        node.stop()
    finally:
        holder.kill()
        holder.wait()
    shutil.rmtree(node.state / "node")
    blockd_factory(f"s3://{bucket}", seaweedfs, name="node")
    csi.unpublish("csi-vol-held")
    again = csi.publish("csi-vol-held-2", pod_context(pod="pod-8", workspace="ws_held", size="64Mi"))
    assert (again / "kept.txt").read_text() == "written, never synced\n"
    csi.unpublish("csi-vol-held-2")
