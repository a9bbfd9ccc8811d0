"""Control-plane benchmark: a sandbox through the whole platform against the same pod made
directly, measured in one run on one cluster. Writes bench/results/control.json.

    python bench/control.py --kubeconfig K --image I [--samples 10] [--kwok-json F]

- create_ms_p50/p95: SDK create through the edge until a GET through the edge says Running
  (API, records, Sandbox resource, controller, real gVisor pod, status mirror, all of it).
- direct_pod_ms_p50: the same pod (the controller's own pod_for) created directly against
  the API server until it is Ready; the two alternate, so both see the same machine.
- get_req_per_s: GETs of one sandbox through the edge, several clients at once.
- reconcile_per_s: from the kwok run (--kwok-json, written by bench/control_kwok.py).

Run it through `make bench-control`, which brings a throw-away cluster up and down. The
control plane runs as `warren-control serve --role all`, as a deployment runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from warren_common.testing import free_port
from warren_control import db, store
from warren_control.kube import Kube, Obj
from warren_control.podspec import MANAGED_BY_LABEL, PodOptions, pod_for
from warren_control.sdk import Client

NAMESPACE = "warren-sandboxes"
SLEEP = ["sleep", "86400"]
RESULTS = Path(__file__).parent / "results" / "control.json"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class ControlPlane:
    """`warren-control serve --role all` on a fresh SQLite database, with one organization."""

    def __init__(self, kubeconfig: str, workdir: Path, extra_args: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.url = f"sqlite:///{workdir / 'records.db'}"
        db.upgrade(self.url)
        sessions = db.session_factory(db.make_engine(self.url))
        with sessions.begin() as session:
            org = store.create_org(
                session, "bench", quota_sandboxes=1000, quota_cpu_millis=10**6, quota_memory_mib=10**7
            )
            user = store.create_user(session, org.id, "bench")
            self.key = store.issue_api_key(session, org.id, user.id, ["sandbox:read", "sandbox:write"]).token
        key_file = workdir / "stamp.key"
        key_file.write_text(secrets.token_urlsafe(48))
        key_file.chmod(0o600)
        self.port = free_port()
        api_port = free_port()
        self.log = (workdir / "control.log").open("wb")
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "warren-control"),
                "serve",
                "--role=all",
                f"--database-url={self.url}",
                f"--stamp-key-file={key_file}",
                f"--kubeconfig={kubeconfig}",
                f"--sandbox-namespace={NAMESPACE}",
                f"--port={self.port}",
                f"--api-port={api_port}",
                *extra_args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.edge = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:  # the API's health (loopback), then the edge answering at all (401 without a key)
            try:
                if httpx.get(f"http://127.0.0.1:{api_port}/healthz", timeout=2).status_code == 200:
                    httpx.get(f"{self.edge}/v1/sandboxes", timeout=2)
                    break
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = Path(self.log.name).read_text()[-3000:]
                raise RuntimeError(f"the control plane did not come up:\n{tail}")
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def api_create_ms(client: Client, image: str) -> tuple[float, str]:
    """Create through the edge and poll it (every 20 ms) until it reads Running."""
    start = time.monotonic()
    box = client.create(image, command=SLEEP, cpu_millis=50, memory_mib=128)
    while True:
        seen = client.get(box.id)
        if seen.phase == "Running":
            return (time.monotonic() - start) * 1000, box.id
        if seen.phase == "Failed" or time.monotonic() - start > 180:
            raise RuntimeError(f"the sandbox did not come up: {seen.phase} {seen.reason}")
        time.sleep(0.02)


def direct_pod(image: str, spec: dict[str, Any] | None = None, options: PodOptions | None = None) -> Obj:
    """The controller's pod for a sandbox (its spec updated with `spec`, built with `options`,
    as the control plane under measurement builds it), without an owner (there is no
    Sandbox) and without the controller's label (so no controller or mirror takes it)."""
    sandbox = {
        "apiVersion": "warren.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {
            "name": f"direct-{uuid.uuid4().hex[:8]}",
            "namespace": NAMESPACE,
            "uid": str(uuid.uuid4()),
        },
        "spec": {
            "image": image,
            "command": SLEEP,
            "resources": {"cpu": "50m", "memory": "128Mi"},
            **(spec or {}),
        },
    }
    pod = pod_for(sandbox, options=options or PodOptions(image_pull_policy="IfNotPresent"))
    pod["metadata"].pop("ownerReferences", None)
    pod["metadata"]["labels"][MANAGED_BY_LABEL] = "warren-bench"
    return pod


def direct_pod_ms(kube: Kube, image: str, **pod: Any) -> float:
    """Create the pod (direct_pod's, with `pod` passed on) directly and poll it (every
    20 ms) until it is Ready."""
    body = direct_pod(image, **pod)
    name = body["metadata"]["name"]
    start = time.monotonic()
    kube.create_pod(NAMESPACE, body)
    while True:
        pod = kube.read_pod(NAMESPACE, name) or {}
        conditions = (pod.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            elapsed = (time.monotonic() - start) * 1000
            break
        if time.monotonic() - start > 180:
            raise RuntimeError(f"pod {name} never became Ready")
        time.sleep(0.02)
    kube.delete_pod(NAMESPACE, name)
    return elapsed


def get_rate(
    edge: str, key: str, sandbox_id: str, *, clients: int = 8, seconds: float = 5.0
) -> dict[str, Any]:
    """GETs per second of one sandbox through the edge, `clients` connections at once."""
    counts = [0] * clients
    errors = [0] * clients
    latencies: list[list[float]] = [[] for _ in range(clients)]
    stop = time.monotonic() + seconds

    def worker(index: int) -> None:
        with httpx.Client(base_url=edge, headers={"Authorization": f"Bearer {key}"}) as http:
            while time.monotonic() < stop:
                t0 = time.monotonic()
                ok = http.get(f"/v1/sandboxes/{sandbox_id}").status_code == 200
                latencies[index].append((time.monotonic() - t0) * 1000)
                counts[index] += ok
                errors[index] += not ok

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    every = [value for per in latencies for value in per]
    return {
        "get_req_per_s": round(sum(counts) / elapsed, 1),
        "get_ms_p50": round(statistics.median(every), 2),
        "get_errors": sum(errors),
        "get_clients": clients,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--image", required=True, help="an image the node has")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--kwok-json", type=Path, help="reconcile figures from the kwok run")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    kube = Kube.connect(args.kubeconfig)
    with tempfile.TemporaryDirectory(prefix="warren-bench-control-") as tmp:
        plane = ControlPlane(args.kubeconfig, Path(tmp))
        client = Client(plane.edge, plane.key)
        try:
            # Warm both paths once (image in the page cache, first-pod costs), unmeasured.
            _, warm = api_create_ms(client, args.image)
            client.delete(warm)
            direct_pod_ms(kube, args.image)
            api_ms: list[float] = []
            direct_ms: list[float] = []
            for index in range(args.samples):
                print(f"sample {index + 1}/{args.samples}", file=sys.stderr, flush=True)
                elapsed, box = api_create_ms(client, args.image)
                api_ms.append(elapsed)
                direct_ms.append(direct_pod_ms(kube, args.image))
                client.delete(box)  # one sandbox at a time, as the direct pods
            _, keep = api_create_ms(client, args.image)
            rates = get_rate(plane.edge, plane.key, keep)
            client.delete(keep)
        finally:
            client.close()
            plane.stop()

    result: dict[str, Any] = {
        "samples": args.samples,
        "create_ms_p50": round(statistics.median(api_ms), 1),
        "create_ms_p95": round(percentile(api_ms, 0.95), 1),
        "direct_pod_ms_p50": round(statistics.median(direct_ms), 1),
        "direct_pod_ms_p95": round(percentile(direct_ms, 0.95), 1),
    }
    result["create_over_direct_p50"] = round(result["create_ms_p50"] / result["direct_pod_ms_p50"], 3)
    result.update(rates)
    if args.kwok_json:
        result.update(json.loads(args.kwok_json.read_text()))
    write_result(args.output, result)


def write_result(path: Path, result: dict[str, Any]) -> None:
    """The figures, with the machine's CPU count, as JSON to `path` and to stdout."""
    result["cpus"] = os.cpu_count()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
