"""Start benchmark: how fast a sandbox is ready to run a command through the API, from a warm
pool and cold, against the same pod made directly; how many idle sandboxes one node holds and
what one costs; the edge's GETs against a bare handler on the same web stack. Every figure is
measured in one run on one machine, each beside its baseline. Writes bench/results/start.json.

    python bench/start.py --kubeconfig K --image I [--samples 10] [--idle 100] [--kwok-json F]
    python bench/start.py --kubeconfig K --platform-url URL --api-key-file F --partial F

- pool_create_to_exec_ms_p50/_p99: an API create its pooled template describes, until the
  output of a command run through the API arrives (the controller claims a ready pool pod).
- cold_create_to_exec_ms_p50: the same with no pool to claim from (the pod starts cold).
- bare_pod_ready_ms_p50: the controller's own pod created directly until it is Ready.
- idle_sandboxes_per_node, idle_sandbox_pss_mib: `--idle` sandboxes of the default size
  (1 CPU, 1 GiB, reserving the deployment's 1% and 10% of it) created at once through the
  API on the one node; how many run and answer a command, and the proportional set size of
  gVisor's processes and shims per sandbox. burst_creates_per_s and burst_create_ms_p99
  are those creates' API calls.
- creates_per_s: the highest of CREATE_RATES at which API creates, started on a fixed
  schedule for CREATE_WINDOW_S (an open loop: a slow answer does not delay the next
  create), answered with p99 under 500 ms, timed from each create's scheduled start; each
  rate's p50 and p99 in create_rates.
- get_req_per_s through the edge; baseline_req_per_s from a bare handler served by the same
  uvicorn (httptools, uvloop) to the same clients: each the median of GET_ROUNDS rounds,
  the two measured one after the other in each round on the node at rest
  (get_req_per_s_rounds, baseline_req_per_s_rounds).
- reconcile_per_s and direct_pods_per_s: from the kwok run (--kwok-json): each the median of
  its rounds (reconcile_per_s_rounds, direct_pods_per_s_rounds; bench/run-control.sh).
- With --platform-url (the platform site.yml deployed, bench/warren-bench.yaml), where
  every sandbox has its workspace from warren-blockd: platform_pool_create_to_exec_ms_p50
  and _p99 (the base pool's pods, each with a new workspace the sandbox is bound to),
  platform_cold_create_to_exec_ms_p50 (a size no pool holds), and fork8_to_exec_ms_p50: a
  running sandbox forked into eight children, until each has answered a command (with the
  fork pool base-forks full before each fork: fork8_children_claimed says how many children
  of all the samples claimed one of its pods). Its figures are added to --partial's.
- Every sample, on either cluster, starts once no pod of the sample before is still going
  away and the node is at rest (under a quarter of its CPUs busy over half a second, waited
  for up to 30 s): the work a sample sets going in the background is not measured with the
  next one.

Run it through `make bench-start`, which brings a throw-away cluster up and down, then the
platform.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx
from control import NAMESPACE, SLEEP, ControlPlane, direct_pod_ms, get_rate, percentile, write_result
from warren_common.testing import free_port, gvisor_pss_kib
from warren_control.kube import ApiException, Kube
from warren_control.podspec import PodOptions
from warren_control.sdk import Client, WarrenError

RESULTS = Path(__file__).parent / "results" / "start.json"
POOL = "base"
FORK_POOL = "base-forks"  # services.pools.base.forks
POOL_SIZE = 4
FORK_CHILDREN = 8
START_TIMEOUT_S = 180
AT_REST_BUSY = 0.25
AT_REST_WAIT_S = 30
# The sustained create rate: rates tried in turn, each for CREATE_WINDOW_S.
CREATE_RATES = (5.0, 10.0, 20.0, 40.0)
CREATE_WINDOW_S = 5.0
GET_ROUNDS = 3
CREATE_P99_MS = 500.0
# The template's size, and a sandbox's default: what the pool's pods are made at.
CPU_MILLIS, MEMORY_MIB = 1000, 1024
# The deployment's shares of it (services.sandbox_*_request_percent), given to the control
# plane and to the pods made directly alike, so the baseline is the same pod.
CPU_PERCENT, MEMORY_PERCENT = 1, 10


def bare_pod(agent_image: str | None) -> dict[str, Any]:
    """What direct_pod_ms needs to make the cold path's own pod: its size and shares, and,
    with an agent image, the agent (which the pod is Ready only once it answers)."""
    spec: dict[str, Any] = {"resources": {"cpu": f"{CPU_MILLIS}m", "memory": f"{MEMORY_MIB}Mi"}}
    if agent_image:
        spec["agentTokenSha256"] = hashlib.sha256(b"bench").hexdigest()
    options = PodOptions(
        cpu_request_percent=CPU_PERCENT, memory_request_percent=MEMORY_PERCENT, agent_image=agent_image
    )
    return {"spec": spec, "options": options}


def create_to_exec_ms(
    client: Client, image: str, *, command: list[str] | None = SLEEP, memory_mib: int = MEMORY_MIB
) -> tuple[float, str, str]:
    """(ms from the create call until `echo ready` answers through the API, the sandbox's
    id, how its pod started according to its PoolClaimed condition)."""
    start = time.monotonic()
    box = client.create(image, command=command, cpu_millis=CPU_MILLIS, memory_mib=memory_mib)
    answer(client, box.id, start)
    elapsed = (time.monotonic() - start) * 1000
    started = next(
        (f"{c.status}/{c.reason}" for c in client.get(box.id).conditions if c.type == "PoolClaimed"), "none"
    )
    return elapsed, box.id, started


def answer(client: Client, sandbox_id: str, start: float) -> None:
    """Wait until the sandbox runs, as the SDK waits (long polls: the API answers as soon as
    the sandbox's state changes), then until `echo ready` answers through the API."""
    try:
        client.wait_until(sandbox_id, "Running", timeout=START_TIMEOUT_S - (time.monotonic() - start))
    except WarrenError as exc:
        raise RuntimeError(f"sandbox {sandbox_id} did not come up: {exc}") from exc
    result = client.run(sandbox_id, ["echo", "ready"])
    if result.stdout.strip() != b"ready":
        raise RuntimeError(f"the command's output was {result.stdout!r}, {result.stderr!r}")


def pool_ready(kube: Kube, size: int, name: str = POOL) -> bool:
    status = kube.request("GET", kube.pools_path(NAMESPACE, name)).get("status") or {}
    return int(status.get("ready") or 0) >= size


def settled(kube: Kube) -> bool:
    """No pod of the sandbox namespace is still going away: the sample before's teardown (its
    gVisor sandboxes, its workspaces' unmounts) is not measured with the next one."""
    pods = kube.request("GET", kube.pods_path(NAMESPACE)).get("items") or []
    return not any(pod["metadata"].get("deletionTimestamp") for pod in pods)


def at_rest(seconds: float = 0.5) -> bool:
    """Whether this machine (the platform's one node) used under AT_REST_BUSY of its CPUs
    over `seconds`: what the sample before set going in the background (pool refills,
    workspace releases and replication) is not measured with the next one."""

    def idle_and_total() -> tuple[int, int]:
        ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return ticks[3] + ticks[4], sum(ticks)  # idle and iowait, of everything

    idle, total = idle_and_total()
    time.sleep(seconds)
    idle_after, total_after = idle_and_total()
    return 1 - (idle_after - idle) / max(1, total_after - total) < AT_REST_BUSY


def quiet(kube: Kube) -> None:
    """Before every sample, of either cluster: no pod of the sandbox namespace still going
    away, then the node at rest (AT_REST_WAIT_S at most: then it is measured anyway, saying so)."""
    wait("the node to settle", lambda: settled(kube))
    deadline = time.monotonic() + AT_REST_WAIT_S
    while not at_rest():
        if time.monotonic() > deadline:
            print(f"  the node was still busy after {AT_REST_WAIT_S} s: measuring anyway", file=sys.stderr)
            return


def wait(what: str, check: Callable[[], bool], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen in {timeout:.0f} s")
        time.sleep(0.05)


def make_pool(kube: Kube, image: str) -> None:
    body = {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "SandboxPool",
        "metadata": {"name": POOL},
        "spec": {
            "image": image,
            "command": SLEEP,
            "resources": {"cpu": f"{CPU_MILLIS}m", "memory": f"{MEMORY_MIB}Mi"},
            "size": POOL_SIZE,
            "refillPerSecond": 10,
        },
    }
    kube.request("POST", kube.pools_path(NAMESPACE), body=body)


def idle_density(client: Client, image: str, count: int) -> dict[str, Any]:
    """`count` default-size sandboxes created at once through the API (8 clients), each
    asked a command once all run; what they cost in memory."""
    _, before_kib = gvisor_pss_kib()
    latencies: list[float] = []

    def create(_: int) -> str:
        t0 = time.monotonic()
        box = client.create(image, command=SLEEP)
        latencies.append((time.monotonic() - t0) * 1000)
        return box.id

    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(create, range(count)))
    create_seconds = time.monotonic() - start
    deadline = time.monotonic() + 900
    while True:
        phases = [client.get(i).phase for i in ids]
        running = phases.count("Running")
        print(f"idle: {running}/{count} running", file=sys.stderr, flush=True)
        if running == count or time.monotonic() > deadline or "Failed" in phases:
            break
        time.sleep(5)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: client.run(i, ["echo", i]).stdout.strip() == i.encode(), ids))
    per_sandbox_mib = (gvisor_pss_kib()[1] - before_kib) / max(1, running) / 1024
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client.delete, ids))
    wait("the idle sandboxes to go", lambda: all(gone(client, i) for i in ids), 600)
    return {
        "idle_sandboxes_per_node": sum(answers),
        "idle_sandboxes_tried": count,
        "idle_sandbox_pss_mib": round(per_sandbox_mib, 1),
        "burst_creates_per_s": round(count / create_seconds, 1),
        "burst_create_ms_p50": p50(latencies),
        "burst_create_ms_p99": p99(latencies),
    }


def paced_creates(client: Client, image: str, rate: float, seconds: float) -> list[float]:
    """API creates started every 1/rate s for `seconds`; each one's ms from its scheduled
    start until the API answered. The sandboxes are deleted, and gone, before it returns."""
    count = int(rate * seconds)
    latencies: list[float] = []
    ids: list[str] = []
    start = time.monotonic() + 0.1

    def create(index: int) -> None:
        due = start + index / rate
        time.sleep(max(0.0, due - time.monotonic()))
        box = client.create(image, command=SLEEP)
        latencies.append((time.monotonic() - due) * 1000)
        ids.append(box.id)

    with ThreadPoolExecutor(64) as pool:
        list(pool.map(create, range(count)))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(client.delete, ids))
    wait("the paced creates' sandboxes to go", lambda: all(gone(client, i) for i in ids), 600)
    return latencies


def sustained_create_rate(client: Client, image: str) -> dict[str, Any]:
    """creates_per_s: the highest rate of CREATE_RATES whose creates answered with p99 under
    CREATE_P99_MS (the sweep stops at the first that did not)."""
    rates: dict[str, dict[str, float]] = {}
    best = 0.0
    for rate in CREATE_RATES:
        print(f"creates at {rate}/s for {CREATE_WINDOW_S:.0f} s", file=sys.stderr, flush=True)
        latencies = paced_creates(client, image, rate, CREATE_WINDOW_S)
        rates[f"{rate:g}"] = {"p50_ms": p50(latencies), "p99_ms": p99(latencies)}
        if p99(latencies) >= CREATE_P99_MS:
            break
        best = rate
    return {"creates_per_s": best, "create_rates": rates}


BASELINE_APP = textwrap.dedent(
    """
    import sys
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def one(request):
        return JSONResponse({"id": request.path_params["id"], "phase": "Running"})

    app = Starlette(routes=[Route("/v1/sandboxes/{id}", one)])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


def baseline_rate(sandbox_id: str) -> float:
    """GETs per second of a bare handler on the edge's web stack, with get_rate's clients."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", BASELINE_APP, str(port)])
    try:
        wait("the baseline server", lambda: _answers(f"http://127.0.0.1:{port}/v1/sandboxes/x"), 30)
        rate: float = get_rate(f"http://127.0.0.1:{port}", "none", sandbox_id)["get_req_per_s"]
        return rate
    finally:
        server.terminate()
        server.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def on_the_cluster(
    kube: Kube, kubeconfig: str, image: str, *, agent_image: str | None, samples: int, idle: int
) -> dict[str, Any]:
    """Everything measured through the control plane on the real node."""
    # The deployment's shares (services.sandbox_*_request_percent), and the pooled template.
    serve = (
        f"--template={POOL}={image}",
        f"--pool={POOL}",
        f"--cpu-request-percent={CPU_PERCENT}",
        f"--memory-request-percent={MEMORY_PERCENT}",
        *((f"--agent-image={agent_image}",) if agent_image else ()),
    )
    pod = bare_pod(agent_image)
    with tempfile.TemporaryDirectory(prefix="warren-bench-start-") as tmp:
        plane = ControlPlane(kubeconfig, Path(tmp), serve)
        client = Client(plane.edge, plane.key)
        try:
            # Cold and bare alternate (no pool exists yet: creates start cold, PoolNotFound),
            # after one unmeasured round of each (image in the page cache, first-pod costs).
            _, warm, _ = create_to_exec_ms(client, image)
            client.delete(warm)
            direct_pod_ms(kube, image, **pod)
            cold: list[float] = []
            bare: list[float] = []
            for index in range(samples):
                print(f"cold and bare {index + 1}/{samples}", file=sys.stderr, flush=True)
                quiet(kube)
                cold.append(sample(client, image, "False/PoolNotFound"))
                quiet(kube)
                bare.append(direct_pod_ms(kube, image, **pod))
            make_pool(kube, image)
            pooled: list[float] = []
            for index in range(samples):
                wait("the pool to be ready", lambda: pool_ready(kube, POOL_SIZE))
                print(f"from the pool {index + 1}/{samples}", file=sys.stderr, flush=True)
                quiet(kube)
                pooled.append(sample(client, image, "True/Claimed"))
            kube.request("DELETE", kube.pools_path(NAMESPACE, POOL))
            _, keep, _ = create_to_exec_ms(client, image)
            # The edge's GETs and the bare handler's in rounds side by side, each on the node
            # at rest: measured once each, minutes apart, either moved by a third between runs.
            gets, baselines = [], []
            for _ in range(GET_ROUNDS):
                quiet(kube)
                gets.append(get_rate(plane.edge, plane.key, keep))
                baselines.append(baseline_rate("x"))
            client.delete(keep)
            density = idle_density(client, image, idle)
            sustained = sustained_create_rate(client, image)
        finally:
            client.close()
            plane.stop()
    return {
        "pool_create_to_exec_ms_p50": p50(pooled),
        "pool_create_to_exec_ms_p99": p99(pooled),
        "cold_create_to_exec_ms_p50": p50(cold),
        "bare_pod_ready_ms_p50": p50(bare),
        "fork8_to_exec_ms_p50": None,
        **density,
        **sustained,
        **sorted(gets, key=lambda g: g["get_req_per_s"])[len(gets) // 2],  # the median round
        "get_req_per_s_rounds": [g["get_req_per_s"] for g in gets],
        "baseline_req_per_s": statistics.median(baselines),
        "baseline_req_per_s_rounds": baselines,
    }


def sample(client: Client, image: str, expected: str, **create: Any) -> float:
    """One create to exec that must have started as `expected` (PoolClaimed status/reason)."""
    elapsed, box, started = create_to_exec_ms(client, image, **create)
    client.delete(box)
    if started != expected:
        raise RuntimeError(f"a create expected to start {expected} started {started}")
    return elapsed


def fork_to_exec_ms(client: Client, parent: str, count: int) -> tuple[float, int]:
    """(ms from the fork call until each of its `count` children has answered a command,
    how many of them claimed a pool's pod); the children are deleted, and gone, before it
    returns."""
    start = time.monotonic()
    results = client.fork(parent, count)
    children = [r.sandbox.id for r in results if r.sandbox is not None]
    if len(children) != count:
        raise RuntimeError(f"the fork made {len(children)} of {count}: {[r.error for r in results]}")
    with ThreadPoolExecutor(count) as pool:
        list(pool.map(lambda child: answer(client, child, start), children))
    elapsed = (time.monotonic() - start) * 1000
    claimed = sum(
        1
        for child in children
        for c in client.get(child).conditions
        if c.type == "PoolClaimed" and c.status == "True"
    )
    for child in children:
        client.delete(child)
    wait("the children to be deleted", lambda: all(gone(client, child) for child in children))
    return elapsed, claimed


def gone(client: Client, sandbox_id: str) -> bool:
    try:
        client.get(sandbox_id)
    except WarrenError as exc:
        if exc.code == "not_found":
            return True
        raise
    return False


def on_the_platform(kube: Kube, url: str, key: str, *, samples: int, fork_samples: int) -> dict[str, Any]:
    """The platform as site.yml deploys it (bench/warren-bench.yaml: the base template's
    pool from services.pools), through its edge: every sandbox has its workspace from
    warren-blockd, as users get it. A create of base claims from the pool and is bound to
    the pod's workspace; one of another size starts cold; a fork of a running sandbox into
    eight children (each a manifest publish and a cold pod on the parent's node)."""
    pool = kube.request("GET", kube.pools_path(NAMESPACE, POOL))
    image, size = str(pool["spec"]["image"]), int(pool["spec"]["size"])
    client = Client(url, key)
    cold_size = {"command": None, "memory_mib": MEMORY_MIB - 1}  # a size no pool holds
    try:
        # One unmeasured round of each (images in the page cache, first-pod costs).
        wait("the pool to be ready", lambda: pool_ready(kube, size))
        sample(client, image, "True/Claimed", command=None)
        sample(client, image, "False/NoPool", **cold_size)
        pooled: list[float] = []
        cold: list[float] = []
        for index in range(samples):
            print(f"platform: pool and cold {index + 1}/{samples}", file=sys.stderr, flush=True)
            wait("the pool to be ready", lambda: pool_ready(kube, size))
            quiet(kube)
            pooled.append(sample(client, image, "True/Claimed", command=None))
            quiet(kube)
            cold.append(sample(client, image, "False/NoPool", **cold_size))
        _, parent, _ = create_to_exec_ms(client, image, command=None)
        client.write_file(parent, "/workspace/note", b"written before the fork\n")
        forks: list[float] = []
        claimed = 0
        fork_pool = fork_pool_size(kube)
        for index in range(fork_samples):
            print(
                f"platform: fork into {FORK_CHILDREN} {index + 1}/{fork_samples}", file=sys.stderr, flush=True
            )
            if fork_pool:
                wait("the fork pool to be ready", lambda: pool_ready(kube, fork_pool, FORK_POOL))
            quiet(kube)
            elapsed, children_claimed = fork_to_exec_ms(client, parent, FORK_CHILDREN)
            forks.append(elapsed)
            print(f"  {elapsed:.0f} ms, {children_claimed} children claimed", file=sys.stderr, flush=True)
            claimed += children_claimed
        client.delete(parent)
    finally:
        client.close()
    return {
        "platform_pool_create_to_exec_ms_p50": p50(pooled),
        "platform_pool_create_to_exec_ms_p99": p99(pooled),
        "platform_cold_create_to_exec_ms_p50": p50(cold),
        "fork8_to_exec_ms_p50": p50(forks),
        "fork8_samples": fork_samples,
        "fork8_children_claimed": f"{claimed}/{FORK_CHILDREN * fork_samples}",
        "fork_pool_size": fork_pool,
    }


def fork_pool_size(kube: Kube) -> int:
    """The size of the fork pool, 0 if the deployment has none."""
    try:
        return int(kube.request("GET", kube.pools_path(NAMESPACE, FORK_POOL))["spec"]["size"])
    except ApiException as exc:
        if exc.status == HTTPStatus.NOT_FOUND:
            return 0
        raise


def p50(values: list[float]) -> float:
    return round(statistics.median(values), 1)


def p99(values: list[float]) -> float:
    return round(percentile(values, 0.99), 1)


def with_ratios(result: dict[str, Any]) -> dict[str, Any]:
    """The acceptance's ratios, each figure over the baseline measured beside it."""
    bare = result["bare_pod_ready_ms_p50"]
    ratios = {
        "pool_p50_over_bare_p50": result["pool_create_to_exec_ms_p50"] / bare,
        "pool_p99_over_bare_p50": result["pool_create_to_exec_ms_p99"] / bare,
        "cold_p50_over_bare_p50": result["cold_create_to_exec_ms_p50"] / bare,
        "get_over_baseline": result["get_req_per_s"] / result["baseline_req_per_s"],
    }
    if result.get("fork8_to_exec_ms_p50") is not None:
        ratios["fork8_p50_over_cold_p50"] = (
            result["fork8_to_exec_ms_p50"] / result["cold_create_to_exec_ms_p50"]
        )
        ratios["fork8_p50_over_platform_cold_p50"] = (
            result["fork8_to_exec_ms_p50"] / result["platform_cold_create_to_exec_ms_p50"]
        )
        ratios["platform_pool_p50_over_bare_p50"] = result["platform_pool_create_to_exec_ms_p50"] / bare
    if "direct_pods_per_s" in result:
        ratios["reconcile_over_direct"] = result["reconcile_per_s"] / result["direct_pods_per_s"]
    return {**result, **{name: round(value, 3) for name, value in ratios.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--image", help="an image the node has (the throw-away cluster)")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument(
        "--agent-image", help="the agent image the node has: sandboxes get their agent, as deployed"
    )
    parser.add_argument("--idle", type=int, default=100, help="idle sandboxes to start at once")
    parser.add_argument("--kwok-json", type=Path, help="reconcile figures from the kwok run")
    parser.add_argument("--platform-url", help="the deployed platform's edge: measure on it instead")
    parser.add_argument("--api-key-file", type=Path, help="with --platform-url: a key of its")
    parser.add_argument("--partial", type=Path, help="with --platform-url: the throw-away cluster's figures")
    parser.add_argument("--fork-samples", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    kube = Kube.connect(args.kubeconfig)
    if args.platform_url:
        if args.api_key_file is None:
            parser.error("--platform-url needs --api-key-file")
        result: dict[str, Any] = json.loads(args.partial.read_text()) if args.partial else {}
        key = args.api_key_file.read_text().strip()
        result.update(
            on_the_platform(
                kube, args.platform_url, key, samples=args.samples, fork_samples=args.fork_samples
            )
        )
    else:
        if not args.image:
            parser.error("the throw-away cluster needs --image")
        result = {"samples": args.samples}
        result.update(
            on_the_cluster(
                kube,
                args.kubeconfig,
                args.image,
                agent_image=args.agent_image,
                samples=args.samples,
                idle=args.idle,
            )
        )
        result["agent"] = bool(args.agent_image)
        if args.kwok_json:
            result.update(json.loads(args.kwok_json.read_text()))
    write_result(args.output, with_ratios(result))


if __name__ == "__main__":
    main()
