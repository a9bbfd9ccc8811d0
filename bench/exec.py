"""Exec round trip: a command through the sandbox's agent against the same command through
Kubernetes exec, in one sandbox, in one run. Writes bench/results/exec.json.

    python bench/exec.py --url URL --api-key-file F [--samples 50]

Against a deployed platform (`make deploy`; `make bench-exec` finds it): one sandbox of the
template `base` made with the E2B SDK, then `true` run `--samples` times each way, the two
ways alternating so both see the same machine:

- agent: the E2B SDK's commands.run, through the edge's sandbox routing to the agent in the
  pod (Connect over HTTP, the process's start, output and end streamed back);
- kubernetes_exec: Warren's SDK run, through the edge and the API to the Kubernetes exec
  websocket (kube-apiserver, kubelet, the runtime's exec into the gVisor sandbox).

`exec_rtt_ms_p50` holds both; `agent_over_kubernetes_exec` is their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from e2b import Sandbox
from warren_control.sdk import Client

RESULTS = Path(__file__).parent / "results" / "exec.json"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure(url: str, key: str, samples: int) -> dict[str, Any]:
    sandbox = Sandbox.create("base", timeout=600, api_key=key, api_url=url, sandbox_url=url)
    warren = Client(url, key)
    warren_id = "sbx_" + sandbox.sandbox_id
    try:
        # One of each first: connections open, caches warm, both ways proven to work.
        assert sandbox.commands.run("true").exit_code == 0
        assert warren.run(warren_id, ["true"]).exit_code == 0
        agent: list[float] = []
        kube: list[float] = []
        for _ in range(samples):
            started = time.perf_counter()
            sandbox.commands.run("true")
            agent.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            done = warren.run(warren_id, ["true"])
            kube.append((time.perf_counter() - started) * 1000)
            assert done.exit_code == 0
    finally:
        sandbox.kill()
        warren.close()
    p50 = {"agent": statistics.median(agent), "kubernetes_exec": statistics.median(kube)}
    return {
        "samples": samples,
        "exec_rtt_ms_p50": {k: round(v, 2) for k, v in p50.items()},
        "exec_rtt_ms_p95": {
            "agent": round(percentile(agent, 0.95), 2),
            "kubernetes_exec": round(percentile(kube, 0.95), 2),
        },
        "agent_over_kubernetes_exec": round(p50["agent"] / p50["kubernetes_exec"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="the edge's URL")
    parser.add_argument("--api-key-file", required=True, help="a file holding an API key (wk_ or e2b_)")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    key = Path(args.api_key_file).read_text().strip()
    result = measure(args.url, key, args.samples)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
