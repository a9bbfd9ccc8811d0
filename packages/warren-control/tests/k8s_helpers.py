"""Helpers for the cluster tests: throw-away sandbox namespaces with the floor's labels, a
kubeconfig for the controller's own ServiceAccount, and the controller as a real
subprocess that a test may kill. The fixtures built on them are in k8s_fixtures.py."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from warren_common.testing import wait_for as wait_for  # noqa: PLC0414 (kwok_cluster.py imports it from here)
from warren_control.kube import ApiException, Kube, Obj
from warren_control.podspec import SANDBOX_UID_LABEL, controller_uid

FLOOR_NAMESPACE = "warren-sandboxes"  # made by `warren apply`; test namespaces copy its labels
CONTROLLER_SA = ("warren-system", "warren-controller")
# Small enough that a dozen sandboxes fit a two-CPU test machine; enough memory for gVisor's
# own processes, which share the pod's limit.
SMALL = {"cpu": "50m", "memory": "128Mi"}


def sandbox_body(name: str, image: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": image, "command": ["sleep", "86400"], "resources": dict(SMALL), **spec},
    }


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def pods_of(kube: Kube, namespace: str, uid: str) -> list[Obj]:
    """Every pod of a Sandbox, whatever its name: by label and by owner, so a duplicate made
    under another name would be counted too."""
    labelled = kube.list_pods(namespace, f"{SANDBOX_UID_LABEL}={uid}")
    owned = [p for p in kube.list_pods(namespace, "") if controller_uid(p) == uid]
    by_uid = {p["metadata"]["uid"]: p for p in labelled + owned}
    return list(by_uid.values())


def live(pods: list[Obj]) -> list[Obj]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def strip_finalizers(kube: Kube, namespace: str) -> None:
    for sandbox in kube.list_sandboxes(namespace):
        try:
            kube.patch_sandbox(namespace, sandbox["metadata"]["name"], {"metadata": {"finalizers": None}})
        except ApiException as exc:
            if exc.status != 404:
                raise


def delete_namespace(kube: Kube, name: str) -> None:
    try:
        kube.request("DELETE", f"/api/v1/namespaces/{name}", body={"propagationPolicy": "Background"})
    except ApiException as exc:
        if exc.status != 404:
            raise


def make_namespace(kube: Kube) -> str:
    """A fresh sandbox namespace with the labels `warren apply` gives its own, so the
    admission floor and Pod Security apply exactly as there."""
    template = kube.request("GET", f"/api/v1/namespaces/{FLOOR_NAMESPACE}")
    labels = {k: v for k, v in template["metadata"]["labels"].items() if k != "kubernetes.io/metadata.name"}
    assert labels.get("warren.dev/sandbox") == "true", labels
    name = unique("warren-control-test")
    kube.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name, "labels": labels}})
    # Pods are admitted only once the namespace's default ServiceAccount exists.
    wait_for(
        lambda: _exists(kube, f"/api/v1/namespaces/{name}/serviceaccounts/default"),
        timeout=60,
        what=f"the default ServiceAccount of {name}",
        interval=0.2,
    )
    return name


def _exists(kube: Kube, path: str) -> bool:
    try:
        kube.request("GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def controller_kubeconfig(kube: Kube, admin_kubeconfig: str, directory: Path) -> Path:
    """A kubeconfig for the controller's own ServiceAccount (a short-lived token from the
    TokenRequest API), so the tests also prove the RBAC `warren apply` grants it is enough."""
    namespace, account = CONTROLLER_SA
    token = kube.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200},
        },
    )["status"]["token"]
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c["context"] for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = dict(next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"]))
    if "certificate-authority" in cluster:
        ca = (Path(admin_kubeconfig).parent / cluster.pop("certificate-authority")).read_bytes()
        cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": cluster}],
        "users": [{"name": "controller", "user": {"token": token}}],
        "contexts": [{"name": "controller", "context": {"cluster": "cluster", "user": "controller"}}],
        "current-context": "controller",
    }
    path = directory / "controller.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# Runs the controller with one change: the process SIGKILLs itself right after its Nth pod
# create returned, before it wrote any status.
CRASH_HOOK = """
import os, signal, sys, threading
from warren_control import controller
from warren_control.kube import Kube

limit = int(os.environ["WARREN_TEST_CRASH_AFTER_CREATES"])
original = Kube.create_pod
lock = threading.Lock()
made = [0]

def create_pod(self, namespace, body, *, dry_run=False):
    pod = original(self, namespace, body, dry_run=dry_run)
    with lock:
        made[0] += 1
        if made[0] >= limit:
            os.kill(os.getpid(), signal.SIGKILL)
    return pod

Kube.create_pod = create_pod
controller.main(sys.argv[1:])
"""


class Controller:
    """The controller as a subprocess of the tests, logging to a file."""

    def __init__(
        self, namespace: str, kubeconfig: Path, log_dir: Path, extra_args: Sequence[str] = ()
    ) -> None:
        self.namespace = namespace
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.extra_args = tuple(extra_args)  # after the defaults below, so they override them
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, crash_after_creates: int | None = None) -> None:
        assert self.process is None or self.process.poll() is not None, "already running"
        self.starts += 1
        args = [
            "--namespace",
            self.namespace,
            "--kubeconfig",
            str(self.kubeconfig),
            "--image-pull-policy",
            "Never",
            "--resync-seconds",
            "10",
            "--log-format",
            "plain",
            *self.extra_args,
        ]
        env = dict(os.environ)
        if crash_after_creates is None:
            argv = [sys.executable, "-m", "warren_control.controller", *args]
        else:
            argv = [sys.executable, "-c", CRASH_HOOK, *args]
            env["WARREN_TEST_CRASH_AFTER_CREATES"] = str(crash_after_creates)
        log = (self.log_dir / f"controller-{self.starts}.log").open("wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def kill(self) -> None:
        """SIGKILL: no cleanup, no chance to finish what it was doing."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def logs(self) -> str:
        """The end of each log."""
        parts = []
        for path in sorted(self.log_dir.glob("controller-*.log")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)


@contextlib.contextmanager
def serving_controller(
    kube: Kube,
    kubeconfig: str,
    namespace: str,
    log_dir: Path,
    *,
    extra_args: Sequence[str] = (),
    delete_timeout: float = 120,
) -> Iterator[Controller]:
    """A controller for the namespace, running as the controller's ServiceAccount (with
    `extra_args`). Afterwards every Sandbox is deleted through it (so finalizers run), within
    `delete_timeout` seconds. Its logs are printed at the end, which pytest shows only for a
    failed test."""
    process = Controller(namespace, controller_kubeconfig(kube, kubeconfig, log_dir), log_dir, extra_args)
    process.start()
    try:
        yield process
    finally:
        try:
            if not process.running():
                process.start()
            for sandbox in kube.list_sandboxes(namespace):
                kube.delete_sandbox(namespace, sandbox["metadata"]["name"])
            wait_for(
                lambda: not kube.list_sandboxes(namespace), delete_timeout, "every Sandbox to be deleted"
            )
        except AssertionError:
            strip_finalizers(kube, namespace)
            raise
        finally:
            process.stop()
            print(process.logs())
