"""`warren-forkd`: run the daemon (`serve`), or measure boot, snapshot and branch (`bench`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType

from warren_forkd.kernel import cache_root

log = logging.getLogger("warren_forkd.cli")


def bench(args: argparse.Namespace) -> int:
    from warren_forkd import measure

    counts = [int(c) for c in args.counts.split(",")]
    cache_root().mkdir(parents=True, exist_ok=True)
    load_before = measure.load_average()
    workdir = Path(tempfile.mkdtemp(prefix="forkd-bench-"))
    try:
        report = asyncio.run(measure.measure(workdir, counts, args.mem_mib))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(measure.with_ratios(report, args.mem_mib, load_before), indent=2) + "\n"
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    print(text, end="")
    return 0


def serve(args: argparse.Namespace) -> int:
    from warren_common import logs

    logs.configure(args.log_level, quiet=("qemu",))  # the QMP library logs every message
    from warren_forkd.api import Server
    from warren_forkd.daemon import Daemon

    cache_root().mkdir(parents=True, exist_ok=True)
    daemon = Daemon(Path(args.state_dir).resolve())
    daemon.start()
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    socket_path = Path(args.socket)
    server = Server(socket_path, daemon)
    threading.Thread(target=server.serve_forever, name="api", daemon=True).start()
    log.info("serving", extra={"fields": {"socket": args.socket, "state_dir": args.state_dir}})
    stop.wait()
    log.info("stopping: killing this daemon's VMs")
    server.shutdown()
    daemon.shutdown()
    socket_path.unlink(missing_ok=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="warren-forkd")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the daemon: HTTP API on a unix socket")
    s.add_argument("--socket", required=True, help="path of the API's unix socket")
    s.add_argument("--state-dir", required=True, help="templates, snapshots and VM directories")
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=serve)
    b = sub.add_parser(
        "bench", aliases=["spike"], help="boot, snapshot and branch with real QEMU; print JSON"
    )
    b.add_argument("--counts", default="1,8", help="comma-separated numbers of children")
    b.add_argument("--mem-mib", type=int, default=256)
    b.add_argument("--out", type=Path, help="also write the JSON here")
    b.set_defaults(func=bench)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result
