"""The throw-away control plane's pure parts, and its start failing cleanly: no root and no
Kubernetes binaries (stand-in scripts play them where a process is needed)."""

from __future__ import annotations

import json
import signal
import ssl
import stat
import time
from pathlib import Path

import pytest
from warren_common import testing
from warren_common.files import write_private
from warren_common.kubecluster import (
    DELETION_CONTROLLERS,
    JOB_STAGES,
    NODE_STAGES,
    WORKLOAD_CONTROLLERS,
    KubeCluster,
    MissingBinariesError,
    Options,
    PortTakenError,
    commands,
    missing_binaries,
    node_names,
    workloads,
)
from warren_common.kubecluster import cluster as cluster_module
from warren_common.kubecluster.processes import Process, spawn, stop_all
from warren_common.pki import SERVER, Leaf, Pki

ALL = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")


def executables(directory: Path, script: str = "#!/bin/sh\nexit 1\n", names: tuple[str, ...] = ALL) -> Path:
    directory.mkdir(exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text(script)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


def test_only_the_components_asked_for_are_needed() -> None:
    assert Options().binaries() == ("etcd", "kube-apiserver")
    assert Options(scheduler=True, kwok=True).binaries() == (
        "etcd",
        "kube-apiserver",
        "kube-scheduler",
        "kwok",
    )
    assert workloads().binaries() == ALL


def test_the_workloads_preset_rolls_workloads_out_on_one_named_node() -> None:
    options = workloads("node")
    assert options.controllers == DELETION_CONTROLLERS + WORKLOAD_CONTROLLERS
    assert options.scheduler and options.kwok
    assert options.nodes == ("node",)
    assert options.stages == (NODE_STAGES, JOB_STAGES)
    assert all(path.is_file() for path in options.stages)


def test_fake_nodes_without_kwok_are_refused() -> None:
    with pytest.raises(ValueError, match="kwok"):
        Options(nodes=("n",))


def test_missing_binaries_are_named_with_the_fix(tmp_path: Path) -> None:
    bin_dir = executables(tmp_path / "bin", names=("etcd", "kube-apiserver"))
    (bin_dir / "kwok").write_text("not executable")
    (bin_dir / "kube-scheduler").mkdir()  # a directory is no binary either
    options = Options(scheduler=True, kwok=True)
    assert missing_binaries(bin_dir, options) == ["kube-scheduler", "kwok"]
    assert missing_binaries(bin_dir, Options()) == []
    cluster = KubeCluster(bin_dir, options)
    with pytest.raises(
        MissingBinariesError, match=r"lacks kube-scheduler, kwok: run tools/build-cluster-binaries"
    ):
        cluster.__enter__()
    assert not cluster.root.exists(), "a failed start leaves no directory behind"


def test_a_server_that_will_not_start_is_reported_and_everything_removed(tmp_path: Path) -> None:
    bin_dir = executables(tmp_path / "bin", "#!/bin/sh\necho 'etcd: disk on fire' >&2\nexit 3\n")
    cluster = KubeCluster(bin_dir)
    with pytest.raises(RuntimeError, match=r"etcd exited \(3\):\netcd: disk on fire"), cluster:
        pass
    assert not cluster.root.exists()
    assert cluster.processes == []


def test_a_server_that_lost_its_port_is_started_again_on_new_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cluster_module, "START_TIMEOUT", 5.0)
    bin_dir = executables(
        tmp_path / "bin", "#!/bin/sh\necho 'listen tcp: bind: address already in use'\nexit 1\n"
    )
    cluster = KubeCluster(bin_dir)
    ports: list[int] = []
    real = testing.free_port

    def counted() -> int:
        ports.append(real())
        return ports[-1]

    monkeypatch.setattr(cluster_module, "free_port", counted)
    with pytest.raises(PortTakenError), cluster:
        pass
    assert len(ports) == 3 * cluster_module.PORT_ATTEMPTS, "etcd's three ports, on each attempt"
    assert not cluster.root.exists()


def test_the_servers_listen_on_loopback_and_trust_only_their_own_ca(tmp_path: Path) -> None:
    layout = commands.Layout(tmp_path)
    bin_dir = Path("/bin-dir")
    etcd = commands.etcd_argv(bin_dir, layout, 2379, 2380, 2381)
    assert etcd[0] == "/bin-dir/etcd"
    assert "--listen-client-urls=http://127.0.0.1:2379" in etcd
    assert "--initial-cluster=test=http://127.0.0.1:2380" in etcd
    assert "--unsafe-no-fsync" in etcd
    apiserver = commands.apiserver_argv(bin_dir, layout, 6443, "http://127.0.0.1:2379")
    assert "--bind-address=127.0.0.1" in apiserver
    assert "--secure-port=6443" in apiserver
    assert f"--client-ca-file={tmp_path / 'pki' / 'ca.crt'}" in apiserver
    assert "--etcd-servers=http://127.0.0.1:2379" in apiserver
    # No node lifecycle controller runs, so nothing would lift the not-ready taint.
    assert "--disable-admission-plugins=TaintNodesByCondition" in apiserver


def test_the_controller_manager_runs_the_controllers_asked_for(tmp_path: Path) -> None:
    argv = commands.controller_manager_argv(Path("/b"), commands.Layout(tmp_path), ("a-controller", "b"))
    assert "--controllers=a-controller,b" in argv
    assert "--leader-elect=false" in argv
    assert "--secure-port=0" in argv


def test_the_scheduler_and_kwok_use_their_own_settings(tmp_path: Path) -> None:
    layout = commands.Layout(tmp_path)
    settings = commands.scheduler_settings(layout)
    assert settings["clientConnection"]["kubeconfig"] == str(tmp_path / "scheduler.kubeconfig")
    assert settings["leaderElection"] == {"leaderElect": False}
    kwok = commands.kwok_argv(Path("/b"), layout, (Path("/s1.yaml"), Path("/s2.yaml")), 600)
    assert kwok[:3] == ["/b/kwok", "--config=/s1.yaml", "--config=/s2.yaml"]
    assert "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake" in kwok
    assert "--node-lease-duration-seconds=600" in kwok


def test_fake_nodes_get_their_own_pod_ranges_and_kwoks_annotation() -> None:
    assert node_names(2, first=9) == ["kwok-node-0009", "kwok-node-0010"]
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    node = commands.fake_node("n1", 1, {"type": "kwok"}, [taint])
    assert node["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert node["metadata"]["labels"] == {
        "type": "kwok",
        "kubernetes.io/hostname": "n1",
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
    }
    assert node["spec"] == {"podCIDR": "10.64.1.0/24", "podCIDRs": ["10.64.1.0/24"], "taints": [taint]}
    assert commands.pod_cidr(0) == "10.64.0.0/24"
    assert commands.pod_cidr(16383) == "10.127.255.0/24"
    with pytest.raises(ValueError, match="no /24"):
        commands.pod_cidr(16384)
    assert not commands.is_ready(node)
    node["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    assert commands.is_ready(node)


def test_the_certificates_and_kubeconfigs_work_together(tmp_path: Path) -> None:
    layout = commands.Layout(tmp_path)
    certificates = Pki(layout.pki)
    certificates.ensure_ca("ca", "warren-test-ca")
    certificates.ensure_leaf(
        Leaf(
            "apiserver",
            "ca",
            "kube-apiserver",
            usages=(SERVER,),
            dns_names=("localhost",),
            ips=("127.0.0.1",),
        )
    )
    certificates.ensure_leaf(Leaf("admin", "ca", "warren-admin", organizations=("system:masters",)))
    certificates.ensure_keypair("sa")
    assert (layout.pki / "sa.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")
    assert stat.S_IMODE(layout.key("admin").stat().st_mode) == 0o600
    context = ssl.create_default_context(cafile=str(layout.cert("ca")))
    context.load_cert_chain(layout.cert("admin"), layout.key("admin"))

    document = commands.kubeconfig(
        "https://127.0.0.1:1", layout.cert("ca"), layout.cert("admin"), layout.key("admin"), "admin"
    )
    path = layout.kubeconfig("admin")
    write_private(path, json.dumps(document))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    written = json.loads(path.read_text())
    context_name = written["current-context"]
    (entry,) = (c["context"] for c in written["contexts"] if c["name"] == context_name)
    (cluster,) = (c["cluster"] for c in written["clusters"] if c["name"] == entry["cluster"])
    assert cluster["server"] == "https://127.0.0.1:1"
    assert entry["user"] == "admin"


def test_processes_stop_newest_first_and_one_that_ignores_sigterm_is_killed(tmp_path: Path) -> None:
    order = tmp_path / "order"

    def server(name: str, on_term: str) -> Process:
        script = f'trap "{on_term}" TERM; while :; do sleep 0.05; done'
        return spawn(name, ["/bin/sh", "-c", script], tmp_path / f"{name}.log")

    first = server("first", f"echo first >> {order}; exit 0")
    stubborn = server("stubborn", ":")  # ignores it: only SIGKILL ends it
    newest = server("newest", f"echo newest >> {order}; exit 0")
    time.sleep(0.3)  # the traps are set
    stop_all([first, stubborn, newest], grace=0.5)
    assert order.read_text().split() == ["newest", "first"]
    assert newest.popen.returncode == 0
    assert stubborn.popen.returncode == -signal.SIGKILL
    assert first.popen.returncode == 0
