"""`warren-blockd`: run the daemon (`serve`) or its CSI node plugin (`csi`), talk to the daemon,
read or clean the store itself (`replicated`, `release`, `gc`), or compare image chunkings
(`dedup`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

from warren_blockd import __version__, stores
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.client import DEFAULT_SOCKET, ApiError, Client
from warren_blockd.gc import DEFAULT_GRACE

log = logging.getLogger("warren_blockd")
NOT_IN_STORE = 3  # `replicated`: the workspace has nothing in the store
UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# A capture proves the workspace in storage before it stores the image.
CAPTURE_REPLICATE_WAIT_S = 60.0
QUIET_LOGGERS = ("botocore", "boto3", "urllib3")  # the S3 client logs every request


def size(text: str) -> int:
    """'8G', '512M' or plain bytes."""
    unit = UNITS.get(text[-1:].lower())
    try:
        return int(text[:-1]) * unit if unit else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size: write bytes or a number with K, M, G or T"
        ) from None


def open_store(url: str, endpoint: str | None) -> PolicyStore:
    try:
        return stores.open_store(url, endpoint)
    except ValueError as exc:
        raise SystemExit(f"--{exc}") from None


def serve(args: argparse.Namespace) -> int:
    from warren_common import logs

    logs.configure(args.log_level, quiet=QUIET_LOGGERS)
    from warren_blockd import handoff
    from warren_blockd.api import Server
    from warren_blockd.daemon import Daemon, HandoffError, Settings

    settings = Settings(
        backlog_bound=args.backlog_bound,
        batch_bytes=args.batch_bytes,
        flush_interval=args.flush_interval,
        consolidate_records=args.consolidate_records,
        node=args.node_id or socket.gethostname(),
        hold=args.hold_seconds,
    )
    daemon = Daemon(open_store(args.store, args.s3_endpoint), Path(args.state_dir), settings)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    handoff_path = Path(args.handoff_socket or Path(args.socket).with_name("handoff.sock"))
    ready_file = Path(args.ready_file) if args.ready_file else None
    if ready_file:
        ready_file.unlink(missing_ok=True)
    # A daemon already serving this node hands everything over; a signal meanwhile kills
    # this process (the default handlers), which leaves the old one serving.
    try:
        took_over = handoff.take_over(daemon, handoff_path, args.handoff_timeout)
    except HandoffError as exc:
        log.error("handoff failed: the old daemon serves on; exiting", extra={"fields": {"error": str(exc)}})
        return 1
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    if not took_over and not _plain_start(daemon, args.socket, stop):
        return 1
    threading.Thread(target=_stop_when_fuse_ends, args=(daemon, stop), name="fuse-watch", daemon=True).start()
    server = Server(Path(args.socket), daemon, _images(args, daemon))
    threading.Thread(target=server.serve_forever, name="api", daemon=True).start()
    threading.Thread(target=daemon.background, name="background", daemon=True).start()
    handed_over = threading.Event()

    def on_handed_over() -> None:
        if ready_file:
            ready_file.unlink(missing_ok=True)
        handed_over.set()
        if args.after_handoff == "exit":
            stop.set()

    listener = handoff.Listener(handoff_path, daemon, on_handed_over, args.handoff_timeout)
    threading.Thread(target=listener.serve_forever, name="handoff", daemon=True).start()
    if args.metrics_port:
        _serve_metrics(args.metrics_port, args.metrics_addr)
    if ready_file:
        ready_file.write_text(daemon.instance)
    log.info(
        "serving",
        extra={
            "fields": {
                "socket": args.socket,
                "state_dir": args.state_dir,
                "version": __version__,
                "took_over": took_over,
            }
        },
    )
    stop.wait()
    with listener.lock:  # a handoff under way finishes first, one way or the other
        listener.close()
    if handed_over.is_set():
        # Everything is the new daemon's: no unmount, no detach, no flush from here.
        server.shutdown()
        log.info("exiting after the handoff")
        return 0
    log.info("stopping: unmounting workspaces")
    server.shutdown()
    daemon.shutdown()
    daemon.stop_fuse()
    return 0


def _stop_when_fuse_ends(daemon: Any, stop: threading.Event) -> None:
    """Unmounted or aborted under us (a handoff stops the reader, it does not end the
    connection): nothing can be served any more."""
    session = daemon.session
    if session is not None and session.ended.wait() and not daemon.gate.handed_over:
        log.error("the FUSE connection ended; stopping")
        stop.set()


def _serve_metrics(port: int, addr: str) -> None:
    from prometheus_client import start_http_server

    from warren_blockd.metrics import REGISTRY

    start_http_server(port, addr=addr, registry=REGISTRY)


def _answers(socket_path: str) -> bool:
    try:
        Client(socket_path, timeout=5).request("GET", "/healthz")
    except (OSError, ApiError, ValueError):
        return False
    return True


def _plain_start(daemon: Any, socket_path: str, stop: threading.Event) -> bool:
    """No daemon to take over from: clean what a dead one left, mount FUSE afresh. A live
    daemon that cannot hand over (a version before the handoff) is waited for first:
    cleaning up under it would take its workspaces away while it still serves them."""
    if _answers(socket_path):
        log.warning("a daemon without the handoff serves this node; waiting for it to exit")
        while _answers(socket_path):
            if stop.wait(2):
                return False
    daemon.clean_stale()
    try:
        daemon.start_fuse()
    except OSError as exc:
        log.error("mounting FUSE failed; is /dev/fuse there?", extra={"fields": {"error": str(exc)}})
        return False
    if not daemon.ready.wait(30):
        log.error("the kernel did not initialise the FUSE mount within 30 s")
        return False
    return True


def probe(args: argparse.Namespace) -> int:
    """Readiness of one daemon process: it wrote its instance id to --ready-file, and the
    API socket (shared by an old and a new daemon during a handoff) is answered by it."""
    try:
        instance = Path(args.ready_file).read_text().strip()
        health = Client(args.socket, timeout=5).request("GET", "/healthz")
    except (OSError, ApiError) as exc:
        print(f"warren-blockd: not ready: {exc}", file=sys.stderr)
        return 1
    if not health.get("ok") or health.get("instance") != instance:
        print("warren-blockd: not ready: another daemon answers on the socket", file=sys.stderr)
        return 1
    return 0


def csi(args: argparse.Namespace) -> int:
    from warren_common import logs

    logs.configure(args.log_level, quiet=QUIET_LOGGERS)
    from warren_blockd.csi.server import PluginConfig, endpoint_path, run

    try:
        endpoint = endpoint_path(args.endpoint)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    bind_address, bind_token = _bind_api(args.bind_listen, args.bind_token_file)
    return run(
        PluginConfig(
            endpoint=endpoint,
            registration_dir=Path(args.registration_dir).resolve(),
            node_id=args.node_id,
            blockd_socket=args.blockd_socket or args.socket,
            plugin_dir=Path(args.kubelet_plugin_dir).resolve(),  # the daemon mounts there: absolute
            replicate_wait=args.replicate_wait,
            bind_address=bind_address,
            bind_token_file=bind_token,
            runtime_state=Path(args.runtime_state) if args.runtime_state else None,
        )
    )


def _bind_api(listen: str | None, token_file: str | None) -> tuple[tuple[str, int] | None, Path | None]:
    """--bind-listen HOST:PORT and --bind-token-file, checked: both or neither."""
    if not listen and not token_file:
        return None, None
    if not (listen and token_file):
        raise SystemExit("--bind-listen and --bind-token-file go together: give both, or neither")
    host, _, port = listen.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:  # noqa: PLR2004
        raise SystemExit(f"--bind-listen {listen!r} is not HOST:PORT (e.g. 0.0.0.0:9810)")
    token = Path(token_file)
    try:
        if not token.read_bytes().strip():
            raise SystemExit(f"--bind-token-file {token} is empty: the bind API needs a token")
    except OSError as exc:
        raise SystemExit(f"--bind-token-file {token} cannot be read: {exc.strerror}") from None
    return (host or "0.0.0.0", int(port)), token  # noqa: S104 (every address of the pod)


def dedup(args: argparse.Namespace) -> int:
    from warren_blockd.dedup import report

    result = (
        report(Path(args.a), Path(args.b), args.chunk_size)
        if args.chunk_size
        else report(Path(args.a), Path(args.b))
    )
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    return 0


def call(args: argparse.Namespace) -> int:
    try:
        return _call(args)
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        print(
            f"warren-blockd: cannot reach the daemon at {args.socket} ({exc}); "
            "is `warren-blockd serve` running?",
            file=sys.stderr,
        )
        return 1


def _call(args: argparse.Namespace) -> int:
    client = Client(args.socket)
    result: Any
    if args.command == "create":
        result = client.create(
            args.workspace,
            args.size,
            template=args.template,
            image=str(Path(args.image).resolve()) if args.image else None,
        )
    elif args.command == "fork":
        result = client.action(args.workspace, "fork", children=args.children)
    elif args.command in ("mount", "restore"):
        result = client.action(args.workspace, args.command, target=str(Path(args.target).resolve()))
    elif args.command in ("unmount", "flush"):
        result = client.action(args.workspace, args.command, wait_replicated=args.wait_replicated)
    elif args.command == "stats":
        result = client.stats()
    else:
        sys.stdout.write(client.metrics())
        return 0
    print(json.dumps(result, indent=2))
    return 0


def _bad_id(workspace_id: str) -> bool:
    from warren_blockd.ids import WORKSPACE_ID_RULE, valid_workspace_id

    if valid_workspace_id(workspace_id):
        return False
    print(f"warren-blockd: {workspace_id!r} is not a workspace id: {WORKSPACE_ID_RULE}", file=sys.stderr)
    return True


def replicated(args: argparse.Namespace) -> int:
    """Read from the store itself, not a daemon: what survives the loss of any node."""
    from warren_blockd.errors import BlobError, NotFoundError
    from warren_blockd.workspace import Workspace, WorkspaceReleasedError

    if _bad_id(args.workspace):
        return 2
    try:
        seq = Workspace(open_store(args.store, args.s3_endpoint), args.workspace).replicated_seq()
    except NotFoundError:
        print(json.dumps({"workspace": args.workspace, "error": "not_found"}))
        return NOT_IN_STORE
    except WorkspaceReleasedError:
        print(json.dumps({"workspace": args.workspace, "error": "released"}))
        return NOT_IN_STORE
    except BlobError as exc:
        print(f"warren-blockd: reading the store {args.store}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"workspace": args.workspace, "replicated_seq": seq}))
    return 0


def release(args: argparse.Namespace) -> int:
    """Remove a deleted sandbox's workspace from the store (chunks are left to `gc`)."""
    from warren_blockd.errors import BlobError
    from warren_blockd.workspace import Workspace

    if _bad_id(args.workspace):
        return 2
    try:
        result = Workspace(open_store(args.store, args.s3_endpoint), args.workspace).release()
    except BlobError as exc:
        print(f"warren-blockd: releasing in the store {args.store}: {exc}", file=sys.stderr)
        return 1
    doc: dict[str, Any] = asdict(result)
    if result.found:
        doc["complete"] = not result.kept_for_forks  # else a later release or gc finishes it
    else:
        doc["note"] = "nothing is stored under this id: nothing to release"
    print(json.dumps(doc))
    return 0


def copy(args: argparse.Namespace) -> int:
    """A point-in-time copy of a workspace under a new id, at the store: a fork whose source
    nothing writes (its sandbox is stopped), so its newest stored state is all there is."""
    from warren_blockd.errors import BlobError, NotFoundError
    from warren_blockd.workspace import Workspace, WorkspaceReleasedError

    if _bad_id(args.workspace) or _bad_id(args.copy):
        return 2
    try:
        failed = Workspace(open_store(args.store, args.s3_endpoint), args.workspace).fork([args.copy])
    except (NotFoundError, WorkspaceReleasedError):
        print(json.dumps({"workspace": args.workspace, "error": "not_found"}))
        return NOT_IN_STORE
    except BlobError as exc:
        print(f"warren-blockd: copying in the store {args.store}: {exc}", file=sys.stderr)
        return 1
    if failed[args.copy] is not None:
        print(f"warren-blockd: copying {args.workspace} to {args.copy}: {failed[args.copy]}", file=sys.stderr)
        return 1
    print(json.dumps({"workspace": args.workspace, "copy": args.copy}))
    return 0


def collect(args: argparse.Namespace) -> int:
    """Delete the chunks no workspace references any more (`gc`)."""
    from warren_blockd.errors import BlobError
    from warren_blockd.gc import GcError, gc

    if args.grace < 0:
        print("warren-blockd: --grace is a number of hours, 0 or more", file=sys.stderr)
        return 2
    grace = timedelta(hours=args.grace)
    if grace < DEFAULT_GRACE:
        print(
            f"warren-blockd: a grace below {DEFAULT_GRACE / timedelta(hours=1):g} hours is safe only "
            "while no writer is at work (writers reuse stored chunks younger than half of that)",
            file=sys.stderr,
        )
    try:
        report = gc(open_store(args.store, args.s3_endpoint), grace, dry_run=args.dry_run)
    except (BlobError, GcError) as exc:
        print(f"warren-blockd: collecting in the store {args.store}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(asdict(report)))
    return 0


def _store_command(sub: Any, name: str, summary: str) -> argparse.ArgumentParser:
    """A subcommand that works on the store itself, not through a daemon."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=summary)
    p.add_argument(
        "--store",
        default=os.environ.get("WARREN_BLOCKD_STORE"),
        required="WARREN_BLOCKD_STORE" not in os.environ,
        help="s3://BUCKET[/PREFIX] or file:///DIRECTORY",
    )
    p.add_argument("--s3-endpoint", default=os.environ.get("WARREN_BLOCKD_S3_ENDPOINT"))
    return p


def _store_commands(sub: Any) -> None:
    r = _store_command(
        sub,
        "replicated",
        "the newest write record of a workspace proven in the store, read from the store (JSON)",
    )
    r.add_argument("workspace")
    r.set_defaults(func=replicated)
    r = _store_command(sub, "release", "remove a deleted sandbox's workspace from the store (JSON)")
    r.add_argument("workspace")
    r.set_defaults(func=release)
    c = _store_command(sub, "copy", "a workspace's newest stored state under a new id, no data copied (JSON)")
    c.add_argument("workspace", help="the source: nothing may be writing it (its sandbox stopped)")
    c.add_argument("copy", help="the new workspace's id")
    c.set_defaults(func=copy)
    g = _store_command(sub, "gc", "delete chunks no workspace references any more (JSON report)")
    g.add_argument(
        "--grace",
        type=float,
        default=DEFAULT_GRACE / timedelta(hours=1),
        metavar="HOURS",
        help="only chunks stored longer ago than this go (default %(default)s)",
    )
    g.add_argument("--dry-run", action="store_true", help="report what would go, delete nothing")
    g.set_defaults(func=collect)


def _serve_options(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--node-id",
        help="this node's name, as the cluster knows it: the holder of what it attaches (default: the host "
        "name)",
    )
    s.add_argument(
        "--hold-seconds",
        type=float,
        default=30.0,
        help="how long this node's hold on an attached workspace lasts unrenewed: another node takes it over "
        "only after that",
    )
    s.add_argument("--metrics-port", type=int, default=0, help="also serve /metrics on this TCP port")
    s.add_argument("--metrics-addr", default="127.0.0.1")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=serve)
    s.add_argument(
        "--handoff-socket",
        default=os.environ.get("WARREN_BLOCKD_HANDOFF_SOCKET"),
        help="where a running daemon hands over to a new one (default: handoff.sock beside --socket)",
    )
    s.add_argument(
        "--handoff-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long each handoff step may take before the old daemon serves on",
    )
    s.add_argument(
        "--after-handoff",
        choices=["exit", "wait"],
        default="exit",
        help="once handed over: exit, or wait for a signal (in a pod, whose container would restart)",
    )
    s.add_argument(
        "--ready-file",
        help="written while this process serves (its instance id), removed once it has handed over",
    )
    s.add_argument("--runsc", help="the node's runsc, to capture gVisor sandboxes' memory with")
    s.add_argument("--runsc-root", help="the state directory of the node's gVisor shim (its k8s.io root)")
    s.add_argument(
        "--host-state-dir",
        help="where the host sees --state-dir (the daemon runs in a pod): staged images are named by it",
    )


def _images(args: argparse.Namespace, daemon: Any) -> Any:
    """Memory images (memory.py), captured with the node's runsc when it is named."""
    from warren_blockd.memory import Images, Runsc

    runsc = Runsc(args.runsc, args.runsc_root) if args.runsc and args.runsc_root else None
    state = Path(args.state_dir)
    return Images(
        daemon.store,
        state,
        Path(args.host_state_dir or state),
        runsc,
        flush=lambda workspace: daemon.flush(workspace, wait_replicated=CAPTURE_REPLICATE_WAIT_S),
        attached=lambda workspace: workspace in daemon.attached,
    )


def _probe_command(sub: Any) -> None:
    r = sub.add_parser("probe", help="exit 0 if the daemon of --ready-file is the one answering on --socket")
    r.add_argument("--ready-file", required=True)
    r.set_defaults(func=probe)


def _csi_parser(sub: Any) -> None:
    k = sub.add_parser("csi", help="the CSI node plugin (driver blockd.warren.dev) for kubelet")
    k.add_argument("--endpoint", required=True, help="the CSI socket, unix:///PATH (kubelet calls it)")
    k.add_argument(
        "--registration-dir",
        default="/var/lib/kubelet/plugins_registry",
        help="kubelet's plugin registration directory (its plugins_registry)",
    )
    k.add_argument("--node-id", required=True, help="this node's name, as kubelet knows it")
    k.add_argument("--blockd-socket", help="the daemon's API socket (default: --socket)")
    k.add_argument(
        "--kubelet-plugin-dir",
        default="/var/lib/kubelet/plugins/blockd.warren.dev",
        help="the plugin's own directory: staging mounts and what is published where",
    )
    k.add_argument(
        "--replicate-wait",
        type=float,
        default=45.0,
        metavar="SECONDS",
        help="how long an unpublish waits for a replicated receipt before going on with a local one",
    )
    k.add_argument(
        "--bind-listen",
        metavar="HOST:PORT",
        help="serve the bind API here (a claimed pod's bindAtClaim workspace; csi/bindapi.py)",
    )
    k.add_argument("--bind-token-file", help="the bind API's bearer token (from a Secret)")
    k.add_argument(
        "--runtime-state",
        metavar="DIR",
        help="containerd's state directory, as the plugin sees it: a bind that names a container "
        "mounts the workspace at /workspace of that running container's root file system",
    )
    k.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    k.set_defaults(func=csi)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="warren-blockd", description=__doc__)
    top.add_argument("--version", action="version", version=__version__)
    top.add_argument("--socket", default=os.environ.get("WARREN_BLOCKD_SOCKET", DEFAULT_SOCKET))
    sub = top.add_subparsers(dest="command", required=True)

    s = _store_command(sub, "serve", "run the daemon (as root: FUSE, loop devices, mounts)")
    s.add_argument("--state-dir", default=os.environ.get("WARREN_BLOCKD_STATE", "/var/lib/warren-blockd"))
    s.add_argument(
        "--backlog-bound", type=size, default=size("256M"), help="un-replicated bytes before writers wait"
    )
    s.add_argument(
        "--batch-bytes", type=size, default=size("32M"), help="written bytes held before a batch is sealed"
    )
    s.add_argument("--flush-interval", type=float, default=1.0, help="seconds between batch seals")
    s.add_argument("--consolidate-records", type=int, default=64, help="log records between consolidations")
    _serve_options(s)

    _csi_parser(sub)

    d = sub.add_parser("dedup", help="share of B's bytes already stored for A, file-aligned vs fixed chunks")
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--chunk-size", type=size, default=0)
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=dedup)

    c = sub.add_parser("create", help="a new workspace: empty ext4, from an ext4 image, or from a template")
    c.add_argument("workspace")
    how = c.add_mutually_exclusive_group(required=True)
    how.add_argument("--size", type=size)
    how.add_argument("--image")
    how.add_argument("--template")
    f = sub.add_parser("fork", help="publish the workspace's manifest under each child id (no data copied)")
    f.add_argument("workspace")
    f.add_argument("children", nargs="+")
    for name in ("mount", "restore"):
        m = sub.add_parser(name, help=f"{name} a workspace at TARGET (nosuid,nodev)")
        m.add_argument("workspace")
        m.add_argument("target")
    for name in ("unmount", "flush"):
        u = sub.add_parser(name, help=f"{name} a workspace; prints a receipt (local or replicated)")
        u.add_argument("workspace")
        u.add_argument("--wait-replicated", type=float, default=None, metavar="SECONDS")
    sub.add_parser("stats", help="per-workspace state as JSON")
    _store_commands(sub)
    _probe_command(sub)
    sub.add_parser("metrics", help="Prometheus exposition")
    for name in ("create", "fork", "mount", "restore", "unmount", "flush", "stats", "metrics"):
        sub.choices[name].set_defaults(func=call)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except ApiError as exc:
        print(f"warren-blockd: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
