"""Workspace benchmark: a fork through the API until the child runs, for a sandbox whose
workspace is 1 GiB and one whose workspace is 8 GiB (each a quarter full of random bytes), and
a create with an empty workspace, measured in one run against the deployed platform (real
gVisor pods, the blockd CSI driver, SeaweedFS). Writes bench/results/workspace.json.

    python bench/workspace.py --url URL --api-key KEY --image I [--samples 5]

Run it through `make bench-workspace`, which deploys a throw-away platform and takes it down.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from warren_control.sdk import Client

RESULTS = Path(__file__).parent / "results" / "workspace.json"
SLEEP = ["sleep", "86400"]
SMALL = {"cpu_millis": 100, "memory_mib": 128}


def running_ms(client: Client, sandbox_id: str, start: float) -> float:
    """Poll (every 20 ms) until the sandbox reads Running; milliseconds since `start`."""
    while True:
        seen = client.get(sandbox_id)
        if seen.phase == "Running":
            return (time.monotonic() - start) * 1000
        if seen.phase == "Failed" or time.monotonic() - start > 300:
            raise RuntimeError(f"{sandbox_id} did not come up: {seen.phase} {seen.reason}")
        time.sleep(0.02)


def gone(client: Client, sandbox_id: str) -> None:
    client.delete(sandbox_id)
    client.wait_until(sandbox_id, "Deleted", timeout=300)


def create_ms(client: Client, image: str) -> float:
    start = time.monotonic()
    box = client.create(image, command=SLEEP, workspace_size_gib=1, **SMALL)
    elapsed = running_ms(client, box.id, start)
    gone(client, box.id)
    return elapsed


def filled_parent(client: Client, image: str, size_gib: int) -> str:
    """A running sandbox whose workspace of `size_gib` holds a quarter of that in random bytes."""
    start = time.monotonic()
    box = client.create(image, command=SLEEP, workspace_size_gib=size_gib, **SMALL)
    running_ms(client, box.id, start)
    mib = size_gib * 1024 // 4
    script = f"head -c {mib * 1024 * 1024} /dev/urandom > /workspace/fill && sync && du -sm /workspace"
    result = client.run(box.id, ["sh", "-c", script], timeout=3600)
    if result.exit_code != 0:
        raise RuntimeError(f"filling the workspace failed: {result.stderr!r}")
    print(f"filled {size_gib} GiB workspace: {result.stdout.decode().split()[0]} MiB used", file=sys.stderr)
    return box.id


def fork_ms(client: Client, parent: str) -> float:
    start = time.monotonic()
    (result,) = client.fork(parent, 1)
    if result.sandbox is None:
        raise RuntimeError(f"the fork was refused: {result}")
    elapsed = running_ms(client, result.sandbox.id, start)
    gone(client, result.sandbox.id)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True)
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--image", required=True, help="an image the node has")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    client = Client(args.url, args.api_key)
    parents: list[str] = []
    try:
        create_ms(client, args.image)  # warm-up, unmeasured
        creates = [create_ms(client, args.image) for _ in range(args.samples)]
        parents = [filled_parent(client, args.image, size) for size in (1, 8)]
        forks: dict[int, list[float]] = {1: [], 8: []}
        for index in range(args.samples):  # the two sizes alternate: the same machine for both
            print(f"sample {index + 1}/{args.samples}", file=sys.stderr, flush=True)
            for size, parent in zip((1, 8), parents, strict=True):
                forks[size].append(fork_ms(client, parent))
    finally:
        for parent in parents:
            gone(client, parent)
        client.close()

    result: dict[str, Any] = {
        "samples": args.samples,
        "create_to_running_ms_p50": round(statistics.median(creates), 1),
        "fork_to_running_ms_p50_1g": round(statistics.median(forks[1]), 1),
        "fork_to_running_ms_p50_8g": round(statistics.median(forks[8]), 1),
        "workspace_fill": "a quarter of each workspace in random bytes",
    }
    result["fork_8g_over_1g"] = round(
        result["fork_to_running_ms_p50_8g"] / result["fork_to_running_ms_p50_1g"], 3
    )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
