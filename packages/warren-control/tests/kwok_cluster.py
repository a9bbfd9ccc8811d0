"""The controller's scale test on a throw-away control plane (warren_common.kubecluster:
etcd, kube-apiserver, kube-scheduler and the kwok controller, which plays the kubelet for any
number of fake nodes). The Warren floor is applied with `warren apply` (so the Sandbox CRD,
the RuntimeClass, the controller's RBAC and the admission policies are exactly what a real
cluster gets), and the controller runs as a subprocess with its own ServiceAccount, as in the
cluster tier.

No root needed, and it runs beside the real local cluster. No kube-controller-manager: the
one thing the test needs from it, a namespace's default ServiceAccount, is made here, and its
node lifecycle and garbage collection would only add load to a measurement of ours.

`reconcile` measures the controller: create M Sandboxes concurrently and time the first
create to the last one reporting Running (`reconcile_per_s`); `measure_reconcile` does
that and the deletion in one call, for a benchmark.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from k8s_helpers import Controller, controller_kubeconfig, sandbox_body
from kubernetes import client, config
from warren_common import kubecluster
from warren_common.kubecluster import KubeCluster, node_names
from warren_common.testing import wait_for
from warren_control.controller import ControllerOptions
from warren_control.kube import ApiException, Kube, Obj
from warren_control.podspec import FINALIZER, GROUP, PLURAL, VERSION, pod_for

REPO = Path(__file__).resolve().parents[3]
NAMESPACE = "warren-sandboxes"  # the floor's default sandbox namespace (`warren apply` makes it)


def options(node_lease_seconds: int = 600) -> kubecluster.Options:
    # kwok renews a Lease per node every quarter of node_lease_seconds, as a kubelet does.
    # Nothing here reads the leases (no node lifecycle controller runs), and at 40 s, 1,000
    # nodes wrote 100 renewals a second to the API server for the whole test.
    return kubecluster.Options(
        scheduler=True, kwok=True, node_lease_seconds=node_lease_seconds, prefix="warren-kwok-"
    )


def missing_binaries(bin_dir: Path) -> list[str]:
    return kubecluster.missing_binaries(bin_dir, options())


def warren_cli() -> Path:
    """The repository's own `warren` command (its virtualenv: `make venv`): it renders and
    applies the floor; this package's virtualenv has neither jinja2 nor the templates."""
    return REPO / ".venv" / "bin" / "warren"


def connect(kubeconfig: Path, pool: int = 64) -> Kube:
    """A client whose connection pool holds `pool` connections: the default (5 per CPU)
    would make every request beyond it open a new TLS connection when many threads share
    the client."""
    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)  # type: ignore[no-untyped-call]
    configuration.connection_pool_maxsize = pool
    return Kube(client.ApiClient(configuration))


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


class KwokCluster(KubeCluster):
    """Start with `with KwokCluster(bin_dir) as cluster:`; `add_nodes` makes fake nodes."""

    def __init__(self, bin_dir: Path, *, warren: Path | None = None, node_lease_seconds: int = 600) -> None:
        super().__init__(bin_dir, options(node_lease_seconds))
        self.warren = warren or warren_cli()
        self._kube: Kube | None = None

    def start(self) -> None:
        super().start()
        self._apply_floor()

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = connect(self.admin_kubeconfig)
        return self._kube

    def usage(self) -> dict[str, Usage]:
        found = {p.name: usage_of(p.popen.pid) for p in self.processes if p.alive()}
        return {name: value for name, value in found.items() if value is not None}

    def _apply_floor(self) -> None:
        if not os.access(self.warren, os.X_OK):
            raise RuntimeError(f"{self.warren} is missing: `make venv` installs the warren command")
        env = {**os.environ, "WARREN_HOME": str(self.root / "home")}  # never the real cluster's state
        # The floor alone: this cluster's controller is the test's, and no kwok node may
        # "run" Warren's own workloads.
        floor = REPO / "tests" / "cluster" / "warren-floor.yaml"
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

    # --- nodes ----------------------------------------------------------------------------

    def add_nodes(self, count: int, threads: int = 16) -> list[str]:
        """Make `count` fake nodes and wait until kwok reports every one Ready. They carry
        whatever the RuntimeClass's scheduling asks for, so sandbox pods can land there."""
        runtime_class = self.kube.request("GET", "/apis/node.k8s.io/v1/runtimeclasses/gvisor")
        scheduling = runtime_class.get("scheduling") or {}
        labels = {**(scheduling.get("nodeSelector") or {}), "type": "kwok"}
        taints = [
            {"key": t["key"], "value": t.get("value", ""), "effect": t["effect"]}
            for t in scheduling.get("tolerations") or []
            if t.get("key") and t.get("effect") and t.get("operator", "Equal") == "Equal"
        ]
        names = node_names(count, first=len(self.nodes))
        return self.add_fake_nodes(
            names, labels=labels, taints=taints, threads=threads, timeout=60 + count / 10
        )

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


# Writes only the controller makes: its pods, its finalizer, its status.
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
# Single-object reads: what the controller's passes cost when they read the API server
# instead of its watch-fed memory (the test's own waiting is by watch and list).
CONTROLLER_READS = frozenset({("GET", "pods"), ("GET", "sandboxes")})
# The direct pods' only label: no controller, mirror or pool reads it.
DIRECT_LABEL = "warren.dev/bench-direct"
_REQUEST_TOTAL = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def api_requests(kube: Kube) -> Counter[tuple[str, str]]:
    """The API server's request counters so far, by verb and resource[/subresource], from
    its own metrics: what every client asked of it, counted where it was served. Requests
    it throttled (429: its priority and fairness turned them away under load, before any
    work) are left out: the client's retry of one is counted when it is served."""
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
            if labels.get("code") == "429":
                continue
            resource = labels.get("resource", "") + (
                f"/{labels['subresource']}" if labels.get("subresource") else ""
            )
            counts[labels.get("verb", ""), resource] += int(float(found["value"]))
    return counts


def controller_writes(before: Counter[tuple[str, str]], after: Counter[tuple[str, str]]) -> int:
    return sum(after[key] - before[key] for key in CONTROLLER_WRITES)


def controller_reads(before: Counter[tuple[str, str]], after: Counter[tuple[str, str]]) -> int:
    return sum(after[key] - before[key] for key in CONTROLLER_READS)


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
    """Which objects of a collection (the namespace's Sandboxes unless `path` says otherwise)
    report `phase`, followed through one watch: waiting for thousands costs a stream, not
    repeated lists of every object. The reconcile rate and its baseline (direct pods) both
    wait through one, so neither pays for its waiting more than the other."""

    def __init__(
        self,
        kube: Kube,
        path: str | None = None,
        *,
        query: dict[str, str] | None = None,
        phase: str = "Running",
    ) -> None:
        self.kube = kube
        self.path = path or sandboxes_path()
        self.query = query or {}
        self.phase = phase
        self.reached: set[str] = set()
        self.changed = threading.Condition()
        self.stopping = threading.Event()
        self.error: BaseException | None = None  # the last one; the watch retries
        self.thread = threading.Thread(target=self._run, name="phase-watch", daemon=True)

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
                for event in self.kube.watch(self.path, version, query=self.query, timeout_s=30):
                    obj = event["object"]
                    if event["type"] == "ERROR":  # 410: the version is too old; list again
                        self.error = RuntimeError(obj.get("message"))
                        version = ""
                        break
                    version = obj["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        self._record(obj, deleted=event["type"] == "DELETED")
                    if self.stopping.is_set():
                        break
            except Exception as exc:  # a dropped stream: resume from the last version
                self.error = exc
                time.sleep(0.5)

    def _relist(self) -> str:
        items, version = self.kube.list_with_version(self.path, self.query)
        with self.changed:
            self.reached.clear()
            for obj in items:
                self._record(obj, deleted=False)
        return version

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


def create_sandboxes(
    kube: Kube, names: list[str], threads: int, image: str = "busybox", spec: Obj | None = None
) -> list[str]:
    """Create the Sandboxes from a pool of threads; returns the errors (empty when all made)."""
    path = sandboxes_path()

    def one(name: str) -> str | None:
        body = sandbox_body(name, image, **(spec or {}))
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
    spec: Obj | None = None,
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
        errors = create_sandboxes(kube, names, create_threads, spec=spec)
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
    wait_until_none(
        cluster, kube, sandboxes_path(), {}, timeout=timeout, what=f"all {len(names)} Sandboxes to be deleted"
    )
    return round(time.monotonic() - start, 2)


def wait_until_none(
    cluster: KwokCluster, kube: Kube, path: str, query: dict[str, str], *, timeout: float, what: str
) -> None:
    """Wait until the collection (filtered by `query`) holds nothing, a page of one at a time."""

    def none() -> bool:
        cluster.check_alive()
        return not kube.request("GET", path, query={**query, "limit": "1"}).get("items")

    wait_for(none, timeout, what, interval=1)


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


def measure_direct_pods(cluster: KwokCluster, count: int, threads: int = 32, timeout: float = 1800) -> float:
    """The baseline for the reconcile rate: `count` pods made directly (the controller's own
    pod for a Sandbox, without a Sandbox: no owner, and labelled so that no controller
    takes them), from `threads` threads, until kwok reports every one Running; pods per
    second. They are deleted again afterwards, and gone when it returns."""
    kube = connect(cluster.admin_kubeconfig, pool=threads)
    bodies = []
    for i in range(count):
        sandbox = sandbox_body(f"direct-{i:05d}", "busybox")
        sandbox["metadata"].update(namespace=NAMESPACE, uid=f"00000000-0000-4000-8000-{i:012d}")
        pod = pod_for(sandbox)
        pod["metadata"].pop("ownerReferences", None)
        pod["metadata"]["labels"] = {DIRECT_LABEL: "true"}
        bodies.append(pod)
    selector = f"{DIRECT_LABEL}=true"
    with PhaseWatch(kube, kube.pods_path(NAMESPACE), query={"labelSelector": selector}) as running:
        start = time.monotonic()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda body: kube.create_pod(NAMESPACE, body), bodies))
        reached = running.wait(count, timeout, cluster.check_alive)
        seconds = time.monotonic() - start
    if reached < count:
        raise AssertionError(f"only {reached} of {count} direct pods Running after {timeout:.0f} s")
    kube.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods", query={"labelSelector": selector})
    # kwok removes them: a measurement after this one starts without them.
    query = {"labelSelector": selector}
    wait_until_none(
        cluster,
        kube,
        kube.pods_path(NAMESPACE),
        query,
        timeout=timeout,
        what=f"the {count} direct pods to be deleted",
    )
    return round(count / seconds, 2)
