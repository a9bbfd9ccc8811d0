"""A throw-away control plane for scale tests: etcd, kube-apiserver, kube-scheduler and the
kwok controller, which plays the kubelet for any number of fake nodes. The Warren floor is
applied with `warren apply` (so the Sandbox CRD, the RuntimeClass, the controller's RBAC
and the admission policies are exactly what a real cluster gets), and the controller runs
as a subprocess with its own ServiceAccount, as in the cluster tier.

Everything lives in a temporary directory and listens on free loopback ports, so it can run
beside the real local cluster; `stop` kills every process it started and removes the
directory, also after a failed start. No root needed. No kube-controller-manager: the one
thing the test needs from it, a namespace's default ServiceAccount, is made here, and its
node lifecycle and garbage collection would only add load to a measurement of ours.

`reconcile` measures the controller: create M Sandboxes concurrently and time the first
create to the last one reporting Running (`reconcile_per_s`); `measure_reconcile` does
that and the deletion in one call, for a benchmark.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import importlib
import ipaddress
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import yaml
from k8s_helpers import Controller, controller_kubeconfig, sandbox_body, wait_for
from kubernetes import client, config, watch
from localservers import free_port
from warren_control.controller import ControllerOptions
from warren_control.kube import ApiException, Kube, Obj
from warren_control.podspec import FINALIZER, GROUP, PLURAL, VERSION

REPO = Path(__file__).resolve().parents[3]
STAGES = Path(__file__).with_name("kwok-stages.yaml")
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kwok")
NAMESPACE = "warren-sandboxes"  # the floor's default sandbox namespace (`warren apply` makes it)
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
NODE_PREFIX = "kwok-node-"
# Fake addresses: never dialled (no kubelet behind them), only written into objects. The
# node IP is loopback so that even a stray `kubectl logs` stays on this machine.
NODE_IP = "127.0.0.1"
POD_NETWORK = ipaddress.ip_network("10.64.0.0/10")
START_TIMEOUT = 120.0
PR_SET_PDEATHSIG = 1


def missing_binaries(bin_dir: Path) -> list[str]:
    return [name for name in BINARIES if not os.access(bin_dir / name, os.X_OK)]


def warren_cli() -> Path:
    """The repository's own `warren` command (its virtualenv: `make venv`): it renders and
    applies the floor; this package's virtualenv has neither jinja2 nor the templates."""
    return REPO / ".venv" / "bin" / "warren"


def _pki_module() -> Any:
    # The local cluster's PKI helper (src/warren/cluster/pki.py) needs only cryptography,
    # which this package's virtualenv has too; the rest of `warren` is not installed here.
    source = str(REPO / "src")
    if source not in sys.path:
        sys.path.append(source)
    return importlib.import_module("warren.cluster.pki")


def _kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path) -> Path:
    def data(file: Path) -> str:
        return base64.b64encode(file.read_bytes()).decode()

    body = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kwok", "cluster": {"server": server, "certificate-authority-data": data(ca)}}],
        "users": [
            {"name": "user", "user": {"client-certificate-data": data(cert), "client-key-data": data(key)}}
        ],
        "contexts": [{"name": "kwok", "context": {"cluster": "kwok", "user": "user"}}],
        "current-context": "kwok",
    }
    path.write_text(yaml.safe_dump(body))
    path.chmod(0o600)
    return path


def connect(kubeconfig: Path, pool: int = 64) -> Kube:
    """A client whose connection pool holds `pool` connections: the default (5 per CPU)
    would make every request beyond it open a new TLS connection when many threads share
    the client."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool
    return Kube(client.ApiClient(configuration))


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


@dataclass
class Usage:
    """CPU seconds and peak resident memory of one process, read from /proc."""

    cpu_seconds: float
    peak_rss_mib: float


def usage_of(pid: int) -> Usage | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(stat[11]) + int(stat[12])) / ticks  # utime, stime
    peak = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return Usage(cpu_seconds=round(cpu, 1), peak_rss_mib=round(peak / 1024, 1))


class KwokCluster:
    """Start with `with KwokCluster(bin_dir) as cluster:`; `add_nodes` makes fake nodes."""

    def __init__(self, bin_dir: Path, *, warren: Path | None = None, node_lease_seconds: int = 600) -> None:
        self.bin_dir = bin_dir
        self.warren = warren or warren_cli()
        # kwok renews a Lease per node every quarter of this, as a kubelet does; 0: none.
        # Nothing here reads the leases (no node lifecycle controller runs), and at 40 s,
        # 1,000 nodes wrote 100 renewals a second to the API server for the whole test.
        self.node_lease_seconds = node_lease_seconds
        self.root = Path(tempfile.mkdtemp(prefix="warren-kwok-"))
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.processes: list[Process] = []
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.admin_kubeconfig = self.root / "admin.kubeconfig"
        self._kube: Kube | None = None
        self.nodes: list[str] = []
        self._sigterm: Any = None

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> KwokCluster:
        # A SIGTERM (a CI timeout, `timeout`) would end Python without running any cleanup:
        # turn it into SystemExit so the processes are stopped and the directory removed.
        main = threading.current_thread() is threading.main_thread()
        if main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
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

    def start(self) -> None:
        self.logs.mkdir()
        self._issue_certificates()
        etcd_url = self._start_etcd()
        self._start_apiserver(etcd_url)
        self._apply_floor()
        self._start_scheduler()
        self._start_kwok()

    def stop(self) -> None:
        """Kill what was started, newest first, and remove the directory."""
        for process in reversed(self.processes):
            if process.alive():
                process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in reversed(self.processes):
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(timeout=10)
        self.processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = connect(self.admin_kubeconfig)
        return self._kube

    def usage(self) -> dict[str, Usage]:
        found = {p.name: usage_of(p.popen.pid) for p in self.processes if p.alive()}
        return {name: value for name, value in found.items() if value is not None}

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}")

    # --- components -----------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> Process:
        log = self.logs / f"{name}.log"
        with log.open("wb") as out:
            # A session of its own: a ^C meant for pytest reaches the harness, which then
            # stops these in order, rather than every process at once. If the harness dies
            # without stopping them (SIGKILL), the kernel kills them too.
            popen = subprocess.Popen(
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
        def check() -> bool:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited ({process.popen.returncode}):\n{process.tail()}")
            try:
                return ready()
            except (OSError, ApiException):
                return False

        try:
            wait_for(check, START_TIMEOUT, f"{process.name} to be ready", interval=0.2)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}\n{process.tail()}") from None

    def _issue_certificates(self) -> None:
        pki = _pki_module()
        store = pki.Pki(self.pki)
        store.ensure_ca("ca", "warren-kwok-ca")
        store.ensure_leaf(
            pki.Leaf(
                "apiserver",
                "ca",
                "kube-apiserver",
                usages=(pki.SERVER,),
                dns_names=("localhost", "kubernetes.default.svc"),
                ips=("127.0.0.1",),
            )
        )
        # As the local cluster's admin: the floor guard lets warren:platform manage the floor.
        store.ensure_leaf(
            pki.Leaf("admin", "ca", "warren-admin", organizations=("system:masters", "warren:platform"))
        )
        store.ensure_leaf(pki.Leaf("scheduler", "ca", "system:kube-scheduler"))
        store.ensure_keypair("sa")
        ca = self.pki / "ca.crt"
        _kubeconfig(self.admin_kubeconfig, self.server, ca, self.pki / "admin.crt", self.pki / "admin.key")
        _kubeconfig(
            self.root / "scheduler.kubeconfig",
            self.server,
            ca,
            self.pki / "scheduler.crt",
            self.pki / "scheduler.key",
        )

    def _start_etcd(self) -> str:
        client_url = f"http://127.0.0.1:{free_port()}"
        peer_url = f"http://127.0.0.1:{free_port()}"
        etcd = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=kwok",
                f"--data-dir={self.root / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=kwok={peer_url}",
                # A store thrown away after the test: waiting for a shared disk's fsync would
                # measure the disk, not the controller.
                "--unsafe-no-fsync",
                "--quota-backend-bytes=8589934592",
                "--log-level=warn",
            ],
        )
        self._wait(etcd, lambda: _http_ok(f"{client_url}/health"))
        return client_url

    def _start_apiserver(self, etcd_url: str) -> None:
        pki = self.pki
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
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
                # It taints every new node not-ready, and only the controller manager's node
                # lifecycle controller (not run here) would lift the taint.
                "--disable-admission-plugins=TaintNodesByCondition",
                "--profiling=false",
            ],
        )
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        self._wait(apiserver, lambda: _http_ok(f"{self.server}/readyz", context))

    def _apply_floor(self) -> None:
        if not os.access(self.warren, os.X_OK):
            raise RuntimeError(f"{self.warren} is missing: `make venv` installs the warren command")
        env = {**os.environ, "WARREN_HOME": str(self.root / "home")}  # never the real cluster's state
        # The floor alone: this cluster's controller is the test's, and no kwok node may
        # "run" Warren's own workloads.
        floor = Path(__file__).resolve().parents[3] / "tests" / "cluster" / "warren-floor.yaml"
        done = subprocess.run(
            [str(self.warren), "apply", "--config", str(floor), "--kubeconfig", str(self.admin_kubeconfig)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"warren apply failed:\n{done.stdout}{done.stderr}")
        # The namespace's default ServiceAccount (the controller manager's job, not run
        # here): the ServiceAccount admission plugin refuses pods until it exists.
        self.kube.request(
            "POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", body={"metadata": {"name": "default"}}
        )

    def _start_scheduler(self) -> None:
        settings = self.root / "scheduler.yaml"
        settings.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    # The default 50 requests/s would make binding, not the controller, the
                    # limit on how fast 5,000 pods start.
                    "clientConnection": {
                        "kubeconfig": str(self.root / "scheduler.kubeconfig"),
                        "qps": 500,
                        "burst": 1000,
                    },
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self._spawn(
            "kube-scheduler",
            [str(self.bin_dir / "kube-scheduler"), f"--config={settings}", "--secure-port=0"],
        )

    def _start_kwok(self) -> None:
        key, value = KWOK_ANNOTATION
        self._spawn(
            "kwok",
            [
                str(self.bin_dir / "kwok"),
                f"--config={STAGES}",
                f"--kubeconfig={self.admin_kubeconfig}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                f"--node-ip={NODE_IP}",
                f"--node-lease-duration-seconds={self.node_lease_seconds}",
                "-v=WARN",  # at INFO it logs every lease renewal
            ],
        )
        # kwok has no readiness endpoint: add_nodes waits for the nodes it makes Ready.
        time.sleep(1)
        self.check_alive()

    # --- nodes ----------------------------------------------------------------------------

    def add_nodes(self, count: int, threads: int = 16) -> list[str]:
        """Make `count` fake nodes and wait until kwok reports every one Ready. They carry
        whatever the RuntimeClass's scheduling asks for, so sandbox pods can land there."""
        runtime_class = self.kube.request("GET", "/apis/node.k8s.io/v1/runtimeclasses/gvisor")
        scheduling = runtime_class.get("scheduling") or {}
        labels = dict(scheduling.get("nodeSelector") or {})
        taints = [
            {"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]}
            for t in scheduling.get("tolerations") or []
            if t.get("key") and t.get("effect") and t.get("operator", "Equal") == "Equal"
        ]
        first = len(self.nodes)
        names = [f"{NODE_PREFIX}{i:04d}" for i in range(first, first + count)]
        subnets = POD_NETWORK.subnets(new_prefix=24)
        cidrs = [str(next(subnets)) for _ in range(first + count)][first:]

        def create(index: int) -> None:
            name = names[index]
            self.kube.request(
                "POST",
                "/api/v1/nodes",
                body={
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
                        "labels": {
                            **labels,
                            "type": "kwok",
                            "kubernetes.io/hostname": name,
                            "kubernetes.io/os": "linux",
                            "kubernetes.io/arch": "amd64",
                        },
                    },
                    # kwok hands out pod IPs from the node's range (strings only, never used).
                    "spec": {"podCIDR": cidrs[index], "podCIDRs": [cidrs[index]], "taints": taints},
                },
            )

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(create, range(count)))
        self.nodes.extend(names)

        def all_ready() -> bool:
            self.check_alive()
            return self.ready_nodes() >= len(self.nodes)

        wait_for(all_ready, 60 + count / 10, f"{len(self.nodes)} kwok nodes to be Ready", interval=1)
        return names

    def ready_nodes(self) -> int:
        ready = 0
        for node in list_all(self.kube, "/api/v1/nodes"):
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                ready += 1
        return ready

    # --- the controller -------------------------------------------------------------------

    @contextlib.contextmanager
    def controller(self, log_dir: Path, workers: int) -> Iterator[Controller]:
        """The controller for NAMESPACE as a subprocess, with its ServiceAccount's token."""
        kubeconfig = controller_kubeconfig(self.kube, str(self.admin_kubeconfig), log_dir)
        # The production resync, not the cluster tier's 10 s: at thousands of Sandboxes
        # the resync is a real part of the load.
        resync = str(ControllerOptions.resync_seconds)
        process = Controller(
            NAMESPACE, kubeconfig, log_dir, extra_args=("--resync-seconds", resync, "--workers", str(workers))
        )
        process.start()
        try:
            yield process
        finally:
            process.stop()


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=5, context=context) as response:  # noqa: S310  # our own loopback URL
        return int(response.status) == 200


# Writes only the controller makes: its pods, its finalizer and kopf's state, its status.
# (Not pod deletes: kwok, playing the kubelet, deletes pods too.)
CONTROLLER_WRITES = frozenset(
    {
        ("POST", "pods"),
        ("PATCH", "sandboxes"),
        ("PUT", "sandboxes"),
        ("PATCH", "sandboxes/status"),
        ("PUT", "sandboxes/status"),
    }
)
_REQUEST_TOTAL = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_requests(kube: Kube) -> Counter[tuple[str, str]]:
    """The API server's request counters so far, by verb and resource[/subresource], from
    its own metrics: what every client asked of it, counted where it was served."""
    request = kube.api.param_serialize(
        method="GET",
        resource_path="/metrics",
        header_params={"Accept": "text/plain"},
        auth_settings=["BearerToken"],
    )
    text = kube.api.call_api(*request).read().decode()  # type: ignore[no-untyped-call]
    counts: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        if found := _REQUEST_TOTAL.match(line):
            labels = dict(_LABEL.findall(found["labels"]))
            resource = labels.get("resource", "") + (
                f"/{labels['subresource']}" if labels.get("subresource") else ""
            )
            counts[labels.get("verb", ""), resource] += int(float(found["value"]))
    return counts


def controller_writes(before: Counter[tuple[str, str]], after: Counter[tuple[str, str]]) -> int:
    return sum(after[key] - before[key] for key in CONTROLLER_WRITES)


def list_all(kube: Kube, path: str, page: int = 500) -> list[Obj]:
    """Every item of a collection, a page at a time so no single response is huge."""
    items: list[Obj] = []
    token = ""
    while True:
        query = {"limit": str(page)}
        if token:
            query["continue"] = token
        result = kube.request("GET", path, query=query)
        items.extend(result.get("items") or [])
        token = (result.get("metadata") or {}).get("continue") or ""
        if not token:
            return items


def sandboxes_path(namespace: str = NAMESPACE) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}"


# --- the measurement ------------------------------------------------------------------------


@dataclass
class ReconcileResult:
    nodes: int
    sandboxes: int
    workers: int
    create_seconds: float  # the first create's start to the last create's return
    seconds: float  # the first create's start to the last Sandbox reporting Running
    reconcile_per_s: float
    create_errors: list[str] = field(default_factory=list)
    delete_seconds: float | None = None  # all deleted, finalizers included (measure_reconcile)
    usage: dict[str, Usage] = field(default_factory=dict)  # at the end of the measurement

    def summary(self) -> str:
        lines = [
            f"{self.sandboxes} sandboxes on {self.nodes} kwok nodes, controller workers {self.workers}",
            f"creates: {self.create_seconds:.1f} s ({self.sandboxes / max(self.create_seconds, 1e-9):.0f}/s)",
            f"all Running after {self.seconds:.1f} s: reconcile_per_s {self.reconcile_per_s:.1f}",
        ]
        if self.delete_seconds is not None:
            lines.append(f"all deleted after {self.delete_seconds:.1f} s")
        lines += [
            f"{name}: cpu {u.cpu_seconds:.0f} s, peak rss {u.peak_rss_mib:.0f} MiB"
            for name, u in self.usage.items()
        ]
        return "\n".join(lines)


class PhaseWatch:
    """Which Sandboxes of the namespace report `phase`, followed through one watch: waiting
    for thousands costs a stream, not repeated lists of every object."""

    def __init__(self, kube: Kube, phase: str = "Running", namespace: str = NAMESPACE) -> None:
        self.custom = client.CustomObjectsApi(kube.api)
        self.phase = phase
        self.namespace = namespace
        self.reached: set[str] = set()
        self.changed = threading.Condition()
        self.stopping = threading.Event()
        self.error: BaseException | None = None  # the last one; the watch retries
        self.thread = threading.Thread(target=self._run, name="sandbox-watch", daemon=True)

    def __enter__(self) -> PhaseWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopping.set()
        self.thread.join(timeout=40)  # the server ends each watch within 30 s

    def _run(self) -> None:
        version = ""
        while not self.stopping.is_set():
            try:
                if not version:
                    version = self._relist()
                stream = watch.Watch()  # type: ignore[no-untyped-call]
                for event in stream.stream(  # type: ignore[no-untyped-call]
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    PLURAL,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=30,
                ):
                    obj = event["object"]
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._record(obj, deleted=event["type"] == "DELETED")
                    if self.stopping.is_set():
                        stream.stop()  # type: ignore[no-untyped-call]
            except ApiException as exc:  # 410: the version is too old; list again
                self.error = exc
                version = ""
            except Exception as exc:  # a dropped stream: resume from the last version
                self.error = exc
                time.sleep(0.5)

    def _relist(self) -> str:
        result = cast(Obj, self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL))
        with self.changed:
            self.reached.clear()
            for obj in result.get("items") or []:
                self._record(obj, deleted=False)
        return str(result["metadata"]["resourceVersion"])

    def _record(self, obj: Obj, deleted: bool) -> None:
        name = obj["metadata"]["name"]
        with self.changed:
            if not deleted and (obj.get("status") or {}).get("phase") == self.phase:
                self.reached.add(name)
            else:
                self.reached.discard(name)
            self.changed.notify_all()

    def wait(self, count: int, timeout: float, check: Callable[[], None]) -> int:
        """Wait until `count` Sandboxes report the phase; returns how many do."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while len(self.reached) < count and time.monotonic() < deadline:
                self.changed.wait(timeout=1.0)
                check()
            return len(self.reached)


def create_sandboxes(kube: Kube, names: list[str], threads: int, image: str = "busybox") -> list[str]:
    """Create the Sandboxes from a pool of threads; returns the errors (empty when all made)."""
    path = sandboxes_path()

    def one(name: str) -> str | None:
        body = sandbox_body(name, image)
        body["metadata"]["finalizers"] = [FINALIZER]  # as the API creates them
        try:
            kube.request("POST", path, body=body)
        except ApiException as exc:
            return f"{name}: {exc.status} {exc.reason}"
        return None

    with ThreadPoolExecutor(threads) as pool:
        return [error for error in pool.map(one, names) if error]


def reconcile(
    cluster: KwokCluster,
    controller: Controller,
    count: int,
    *,
    workers: int,
    create_threads: int = 32,
    timeout: float = 1800,
    prefix: str = "scale",
) -> ReconcileResult:
    """Create `count` Sandboxes (in an empty namespace) while `controller` runs, and wait
    until every one reports Running. The clock starts before the first create, so the rate
    includes the creates themselves (also recorded apart, as create_seconds)."""
    kube = connect(cluster.admin_kubeconfig, pool=create_threads)
    names = [f"{prefix}-{i:05d}" for i in range(count)]

    def check() -> None:
        cluster.check_alive()
        if not controller.running():
            raise RuntimeError(f"the controller exited:\n{controller.logs()}")

    with PhaseWatch(kube) as running:
        start = time.monotonic()
        errors = create_sandboxes(kube, names, create_threads)
        created = time.monotonic()
        reached = running.wait(count, timeout, check)
        seconds = time.monotonic() - start
    if reached < count:
        raise AssertionError(
            f"only {reached} of {count} Sandboxes Running after {timeout:.0f} s "
            f"(last watch error: {running.error!r})"
        )
    usage = cluster.usage()
    if controller.process is not None and (own := usage_of(controller.process.pid)):
        usage["controller"] = own
    if mine := usage_of(os.getpid()):
        usage["test process"] = mine
    return ReconcileResult(
        nodes=len(cluster.nodes),
        sandboxes=count,
        workers=workers,
        create_seconds=round(created - start, 2),
        seconds=round(seconds, 2),
        reconcile_per_s=round(count / seconds, 2),
        create_errors=errors,
        usage=usage,
    )


def delete_all(cluster: KwokCluster, threads: int = 32, timeout: float = 1800) -> float:
    """Delete every Sandbox of NAMESPACE concurrently; seconds until none is left (the
    finalizers ran, which wait for each pod to be gone)."""
    kube = connect(cluster.admin_kubeconfig, pool=threads)
    names = [s["metadata"]["name"] for s in list_all(kube, sandboxes_path())]
    start = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda name: kube.delete_sandbox(NAMESPACE, name), names))

    def gone() -> bool:
        cluster.check_alive()
        return not kube.request("GET", sandboxes_path(), query={"limit": "1"}).get("items")

    wait_for(gone, timeout, f"all {len(names)} Sandboxes to be deleted", interval=1)
    return round(time.monotonic() - start, 2)


def measure_reconcile(
    cluster: KwokCluster, count: int, *, log_dir: Path, workers: int = 32, delete: bool = True
) -> ReconcileResult:
    """The whole measurement in one call (for a benchmark): the controller as a subprocess,
    `count` Sandboxes created and timed to Running, then, with `delete`, all of them deleted
    and timed until their finalizers ran. The cluster needs its nodes (add_nodes) first."""
    with cluster.controller(log_dir, workers) as controller:
        result = reconcile(cluster, controller, count, workers=workers)
        if delete:
            result.delete_seconds = delete_all(cluster)
    return result
