"""A throw-away Kubernetes control plane for install-path tests: etcd, kube-apiserver and a
kube-controller-manager that runs three controllers: the namespace controller, the garbage
collector and the ServiceAccount token controller. With `workloads=True`, also what makes
workloads roll out: a scheduler, kwok playing the kubelet of one fake node (its pods turn
Running and Ready at once, a Job's pods then Succeed; nothing runs), and the controllers of
Deployments, ReplicaSets, DaemonSets, StatefulSets, Jobs, Endpoints and default
ServiceAccounts, so an installer that waits for a rollout (pulumi-kubernetes does) sees one.

The real binaries (`tools/build-cluster-binaries.sh`), every file in one temporary directory,
every listener on a free loopback port: it runs beside the machine's local cluster and shares
nothing with it (its own CA, its own etcd). No node, no scheduler: nothing here runs a pod.
The controller manager is there because deletion needs it. The API server only marks a
namespace Terminating: the namespace controller empties it and removes its finalizer. And
pulumi-kubernetes deletes with foreground propagation, which puts the `foregroundDeletion`
finalizer on the object: the garbage collector removes it once nothing depends on the object.
Without either, a delete or `pulumi destroy` never completes.

`stop` ends every process it started (by pid, newest first) and removes the directory, also
after a failed start; a child outlives the test process only if that is SIGKILLed and even
then the kernel ends it (PR_SET_PDEATHSIG).

`Api` is a minimal client (the standard library over the admin's client certificate), so the
tests need neither a discovery cache in /tmp nor the Kubernetes client's untyped API.
"""

from __future__ import annotations

import ctypes
import json
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from warren.cluster.local import write_kubeconfig
from warren.cluster.pki import SERVER, Leaf, Pki

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
WORKLOAD_BINARIES = ("kube-scheduler", "kwok")
# What deletion needs, and the ServiceAccount tokens a control plane's kubeconfig is made from.
BASE_CONTROLLERS = ("namespace-controller", "garbage-collector-controller", "serviceaccount-token-controller")
# What rolls workloads out (with workloads=True).
WORKLOAD_CONTROLLERS = (
    "serviceaccount-controller",  # a namespace's default ServiceAccount: pods without one are refused
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "statefulset-controller",
    "job-controller",
    "endpoints-controller",  # pulumi-kubernetes waits for a Service's Endpoints
    "endpointslice-controller",
)
# kwok's Stage objects: the lifecycle of the fake node and its pods. The controller's own scale
# tests keep kwok's stages for nodes and pods; a Job's pods also need to finish.
KWOK_STAGES = (
    Path(__file__).resolve().parents[2] / "packages" / "warren-control" / "tests" / "kwok-stages.yaml",
    Path(__file__).with_name("kwok-job-stages.yaml"),
)
KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
NODE_NAME = "kwok-node-0"
NODE_POD_CIDR = "10.64.0.0/24"  # kwok hands out pod IPs from it (strings in objects, never dialled)
START_TIMEOUT = 120.0
# A free port is free when it is picked, not necessarily when the server binds it (other work
# shares the machine): a start that lost that race is tried again on new ports.
PORT_ATTEMPTS = 3
PR_SET_PDEATHSIG = 1

Obj = dict[str, Any]
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def missing_binaries(bin_dir: Path, workloads: bool = False) -> list[str]:
    wanted = BINARIES + (WORKLOAD_BINARIES if workloads else ())
    return [name for name in wanted if not (bin_dir / name).is_file()]


class PortTakenError(RuntimeError):
    """A server exited because another process bound its port first."""


class ApiError(RuntimeError):
    def __init__(self, status: int, method: str, path: str, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:2000]}")
        self.status = status


@dataclass(frozen=True)
class Resource:
    """Where objects of one kind live in the API."""

    group_version: str  # "v1" or "group/version"
    plural: str
    namespaced: bool

    def path(self, name: str, namespace: str | None) -> str:
        base = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        scope = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{scope}/{self.plural}/{name}"


class Api:
    """JSON requests to the API server as the cluster's admin."""

    def __init__(self, server: str, ca: Path, cert: Path, key: Path) -> None:
        self.server = server
        self._context = ssl.create_default_context(cafile=str(ca))
        self._context.load_cert_chain(cert, key)
        self._resources: dict[tuple[str, str], Resource] = {}

    def request(self, method: str, path: str, body: Obj | None = None) -> Obj:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(  # noqa: S310  # our own loopback https URL
            self.server + path,
            data=data,
            method=method,
            headers={"Accept": "application/json", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30, context=self._context) as response:  # noqa: S310
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, method, path, exc.read().decode(errors="replace")) from None
        parsed: Obj = json.loads(text) if text else {}
        return parsed

    def ready(self) -> bool:
        url = f"{self.server}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=5, context=self._context) as response:  # noqa: S310
                return int(response.status) == 200
        except (OSError, ssl.SSLError):
            return False

    def resource(self, api_version: str, kind: str) -> Resource:
        """Discovery for one kind (asked again for every miss: a CRD adds kinds at run time)."""
        key = (api_version, kind)
        if key not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            for item in self.request("GET", base).get("resources") or []:
                if "/" in item["name"]:
                    continue  # a subresource (namespaces/status)
                self._resources[(api_version, item["kind"])] = Resource(
                    api_version, item["name"], bool(item["namespaced"])
                )
        if key not in self._resources:
            raise LookupError(f"the API server serves no {kind} in {api_version}")
        return self._resources[key]

    def path_of(self, obj: Obj) -> str:
        meta = obj["metadata"]
        return self.resource(obj["apiVersion"], obj["kind"]).path(meta["name"], meta.get("namespace"))

    def get(self, obj: Obj) -> Obj | None:
        """The live object `obj` names (its kind, namespace and name), or None."""
        try:
            return self.request("GET", self.path_of(obj))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def delete(self, obj: Obj) -> None:
        try:
            self.request("DELETE", self.path_of(obj))
        except ApiError as exc:
            if exc.status != 404:
                raise


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class ControlPlane:
    """`with ControlPlane(bin_dir) as cluster:`; `cluster.admin_kubeconfig`, `cluster.api`."""

    def __init__(self, bin_dir: Path, workloads: bool = False, node_name: str = NODE_NAME) -> None:
        self.bin_dir = bin_dir
        self.workloads = workloads
        self.node_name = node_name  # the fake node's (with workloads=True)
        self.root = Path(tempfile.mkdtemp(prefix="warren-apiserver-"))
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.processes: list[Process] = []
        self.server = ""  # https://127.0.0.1:<port>, once the API server has a port
        self.admin_kubeconfig = self.root / "admin.kubeconfig"
        self._api: Api | None = None
        self._sigterm: Any = None

    def __enter__(self) -> ControlPlane:
        # A SIGTERM (a CI timeout) would end Python without any cleanup: make it SystemExit.
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self._sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            if self._sigterm is not None:
                signal.signal(signal.SIGTERM, self._sigterm)
                self._sigterm = None

    @property
    def api(self) -> Api:
        if self._api is None:
            self._api = Api(self.server, self.pki / "ca.crt", self.pki / "admin.crt", self.pki / "admin.key")
        return self._api

    def start(self) -> None:
        missing = missing_binaries(self.bin_dir, self.workloads)
        if missing:
            raise RuntimeError(
                f"{self.bin_dir} lacks {', '.join(missing)}: run tools/build-cluster-binaries.sh"
            )
        self.logs.mkdir()
        self._issue_certificates()
        etcd_url = self._on_free_ports(self._start_etcd)
        self._on_free_ports(lambda: self._start_apiserver(etcd_url))
        self._start_controller_manager()
        if self.workloads:
            self._start_scheduler()
            self._start_kwok()
            self._add_node()

    def stop(self) -> None:
        """Stop what was started, newest first, and remove the directory."""
        for process in reversed(self.processes):
            if process.alive():
                process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for process in reversed(self.processes):
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(timeout=10)
        self.processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}")

    def _issue_certificates(self) -> None:
        store = Pki(self.pki)
        store.ensure_ca("ca", "warren-test-ca")
        store.ensure_leaf(
            Leaf(
                "apiserver",
                "ca",
                "kube-apiserver",
                usages=(SERVER,),
                dns_names=("localhost", "kubernetes.default.svc"),
                ips=("127.0.0.1",),
            )
        )
        # As the local cluster's admin is: the floor guard lets warren:platform manage the floor.
        store.ensure_leaf(
            Leaf("admin", "ca", "warren-admin", organizations=("system:masters", "warren:platform"))
        )
        # The namespace controller deletes every kind inside a namespace. With its own
        # identity and no per-controller service accounts (that needs the token controller
        # and more), only system:masters covers every kind, CRDs included.
        store.ensure_leaf(
            Leaf(
                "controller-manager",
                "ca",
                "system:kube-controller-manager",
                organizations=("system:masters",),
            )
        )
        store.ensure_keypair("sa")

    def _write_kubeconfigs(self) -> None:
        for user in ("admin", "controller-manager"):
            write_kubeconfig(
                self.root / f"{user}.kubeconfig",
                self.server,
                self.pki / "ca.crt",
                self.pki / f"{user}.crt",
                self.pki / f"{user}.key",
                user=user,
            )

    def _on_free_ports(self, start: Callable[[], T]) -> T:
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                return start()
            except PortTakenError:
                if attempt == PORT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _spawn(self, name: str, argv: list[str]) -> Process:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            # A session of its own, so a ^C for pytest reaches the harness, which stops these
            # in order; the kernel kills them if the harness dies without doing so.
            popen = subprocess.Popen(  # pinned binaries, our own arguments
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,  # noqa: PLW1509  # only an async-signal-safe prctl
            )
        process = Process(name, popen, log)
        self.processes.append(process)
        return process

    def _wait(self, process: Process, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if not process.alive():
                message = f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}"
                if "address already in use" in message:
                    self.processes.remove(process)
                    raise PortTakenError(message)
                raise RuntimeError(message)
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"{process.name} not ready after {START_TIMEOUT:.0f}s:\n{process.tail()}")

    def _start_etcd(self) -> str:
        client_url = f"http://127.0.0.1:{free_port()}"
        peer_url = f"http://127.0.0.1:{free_port()}"
        shutil.rmtree(self.root / "etcd", ignore_errors=True)  # what a start that lost a port left
        etcd = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=test",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=test={peer_url}",
                f"--listen-metrics-urls=http://127.0.0.1:{free_port()}",
                "--unsafe-no-fsync",  # a store thrown away after the test
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{client_url}/health", timeout=5) as response:  # noqa: S310
                    return int(response.status) == 200
            except OSError:
                return False

        self._wait(etcd, healthy)
        return client_url

    def _start_apiserver(self, etcd_url: str) -> None:
        pki = self.pki
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self._api = None
        self._write_kubeconfigs()
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.root / 'apiserver'}",
                f"--etcd-servers={etcd_url}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--authorization-mode=Node,RBAC",
                # As on any real cluster: warren-blockd's DaemonSet is privileged (and the
                # admission floor, not this flag, keeps sandbox pods from being so).
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )
        self._wait(apiserver, self.api.ready)

    def _start_controller_manager(self) -> None:
        manager = self._spawn(
            "kube-controller-manager",
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={self.root / 'controller-manager.kubeconfig'}",
                # The token controller fills ServiceAccount token Secrets (a control plane's
                # kubeconfig is made from one).
                "--controllers="
                + ",".join(BASE_CONTROLLERS + (WORKLOAD_CONTROLLERS if self.workloads else ())),
                f"--service-account-private-key-file={self.pki / 'sa.key'}",
                f"--root-ca-file={self.pki / 'ca.crt'}",
                "--leader-elect=false",
                "--secure-port=0",  # no health endpoint: nothing listens but the API server
                "--profiling=false",
            ],
        )
        # It has no endpoint to probe: give it a moment, then insist that it still runs.
        time.sleep(1)
        if not manager.alive():
            raise RuntimeError(f"kube-controller-manager exited:\n{manager.tail()}")

    def _start_scheduler(self) -> None:
        settings = self.root / "scheduler.yaml"
        settings.write_text(
            json.dumps(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {"kubeconfig": str(self.admin_kubeconfig)},
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        scheduler = self._spawn(
            "kube-scheduler",
            [str(self.bin_dir / "kube-scheduler"), f"--config={settings}", "--secure-port=0"],
        )
        time.sleep(1)
        if not scheduler.alive():
            raise RuntimeError(f"kube-scheduler exited:\n{scheduler.tail()}")

    def _start_kwok(self) -> None:
        key, value = KWOK_NODE_ANNOTATION
        self._spawn(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                *(f"--config={stages}" for stages in KWOK_STAGES),
                f"--kubeconfig={self.admin_kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=0",  # no node lifecycle controller reads leases here
                "-v=WARN",
            ],
        )

    def _add_node(self) -> None:
        """One fake node, Ready once kwok has taken it (kwok has no readiness endpoint)."""
        key, value = KWOK_NODE_ANNOTATION
        labels = {
            "kubernetes.io/hostname": self.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
        }
        self.api.request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": self.node_name, "annotations": {key: value}, "labels": labels},
                "spec": {"podCIDR": NODE_POD_CIDR, "podCIDRs": [NODE_POD_CIDR]},
            },
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            self.check_alive()
            node = self.api.request("GET", f"/api/v1/nodes/{self.node_name}")
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                # The API server taints a new node not-ready; the node lifecycle controller lifts
                # that once it is Ready. That controller does not run here (kwok renews no lease,
                # so it would soon call the node lost): lift it as it would.
                node["spec"]["taints"] = [
                    t
                    for t in node["spec"].get("taints") or []
                    if t.get("key") != "node.kubernetes.io/not-ready"
                ]
                try:
                    self.api.request("PUT", f"/api/v1/nodes/{self.node_name}", node)
                except ApiError as exc:
                    if exc.status != 409:  # kwok wrote its status meanwhile: read it again
                        raise
                    continue
                return
            time.sleep(0.5)
        raise RuntimeError(
            f"the kwok node was not Ready after {START_TIMEOUT:.0f}s:\n{self.processes[-1].tail()}"
        )


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
