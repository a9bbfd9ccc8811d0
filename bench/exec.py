"""Exec round trip: a command through the sandbox's agent against the same command through
Kubernetes exec, in one sandbox, in one run. Writes bench/results/exec.json.

    python bench/exec.py --url URL --api-key-file F --kubeconfig K [--samples 50]

Against a deployed platform (`make deploy`; `make bench-exec` finds it): one sandbox of the
template `base` made with the E2B SDK, then the same command run `--samples` times each way,
the ways taking turns so all see the same machine. The command is what the SDK's
`commands.run("true")` starts (`/bin/bash -l -c true`: a login shell, then `true`), so every
way starts the same processes:

- agent: the E2B SDK's commands.run, through the edge's sandbox routing to the agent in the
  pod (Connect over HTTP, the process's start, output and end streamed back);
- warren_api: Warren's own SDK run, through the edge and the API, which calls the same agent;
- kubernetes_exec: the Kubernetes exec websocket from here, with the cluster's admin
  credentials (kube-apiserver, kubelet, the runtime's exec into the gVisor sandbox): what
  Warren's API used before the agent, without the edge and API hops.

`exec_rtt_ms_p50` holds all three; `agent_over_kubernetes_exec` is the agent's ratio.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2b import Sandbox
from warren_control import podexec
from warren_control.kube import Kube
from warren_control.podspec import CONTAINER, GROUP, PLURAL, VERSION, pod_name
from warren_control.sdk import Client

RESULTS = Path(__file__).parent / "results" / "exec.json"
COMMAND = ["/bin/bash", "-l", "-c", "true"]  # what the E2B SDK runs for commands.run("true")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def sandbox_pod(kube: Kube, token: str) -> tuple[str, str]:
    """(namespace, pod) of the sandbox this token opens: its Sandbox resource carries only
    the token's SHA-256."""
    digest = hashlib.sha256(token.encode()).hexdigest()
    listed = kube.request("GET", f"/apis/{GROUP}/{VERSION}/{PLURAL}")
    for item in listed.get("items") or []:
        if (item.get("spec") or {}).get("agentTokenSha256") == digest:
            return item["metadata"]["namespace"], pod_name(item["metadata"]["uid"])
    raise SystemExit("bench-exec: the sandbox's resource is not in the cluster this kubeconfig names")


def timed(run: Callable[[], Any]) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) * 1000


def measure(url: str, key: str, kubeconfig: str, samples: int) -> dict[str, Any]:
    sandbox = Sandbox.create("base", timeout=600, api_key=key, api_url=url, sandbox_url=url)
    warren = Client(url, key)
    warren_id = "sbx_" + sandbox.sandbox_id
    kube = Kube.connect(kubeconfig)
    try:
        namespace, pod = sandbox_pod(kube, sandbox._envd_access_token or "")

        def kube_exec() -> None:
            done = podexec.run(kube, namespace, pod, CONTAINER, COMMAND, timeout_s=60, max_output=1024)
            assert done.status.exit_code == 0, done.status

        ways: dict[str, Callable[[], Any]] = {
            "agent": lambda: sandbox.commands.run("true"),
            "warren_api": lambda: warren.run(warren_id, COMMAND),
            "kubernetes_exec": kube_exec,
        }
        for run in ways.values():  # one each first: connections open, every way proven
            run()
        times: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(samples):
            for name, run in ways.items():
                times[name].append(timed(run))
    finally:
        sandbox.kill()
        warren.close()
    p50 = {name: statistics.median(values) for name, values in times.items()}
    return {
        "samples": samples,
        "exec_rtt_ms_p50": {k: round(v, 2) for k, v in p50.items()},
        "exec_rtt_ms_p95": {k: round(percentile(v, 0.95), 2) for k, v in times.items()},
        "agent_over_kubernetes_exec": round(p50["agent"] / p50["kubernetes_exec"], 3),
        "warren_api_over_kubernetes_exec": round(p50["warren_api"] / p50["kubernetes_exec"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="the edge's URL")
    parser.add_argument("--api-key-file", required=True, help="a file holding an API key (wk_ or e2b_)")
    parser.add_argument("--kubeconfig", required=True, help="the cluster's admin kubeconfig")
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    key = Path(args.api_key_file).read_text().strip()
    result = measure(args.url, key, args.kubeconfig, args.samples)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
