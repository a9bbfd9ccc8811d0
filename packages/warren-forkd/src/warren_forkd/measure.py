"""What forkd is measured by: cold boot, snapshot, branch N, memory, with their ratios.

Measured in-process (no daemon in the way), so the figures are forkd's mechanics alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from warren_forkd import snapshot, template
from warren_forkd.qemu import QEMU, accel

# The acceptance lines: a branched child against a cold boot, its memory against the parent's.
BRANCH_OVER_BOOT_MAX = 0.3
CHILD_OVER_PARENT_PSS_MAX = 0.3


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


async def measure(workdir: Path, counts: list[int], mem_mib: int) -> dict[str, Any]:
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


def qemu_version() -> str:
    done = subprocess.run([QEMU, "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0] if done.stdout else "unknown"


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def with_ratios(report: dict[str, Any], mem_mib: int, load_before: list[float]) -> dict[str, Any]:
    """Add the acceptance ratios (from this same run) and the machine the figures come from."""
    out = dict(report)
    ratios: dict[str, float] = {}
    acceptance: dict[str, bool] = {}
    if "1" in report["branch_ms"]:
        ratios["branch_1_over_cold_boot"] = round(report["branch_ms"]["1"] / report["cold_boot_ms"], 3)
        acceptance[f"branch_ms[1] <= {BRANCH_OVER_BOOT_MAX} x cold_boot_ms"] = (
            ratios["branch_1_over_cold_boot"] <= BRANCH_OVER_BOOT_MAX
        )
    if "8" in report["child_pss_mib"]:
        ratios["child_pss_8_over_parent_pss"] = round(
            report["child_pss_mib"]["8"] / report["parent_pss_mib"], 3
        )
        acceptance[f"child_pss_mib[8] <= {CHILD_OVER_PARENT_PSS_MAX} x parent_pss_mib"] = (
            ratios["child_pss_8_over_parent_pss"] <= CHILD_OVER_PARENT_PSS_MAX
        )
    out["ratios"] = ratios
    out["acceptance"] = acceptance
    out["machine"] = {
        "accelerator": accel(),
        "cpus": os.cpu_count(),
        "guest_mem_mib": mem_mib,
        "guest_vcpus": 1,
        "qemu": qemu_version(),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }
    return out
