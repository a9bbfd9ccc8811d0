"""The local cluster's lifecycle, against the cluster tests/cluster/run.sh brought up:
readiness, idempotent up and apply, status, a configuration change restarting only what
changed, down stopping exactly our processes, and wipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import COMPONENTS, JOINED_COMPONENTS

from warren.config import ClusterConfig

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    missing = [k for k in ("WARREN_HOME", "WARREN_BIN_DIR", "WARREN_TEST_CONFIG") if k not in os.environ]
    if missing:
        pytest.fail(f"run the cluster tier through tests/cluster/run.sh (missing {', '.join(missing)})")
    return dict(os.environ)


def warren(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [str(Path(sys.executable).parent / "warren"), *args]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def kubectl(kubeconfig: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["kubectl", "--kubeconfig", kubeconfig, *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def kubeconfig(env: dict[str, str]) -> str:
    return warren("cluster", "kubeconfig").stdout.strip()


def pids(env: dict[str, str]) -> dict[str, int]:
    run = Path(env["WARREN_HOME"]) / "cluster" / "run"
    return {p.stem: json.loads(p.read_text())["pid"] for p in run.glob("*.json")}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


def assert_node_host_state_gone(state: Path) -> None:
    """What the node made on the host: mounts, pod network namespaces, the bridge, the
    nftables tables, the runtime's processes."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    assert not [m for m in mounts if m.startswith(str(state))], "mounts left under the state"
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert "cni-" not in netns, netns
    assert subprocess.run(["ip", "link", "show", "warren0"], capture_output=True, check=False).returncode != 0
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
    assert "warren_floor" not in tables and "kube-proxy" not in tables, tables
    ours = 'name: \\"warren\\"'  # the CNI bridge plugin's comment on rules for our network
    for tool in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            rules = subprocess.run(
                [tool, "-t", table, "-S"], capture_output=True, text=True, check=False
            ).stdout
            assert ours not in rules and "KUBE-KUBELET-CANARY" not in rules, (tool, table, rules)
    # Ours name our containerd's socket (the nodes tier's joined nodes may run beside).
    shims = subprocess.run(
        ["pgrep", "-f", f"containerd-shim.*{state}/"], capture_output=True, text=True, check=False
    ).stdout
    assert not shims.strip(), f"shims still running: {shims}"
    from warren.node import claim

    assert claim.holder() is None, "the node's claim on the host's network was not released"


def test_kubeconfig_is_under_warren_home(env: dict[str, str], kubeconfig: str) -> None:
    assert kubeconfig == str(Path(env["WARREN_HOME"]) / "cluster" / "admin.kubeconfig")


def test_readyz_through_kubectl(kubeconfig: str) -> None:
    result = kubectl(kubeconfig, "get", "--raw", "/readyz")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_server_dry_run_without_runtime_class_is_refused(kubeconfig: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "no-runtime-class", "namespace": "warren-sandboxes"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    result = kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod))
    assert result.returncode != 0
    assert "[warren:runtime-class]" in result.stderr
    assert "runtimeClassName: gvisor" in result.stderr


def test_server_dry_run_of_a_probe_host_in_a_label_only_namespace_is_refused(kubeconfig: str) -> None:
    """A namespace with the sandbox label alone has no Pod Security layer: Warren's policy
    refuses the probe's host by itself, naming the field."""
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "label-only", "labels": {"warren.dev/sandbox": "true"}},
    }
    created = kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(namespace))
    assert created.returncode == 0, created.stderr
    try:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe-host", "namespace": "label-only"},
            "spec": {
                "runtimeClassName": "gvisor",
                "automountServiceAccountToken": False,
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "securityContext": {"allowPrivilegeEscalation": False},
                        "livenessProbe": {"httpGet": {"host": "169.254.169.254", "port": 80}},
                    }
                ],
            },
        }
        for _ in range(60):  # pods are admitted once the namespace's default ServiceAccount exists
            result = kubectl(kubeconfig, "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(pod))
            if "serviceaccount" not in result.stderr.lower():
                break
            time.sleep(0.5)
        assert result.returncode != 0
        assert "[warren:probe-host]" in result.stderr and "livenessProbe" in result.stderr, result.stderr
    finally:
        kubectl(kubeconfig, "delete", "namespace", "label-only", "--wait=false")


def test_status_reports_every_component_healthy(env: dict[str, str]) -> None:
    result = warren("cluster", "status", "--config", env["WARREN_TEST_CONFIG"])
    for name in COMPONENTS:
        assert name in result.stdout
    assert result.stdout.count("healthy") == len(COMPONENTS)


def test_up_again_changes_nothing(env: dict[str, str], settings: ClusterConfig) -> None:
    before = pids(env)
    # run.sh deploys the rest of the platform too (site.yml), as workloads: nothing of it is
    # a process of the host's.
    assert set(before) == set(COMPONENTS)
    result = warren("cluster", "up", "--config", env["WARREN_TEST_CONFIG"])
    assert pids(env) == before
    running = [line for line in result.stderr.splitlines() if "running (pid" in line]
    joined = [node.name for node in settings.joined_nodes]
    each = {name: [line for line in running if line.startswith(f"· {name}: ")] for name in joined}
    assert len(running) - sum(map(len, each.values())) == len(COMPONENTS), result.stderr
    # A joined node's containerd, kubelet and kube-proxy are left running too.
    assert all(len(lines) == len(JOINED_COMPONENTS) for lines in each.values()), each
    assert "restarting" not in result.stderr, result.stderr


def test_apply_again_changes_nothing(env: dict[str, str], kubeconfig: str) -> None:
    """A second apply leaves every object's spec as it was (its generation does not move).
    resourceVersion is no measure here: the API server rewrites managedFields once after
    a status writer has touched an object, without changing its content."""

    def generations() -> str:
        kinds = (
            "validatingadmissionpolicies,validatingadmissionpolicybindings,crd,networkpolicies,runtimeclasses,"
            "deployments,daemonsets,statefulsets"
        )
        result = kubectl(
            kubeconfig,
            "get",
            kinds,
            "-A",
            "-l",
            "app.kubernetes.io/part-of=warren",
            "-o",
            "jsonpath={range .items[*]}{.kind}/{.metadata.name}={.metadata.generation} {end}",
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    before = generations()
    assert "ValidatingAdmissionPolicy/warren-sandbox-pods=" in before
    warren("apply", "--config", env["WARREN_TEST_CONFIG"], "--kubeconfig", kubeconfig, "--local-node")
    assert generations() == before


@pytest.fixture
def changed_config(env: dict[str, str], tmp_path: Path) -> Iterator[Path]:
    config = yaml.safe_load(Path(env["WARREN_TEST_CONFIG"]).read_text())
    config["cluster"]["scheduler_port"] = 20269
    path = tmp_path / "changed.yaml"
    path.write_text(yaml.safe_dump(config))
    yield path
    warren("cluster", "up", "--config", env["WARREN_TEST_CONFIG"])  # back to the original


def test_changed_setting_restarts_only_that_component(env: dict[str, str], changed_config: Path) -> None:
    before = pids(env)
    warren("cluster", "up", "--config", str(changed_config))
    after = pids(env)
    assert after["kube-scheduler"] != before["kube-scheduler"]
    assert not alive(before["kube-scheduler"])
    for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
        assert after[name] == before[name], name


def test_node_roles_are_idempotent_and_pass_check_mode(env: dict[str, str]) -> None:
    """The gvisor and egress_floor roles, rerun as `up` ran them: nothing changes, and a
    --check --diff run passes and would change nothing either."""
    from warren.ansible import ansible_dir, playbook_command, playbook_env

    vars_file = Path(env["WARREN_HOME"]) / "cluster" / "node" / "ansible-vars.json"
    assert vars_file.is_file()
    for check in (False, True):
        result = subprocess.run(
            playbook_command("node.yml", vars_file, check=check),
            env=playbook_env(),
            cwd=ansible_dir(),
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        recap = [line for line in result.stdout.splitlines() if line.startswith("localhost")][-1]
        assert "changed=0" in recap and "failed=0" in recap, recap


def sandbox_set() -> str:
    result = subprocess.run(
        ["nft", "list", "set", "inet", "warren_floor", "sandbox_v4"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def sandbox_pod(name: str, node: str, commands: dict[str, str]) -> dict[str, Any]:
    """A gVisor pod in the sandbox namespace on `node`: a busybox container per command."""
    from warren.node.images import busybox_image

    containers = [
        {
            "name": container,
            "image": busybox_image(),
            "imagePullPolicy": "Never",
            "command": ["sh", "-c", command],
            "securityContext": {"allowPrivilegeEscalation": False},
        }
        for container, command in commands.items()
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "warren-sandboxes"},
        "spec": {
            "runtimeClassName": "gvisor",
            "nodeName": node,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": containers,
        },
    }


def test_egress_floor_survives_runtime_restarts(
    env: dict[str, str], kubeconfig: str, first_node: str
) -> None:
    """A sandbox pod stays enrolled, and the floor's rules stay loaded, across a restart of
    the first node's containerd and kubelet (the pod is placed there)."""
    pod = sandbox_pod("floor-restart", first_node, {"main": "sleep 3600"})
    assert kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(pod)).returncode == 0
    wait = kubectl(
        kubeconfig,
        "-n",
        "warren-sandboxes",
        "wait",
        "--for=condition=Ready",
        "pod/floor-restart",
        "--timeout=120s",
    )
    assert wait.returncode == 0, wait.stderr
    ip = kubectl(
        kubeconfig, "-n", "warren-sandboxes", "get", "pod", "floor-restart", "-o", "jsonpath={.status.podIP}"
    ).stdout.strip()
    assert ip in sandbox_set()

    from warren.cluster.process import Supervisor

    supervisor = Supervisor(Path(env["WARREN_HOME"]) / "cluster")
    assert supervisor.stop("kubelet") and supervisor.stop("containerd")
    warren("cluster", "up", "--config", env["WARREN_TEST_CONFIG"])
    assert ip in sandbox_set()
    rules = subprocess.run(
        ["nft", "list", "chain", "inet", "warren_floor", "forward"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "@blocked_v4" in rules and "drop" in rules
    kubectl(kubeconfig, "-n", "warren-sandboxes", "delete", "pod", "floor-restart", "--wait=false")


def shim_ids(state: Path) -> list[str]:
    """The `-id` of every gVisor shim of this node's containerd."""
    found = subprocess.run(
        ["pgrep", "-af", f"containerd-shim-runsc-v1.*{state}/"], capture_output=True, text=True, check=False
    ).stdout
    return [line.split(" -id ", 1)[1].split()[0] for line in found.splitlines() if " -id " in line]


def test_a_pods_containers_share_one_shim_which_sees_each_exit(
    env: dict[str, str], kubeconfig: str, first_node: str
) -> None:
    """gVisor patches 0005 and 0006 (docs/node-runtime.md): the containers of a sandbox pod
    are served by the one shim its sandbox started (no shim is named for a container), and
    with the shim answering a running container's state from its own wait, a container
    that exits still reads as exited with its code, its sibling runs on, and the pod goes."""
    pod = sandbox_pod("one-shim", first_node, {"stays": "sleep 3600", "exits": "sleep 2; exit 3"})
    pod["spec"]["restartPolicy"] = "Never"
    assert kubectl(kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(pod)).returncode == 0
    try:

        def statuses() -> dict[str, Any]:
            got = kubectl(kubeconfig, "-n", "warren-sandboxes", "get", "pod", "one-shim", "-o", "json")
            assert got.returncode == 0, got.stderr
            return {s["name"]: s for s in json.loads(got.stdout)["status"].get("containerStatuses") or []}

        deadline = time.monotonic() + 120
        while "terminated" not in (statuses().get("exits", {}).get("state") or {}):
            assert time.monotonic() < deadline, f"the exiting container never read as exited: {statuses()}"
            time.sleep(0.5)
        now = statuses()
        assert now["exits"]["state"]["terminated"]["exitCode"] == 3, now["exits"]
        assert "running" in now["stays"]["state"], now["stays"]
        ids = [str(s["containerID"]).removeprefix("containerd://") for s in now.values()]
        shims = shim_ids(Path(env["WARREN_HOME"]) / "cluster")
        assert shims, "no gVisor shim of this node is running"
        assert not set(ids) & set(shims), f"a shim of its own for a container: {ids} among {shims}"
        said = kubectl(kubeconfig, "-n", "warren-sandboxes", "exec", "one-shim", "-c", "stays", "--", "true")
        assert said.returncode == 0, said.stderr
    finally:
        gone = kubectl(kubeconfig, "-n", "warren-sandboxes", "delete", "pod", "one-shim", "--timeout=60s")
    assert gone.returncode == 0, gone.stderr


def test_down_stops_exactly_our_processes_and_keeps_state(env: dict[str, str], kubeconfig: str) -> None:
    decoy = subprocess.Popen(["sleep", "300"])  # a process `down` must not touch
    try:
        before = pids(env)
        warren("cluster", "down", "--config", env["WARREN_TEST_CONFIG"])
        assert not any(alive(pid) for pid in before.values())
        assert pids(env) == {}
        assert decoy.poll() is None
        assert (Path(env["WARREN_HOME"]) / "cluster" / "etcd").is_dir()
        assert_node_host_state_gone(Path(env["WARREN_HOME"]) / "cluster")
        # Up again on the kept state: what was applied before is still there.
        warren("cluster", "up", "--config", env["WARREN_TEST_CONFIG"])
        result = kubectl(kubeconfig, "get", "namespace", "warren-sandboxes-b", "-o", "name")
        assert result.stdout.strip() == "namespace/warren-sandboxes-b", result.stderr
    finally:
        decoy.kill()
        decoy.wait()


def test_down_wipe_removes_state(env: dict[str, str]) -> None:
    state = Path(env["WARREN_HOME"]) / "cluster"
    running = pids(env)
    warren("cluster", "down", "--wipe", "--config", env["WARREN_TEST_CONFIG"])
    assert not state.exists()
    assert not any(alive(pid) for pid in running.values())
    assert_node_host_state_gone(state)
