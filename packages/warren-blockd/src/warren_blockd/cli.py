"""`warren-blockd`: run the daemon (`serve`) or its CSI node plugin (`csi`), talk to the daemon,
read or clean the store itself (`replicated`, `release`, `gc`), or compare image chunkings
(`dedup`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
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
    from warren_blockd import logs

    logs.configure(args.log_level)
    import mfusepy

    from warren_blockd.api import Server
    from warren_blockd.daemon import Daemon, Settings

    settings = Settings(
        backlog_bound=args.backlog_bound,
        batch_bytes=args.batch_bytes,
        flush_interval=args.flush_interval,
        consolidate_records=args.consolidate_records,
    )
    daemon = Daemon(open_store(args.store, args.s3_endpoint), Path(args.state_dir), settings)
    daemon.clean_stale()
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    # Ours before libfuse starts: it installs its own only where the handler is the default.
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)

    def run_fuse() -> None:
        mfusepy.FUSE(
            daemon.fs, str(daemon.fuse_dir), foreground=True, nothreads=False, fsname="warren-blockd"
        )
        stop.set()

    fuse = threading.Thread(target=run_fuse, name="fuse", daemon=True)
    fuse.start()
    if not daemon.ready.wait(30):
        log.error("the FUSE mount did not come up; is /dev/fuse there and fuse3 installed?")
        return 1
    server = Server(Path(args.socket), daemon)
    threading.Thread(target=server.serve_forever, name="api", daemon=True).start()
    threading.Thread(target=daemon.background, name="background", daemon=True).start()
    if args.metrics_port:
        from prometheus_client import start_http_server

        from warren_blockd.metrics import REGISTRY

        start_http_server(args.metrics_port, addr=args.metrics_addr, registry=REGISTRY)
    log.info(
        "serving",
        extra={"fields": {"socket": args.socket, "state_dir": args.state_dir, "version": __version__}},
    )
    stop.wait()
    log.info("stopping: unmounting workspaces")
    server.shutdown()
    daemon.shutdown()
    # Loop devices let go of the FUSE files a moment after their detach: retry, and detach
    # lazily at last, so no mount outlives the daemon (a dead one answers ENOTCONN).
    for _ in range(20):
        if subprocess.run(["fusermount3", "-u", str(daemon.fuse_dir)], check=False).returncode == 0:
            break
        time.sleep(0.25)
    else:
        subprocess.run(["fusermount3", "-u", "-z", str(daemon.fuse_dir)], check=False)
    fuse.join(10)
    return 0


def csi(args: argparse.Namespace) -> int:
    from warren_blockd import logs

    logs.configure(args.log_level)
    from warren_blockd.csi.server import PluginConfig, endpoint_path, run

    try:
        endpoint = endpoint_path(args.endpoint)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return run(
        PluginConfig(
            endpoint=endpoint,
            registration_dir=Path(args.registration_dir).resolve(),
            node_id=args.node_id,
            blockd_socket=args.blockd_socket or args.socket,
            plugin_dir=Path(args.kubelet_plugin_dir).resolve(),  # the daemon mounts there: absolute
            replicate_wait=args.replicate_wait,
        )
    )


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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="warren-blockd", description=__doc__)
    top.add_argument("--version", action="version", version=__version__)
    top.add_argument("--socket", default=os.environ.get("WARREN_BLOCKD_SOCKET", DEFAULT_SOCKET))
    sub = top.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the daemon (as root: FUSE, loop devices, mounts)")
    s.add_argument(
        "--store",
        default=os.environ.get("WARREN_BLOCKD_STORE"),
        required="WARREN_BLOCKD_STORE" not in os.environ,
        help="s3://BUCKET[/PREFIX] or file:///DIRECTORY",
    )
    s.add_argument("--s3-endpoint", default=os.environ.get("WARREN_BLOCKD_S3_ENDPOINT"))
    s.add_argument("--state-dir", default=os.environ.get("WARREN_BLOCKD_STATE", "/var/lib/warren-blockd"))
    s.add_argument(
        "--backlog-bound", type=size, default=size("256M"), help="un-replicated bytes before writers wait"
    )
    s.add_argument(
        "--batch-bytes", type=size, default=size("32M"), help="written bytes held before a batch is sealed"
    )
    s.add_argument("--flush-interval", type=float, default=1.0, help="seconds between batch seals")
    s.add_argument("--consolidate-records", type=int, default=64, help="log records between consolidations")
    s.add_argument("--metrics-port", type=int, default=0, help="also serve /metrics on this TCP port")
    s.add_argument("--metrics-addr", default="127.0.0.1")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    s.set_defaults(func=serve)

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
    k.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    k.set_defaults(func=csi)

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
