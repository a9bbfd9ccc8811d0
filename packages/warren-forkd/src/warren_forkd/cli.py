"""`warren-forkd spike`: build a template, boot, snapshot, branch N children and report timings."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from warren_forkd import snapshot, template
from warren_forkd.kernel import cache_root


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


async def spike(workdir: Path, counts: list[int], mem_mib: int) -> dict[str, Any]:
    tpl = template.build(workdir / "template", mem_mib=mem_mib)
    parent = await snapshot.boot(tpl, workdir / "parent")
    report: dict[str, Any] = {"cold_boot_ms": parent.ready_ms}
    try:
        start = time.monotonic()
        snap = await snapshot.snapshot(parent, workdir / "snapshot")
        report["snapshot_ms"] = round((time.monotonic() - start) * 1000, 1)
        # Measured before any child maps the file: afterwards the shared pages are split.
        report["parent_pss_mib"] = _mib(parent.vm.pss_kib())
        report |= {"branch_ms": {}, "branch_total_ms": {}, "child_pss_mib": {}}
        for n in counts:
            start = time.monotonic()
            children = await snapshot.branch(snap, workdir / f"branch-{n}", n)
            total = round((time.monotonic() - start) * 1000, 1)
            try:
                for child in children:
                    await child.agent.run("head -c 16 /dev/urandom >/dev/null")
                report["branch_ms"][str(n)] = round(statistics.median(c.ready_ms for c in children), 1)
                report["branch_total_ms"][str(n)] = total
                report["child_pss_mib"][str(n)] = _mib(
                    round(statistics.mean(c.vm.pss_kib() for c in children))
                )
            finally:
                await asyncio.gather(*(c.stop() for c in children))
            print(json.dumps({"n": n, "so_far": report}), flush=True)
    finally:
        await parent.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(prog="warren-forkd")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("spike", help="boot, snapshot and branch with real QEMU; print JSON")
    run.add_argument("--counts", default="1,8", help="comma-separated numbers of children")
    run.add_argument("--mem-mib", type=int, default=256)
    run.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    cache_root().mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="forkd-spike-"))
    try:
        report = asyncio.run(spike(workdir, counts, args.mem_mib))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = json.dumps(report, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text, end="")
