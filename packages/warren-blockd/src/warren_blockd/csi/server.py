"""The plugin process: CSI Identity and Node on the endpoint, registration on
`<registration dir>/blockd.warren.dev-reg.sock`, until a signal or a failed registration.

A registration kubelet reports as failed ends the process with status 1 (as kubelet's own
node-driver-registrar does): whatever supervises it starts it again, and kubelet retries
when the new registration socket appears.

During a rollout two plugin processes (an old pod's and a new one's) briefly share both
socket paths. Each socket is bound under a temporary name and renamed into place, so the
path never goes missing (kubelet's plugin watcher sees a new socket, never a removed one,
and re-registers the driver without a gap); and a plugin that stops removes a path only if
it still holds its own socket, never its successor's.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import grpc

from warren_blockd import __version__
from warren_blockd.client import Client
from warren_blockd.csi import DRIVER_NAME, bindapi
from warren_blockd.csi.proto import csi_pb2_grpc, pluginregistration_pb2_grpc
from warren_blockd.csi.publisher import Publisher
from warren_blockd.csi.services import IdentityService, NodeService, RegistrationService

log = logging.getLogger("warren_blockd.csi")


@dataclass(frozen=True)
class PluginConfig:
    endpoint: Path
    registration_dir: Path
    node_id: str
    blockd_socket: str
    plugin_dir: Path
    replicate_wait: float = 45.0
    workers: int = 8
    # The bind API (bindapi.py): where it listens and the file holding its token; both or neither.
    bind_address: tuple[str, int] | None = None
    bind_token_file: Path | None = None
    # The container runtime's state directory (containerd's `state`): a bind may name a
    # running container of the pod, whose root file system the runtime keeps there.
    runtime_state: Path | None = None

    @property
    def registration_socket(self) -> Path:
        return self.registration_dir / f"{DRIVER_NAME}-reg.sock"


def endpoint_path(endpoint: str) -> Path:
    """`unix:///csi/csi.sock` (the CSI convention) or a plain absolute path."""
    path = endpoint.removeprefix("unix://") if endpoint.startswith("unix://") else endpoint
    if not path.startswith("/"):
        raise ValueError(f"--endpoint {endpoint!r} is not a unix socket: use unix:///ABSOLUTE/PATH")
    return Path(path)


SUN_PATH_MAX = 107  # a unix socket's path fits in sockaddr_un.sun_path (108 bytes with NUL)


def _listen(server: grpc.Server, path: Path) -> tuple[int, int]:
    """Bind `server` at `path`, replacing whatever socket is there in one rename; returns
    the socket file's identity (device, inode) for `_remove_if_ours`."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    if len(str(tmp).encode()) > SUN_PATH_MAX:
        raise SystemExit(f"socket path {path} is longer than {SUN_PATH_MAX - 12} bytes: choose a shorter one")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.unlink(missing_ok=True)
    old = os.umask(0o077)  # both sockets are root's: whoever reaches them mounts workspaces
    try:
        server.add_insecure_port(f"unix:{tmp}")
    finally:
        os.umask(old)
    info = tmp.stat()
    tmp.replace(path)
    return info.st_dev, info.st_ino


def _remove_if_ours(path: Path, identity: tuple[int, int]) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return
    if (info.st_dev, info.st_ino) == identity:
        path.unlink(missing_ok=True)
    else:
        log.info(
            "left the socket in place: another plugin serves it now", extra={"fields": {"path": str(path)}}
        )


def run(config: PluginConfig) -> int:
    # An unpublish waits for replication at the flush and again at the detach.
    client = Client(config.blockd_socket, timeout=2 * config.replicate_wait + 60)
    publisher = Publisher(client, config.plugin_dir, config.replicate_wait, config.runtime_state)
    stop = threading.Event()
    failure: list[str] = []

    def on_registration(registered: bool, error: str) -> None:
        fields = {"registered": registered, "error": error or None}
        if registered:
            log.info("kubelet registered the plugin", extra={"fields": fields})
            return
        log.error("kubelet refused the registration; exiting to be restarted", extra={"fields": fields})
        failure.append(error or "registration failed")
        stop.set()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)

    csi = grpc.server(ThreadPoolExecutor(config.workers, thread_name_prefix="csi"))
    csi_pb2_grpc.add_IdentityServicer_to_server(IdentityService(publisher), csi)
    csi_pb2_grpc.add_NodeServicer_to_server(NodeService(publisher, config.node_id), csi)
    endpoint_id = _listen(csi, config.endpoint)
    registration = grpc.server(ThreadPoolExecutor(2, thread_name_prefix="registration"))
    pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(
        RegistrationService(config.endpoint, on_registration), registration
    )
    csi.start()
    binder = None
    if config.bind_address and config.bind_token_file:
        binder = bindapi.server(config.bind_address, config.bind_token_file.read_bytes(), publisher)
        threading.Thread(target=binder.serve_forever, name="bind-api", daemon=True).start()
    # The registration socket last: kubelet calls the endpoint as soon as it sees it.
    registration_id = _listen(registration, config.registration_socket)
    registration.start()
    log.info(
        "serving",
        extra={
            "fields": {
                "driver": DRIVER_NAME,
                "version": __version__,
                "endpoint": str(config.endpoint),
                "registration": str(config.registration_socket),
                "node_id": config.node_id,
                "blockd_socket": config.blockd_socket,
                "plugin_dir": str(config.plugin_dir),
                "bind_api": f"{config.bind_address[0]}:{config.bind_address[1]}"
                if binder and config.bind_address
                else None,
            }
        },
    )
    stop.wait()
    # Socket gone first: kubelet deregisters the plugin and stops calling it (unless a new
    # plugin has replaced it: then kubelet keeps calling that one).
    _remove_if_ours(config.registration_socket, registration_id)
    registration.stop(grace=1).wait()
    if binder is not None:
        binder.shutdown()
        binder.server_close()
    csi.stop(grace=10).wait()
    _remove_if_ours(config.endpoint, endpoint_id)
    log.info("stopped", extra={"fields": {"failure": failure[0] if failure else None}})
    return 1 if failure else 0
