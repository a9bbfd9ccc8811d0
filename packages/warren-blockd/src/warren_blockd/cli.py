"""`warren-blockd`: run the daemon (`serve`) or its CSI node plugin (`csi`), talk to the daemon, or
compare image chunkings (`dedup`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlparse

from warren_blockd import __version__
from warren_blockd.blobs import BlobDriver
from warren_blockd.blobs.local import LocalDriver
from warren_blockd.blobs.policy import PolicyStore
from warren_blockd.client import DEFAULT_SOCKET, ApiError, Client

log = logging.getLogger("warren_blockd")
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
    """s3://bucket[/prefix] (credentials from the usual AWS environment variables) or file:///dir."""
    parsed = urlparse(url)
    driver: BlobDriver
    if parsed.scheme == "s3" and parsed.netloc:
        from warren_blockd.blobs.s3 import S3Driver

        prefix = parsed.path.strip("/")
        driver = S3Driver(parsed.netloc, endpoint=endpoint, prefix=f"{prefix}/" if prefix else "")
    elif parsed.scheme == "file" and parsed.path:
        driver = LocalDriver(Path(parsed.path))
    else:
        raise SystemExit(f"--store {url!r} is not a store: use s3://BUCKET[/PREFIX] or file:///DIRECTORY")
    return PolicyStore(driver)


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
    subprocess.run(["fusermount3", "-u", str(daemon.fuse_dir)], check=False)
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
