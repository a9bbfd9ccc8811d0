"""The throw-away control plane itself: start, stop, and fake nodes."""

from __future__ import annotations

import json
import shutil
import signal
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Self, TypeVar

from warren_common.files import write_private
from warren_common.kubecluster import commands
from warren_common.kubecluster.client import Client
from warren_common.kubecluster.commands import Layout, Obj
from warren_common.kubecluster.options import Options, require_binaries
from warren_common.kubecluster.processes import PortTakenError, Process, spawn, stop_all
from warren_common.pki import SERVER, Leaf, Pki
from warren_common.testing import free_port, wait_for

START_TIMEOUT = 120.0
PORT_ATTEMPTS = 3  # starts of one server on new ports, when it lost the race for one
T = TypeVar("T")


class KubeCluster:
    """`with KubeCluster(bin_dir, options) as cluster:` runs the control plane `options` asks
    for; `cluster.admin_kubeconfig`, `cluster.client`. Every file lives in one temporary
    directory and every server listens on free loopback ports, so it runs beside a real
    cluster and shares nothing with it. A failed start, like the end of the block, stops every
    process (newest first) and removes the directory. Subclasses add to `start`."""

    def __init__(self, bin_dir: Path, options: Options | None = None) -> None:
        self.bin_dir = bin_dir
        self.options = options or Options()
        self.root = Path(tempfile.mkdtemp(prefix=self.options.prefix))
        self.layout = Layout(self.root)
        self.admin_kubeconfig = self.layout.kubeconfig("admin")
        self.processes: list[Process] = []
        self.server = ""  # https://127.0.0.1:<port>, once the API server has a port
        self.nodes: list[str] = []  # the fake nodes made so far
        self._client: Client | None = None
        self._sigterm: Any = None

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> Self:
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
        options = self.options
        require_binaries(self.bin_dir, options)
        self.layout.logs.mkdir(parents=True)
        self._issue_certificates()
        etcd_url = _on_free_ports(self._start_etcd)
        _on_free_ports(lambda: self._start_apiserver(etcd_url))
        if options.controllers:
            argv = commands.controller_manager_argv(self.bin_dir, self.layout, options.controllers)
            self._spawn("kube-controller-manager", argv)
        if options.scheduler:
            self.layout.scheduler_settings.write_text(json.dumps(commands.scheduler_settings(self.layout)))
            self._spawn("kube-scheduler", commands.scheduler_argv(self.bin_dir, self.layout))
        if options.kwok:
            argv = commands.kwok_argv(self.bin_dir, self.layout, options.stages, options.node_lease_seconds)
            self._spawn("kwok", argv)
        if options.controllers or options.scheduler or options.kwok:
            # None of these has an endpoint to probe: give them a moment, then insist they run.
            time.sleep(1)
            self.check_alive()
        if options.nodes:
            self.add_fake_nodes(options.nodes)

    def stop(self) -> None:
        """Stop what was started, newest first, and remove the directory."""
        stop_all(self.processes)
        self.processes.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.alive():
                raise process.exited()

    @property
    def client(self) -> Client:
        """Requests as the admin (system:masters, warren:platform)."""
        if self._client is None:
            layout = self.layout
            self._client = Client(self.server, layout.cert("ca"), layout.cert("admin"), layout.key("admin"))
        return self._client

    # --- fake nodes -----------------------------------------------------------------------

    def add_fake_nodes(
        self,
        names: Sequence[str],
        *,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Obj] = (),
        threads: int = 16,
        timeout: float | None = None,
    ) -> list[str]:
        """Make kwok's nodes `names` (with `labels` and `taints` besides the usual ones) and wait
        until kwok reports every one Ready."""
        if not self.options.kwok:
            raise RuntimeError("fake nodes need kwok: start the cluster with Options(kwok=True)")
        first = len(self.nodes)

        def create(index: int) -> None:
            body = commands.fake_node(names[index], first + index, labels or {}, taints)
            self.client.request("POST", "/api/v1/nodes", body)

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(create, range(len(names))))
        self.nodes.extend(names)
        wanted = set(names)

        def all_ready() -> bool:
            self.check_alive()
            ready = {n["metadata"]["name"] for n in self.client.list("/api/v1/nodes") if commands.is_ready(n)}
            return wanted <= ready

        # kwok has no readiness endpoint: a node it took is the sign that it works.
        wait = timeout if timeout is not None else START_TIMEOUT + len(names) / 10
        wait_for(all_ready, wait, f"{len(names)} kwok nodes to be Ready", interval=0.5)
        return list(names)

    # --- components -----------------------------------------------------------------------

    def _issue_certificates(self) -> None:
        certificates = Pki(self.layout.pki)
        certificates.ensure_ca("ca", "warren-test-ca")
        leaves = [
            Leaf(
                "apiserver",
                "ca",
                "kube-apiserver",
                usages=(SERVER,),
                dns_names=("localhost", "kubernetes.default.svc"),
                ips=("127.0.0.1",),
            ),
            # As the local cluster's admin is: the floor guard lets warren:platform manage the floor.
            Leaf("admin", "ca", "warren-admin", organizations=("system:masters", "warren:platform")),
        ]
        if self.options.controllers:
            # The namespace controller deletes every kind inside a namespace. With its own
            # identity and no per-controller service accounts, only system:masters covers
            # every kind, CRDs included.
            leaves.append(
                Leaf(
                    "controller-manager",
                    "ca",
                    "system:kube-controller-manager",
                    organizations=("system:masters",),
                )
            )
        if self.options.scheduler:
            leaves.append(Leaf("scheduler", "ca", "system:kube-scheduler"))
        for leaf in leaves:
            certificates.ensure_leaf(leaf)
        certificates.ensure_keypair("sa")

    def _write_kubeconfigs(self) -> None:
        users = ["admin"]
        users += ["controller-manager"] if self.options.controllers else []
        users += ["scheduler"] if self.options.scheduler else []
        layout = self.layout
        for user in users:
            document = commands.kubeconfig(
                self.server, layout.cert("ca"), layout.cert(user), layout.key(user), user
            )
            write_private(layout.kubeconfig(user), json.dumps(document, indent=2) + "\n")

    def _spawn(self, name: str, argv: list[str]) -> Process:
        process = spawn(name, argv, self.layout.logs / f"{name}.log")
        self.processes.append(process)
        return process

    def _wait(self, process: Process, ready: Callable[[], bool]) -> None:
        def check() -> bool:
            if not process.alive():
                error = process.exited()
                if isinstance(error, PortTakenError):
                    self.processes.remove(process)
                raise error
            return ready()

        try:
            wait_for(check, START_TIMEOUT, f"{process.name} to be ready", interval=0.2)
        except AssertionError as exc:
            raise RuntimeError(f"{exc}\n{process.tail()}") from None

    def _start_etcd(self) -> str:
        client, peer, metrics = free_port(), free_port(), free_port()
        shutil.rmtree(self.layout.etcd_data, ignore_errors=True)  # what a start that lost a port left
        etcd = self._spawn("etcd", commands.etcd_argv(self.bin_dir, self.layout, client, peer, metrics))
        url = f"http://127.0.0.1:{client}"
        self._wait(etcd, lambda: _http_ok(f"{url}/health"))
        return url

    def _start_apiserver(self, etcd_url: str) -> None:
        port = free_port()
        self.server = f"https://127.0.0.1:{port}"
        self._client = None
        self._write_kubeconfigs()
        apiserver = self._spawn(
            "kube-apiserver", commands.apiserver_argv(self.bin_dir, self.layout, port, etcd_url)
        )
        self._wait(apiserver, self.client.ready)


def _on_free_ports(start: Callable[[], T]) -> T:
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return start()
        except PortTakenError:
            if attempt == PORT_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310  # our own loopback URL
            return int(response.status) == HTTPStatus.OK
    except OSError:
        return False


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
