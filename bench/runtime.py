"""Runtime benchmark: how long a sandbox pod takes to become Ready under gVisor compared
with the same pod under runc, measured in one run on one cluster, and what an idle
sandbox costs in memory. Writes bench/results/runtime.json.

    python bench/runtime.py --kubeconfig K --bin-dir D [--samples 10]

Run it through `make bench-runtime`, which brings a throw-away local cluster up and down.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from kubernetes import client, watch

from warren.kube import api_client
from warren.node.images import busybox_image

NAMESPACES = {"gvisor": "warren-sandboxes", "runc": "warren-bench-runc"}


def pod(name: str, runtime: str) -> dict[str, object]:
    spec: dict[str, object] = {
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "main",
                "image": busybox_image(),
                "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "securityContext": {"allowPrivilegeEscalation": False},
            }
        ],
    }
    if runtime == "gvisor":
        spec["runtimeClassName"] = "gvisor"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def ready_ms(core: client.CoreV1Api, runtime: str) -> float:
    """Create one pod and return the milliseconds until the API reports it Ready."""
    ns = NAMESPACES[runtime]
    name = f"bench-{runtime}-{uuid.uuid4().hex[:6]}"
    stream = watch.Watch()
    start = time.monotonic()
    core.create_namespaced_pod(ns, pod(name, runtime))
    for event in stream.stream(
        core.list_namespaced_pod, ns, field_selector=f"metadata.name={name}", timeout_seconds=180
    ):
        conditions = event["object"].status.conditions or []
        if any(c.type == "Ready" and c.status == "True" for c in conditions):
            elapsed = (time.monotonic() - start) * 1000
            stream.stop()
            break
    else:
        raise RuntimeError(f"{ns}/{name} never became Ready")
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    return elapsed


def pss_mib_of_sandbox(core: client.CoreV1Api) -> float:
    """PSS of the gVisor processes (sentry, gofer, shim) serving one idle sandbox pod."""
    ns = NAMESPACES["gvisor"]
    name = f"bench-idle-{uuid.uuid4().hex[:6]}"
    core.create_namespaced_pod(ns, pod(name, "gvisor"))
    for _ in range(360):
        status = core.read_namespaced_pod(name, ns).status
        if any(c.type == "Ready" and c.status == "True" for c in status.conditions or []):
            break
        time.sleep(0.5)
    time.sleep(5)  # let start-up allocations settle: this is the idle cost
    uid = core.read_namespaced_pod(name, ns).metadata.uid
    total_kib = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            rollup = (proc / "smaps_rollup").read_text()
        except OSError:
            continue
        gvisor = "runsc" in cmdline or "containerd-shim-runsc-v1" in cmdline
        if gvisor and (uid in cmdline or _serves_pod(proc, uid)):
            total_kib += next(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    if total_kib == 0:
        raise RuntimeError("found no gVisor process of the idle pod")
    return total_kib / 1024


def _serves_pod(proc: Path, uid: str) -> bool:
    """The sandbox and gofer name the pod's sandbox id, not its uid: match by cgroup."""
    try:
        return uid.replace("-", "_") in (proc / "cgroup").read_text() or uid in (proc / "cgroup").read_text()
    except OSError:
        return False


def runsc_do_true_ms(bin_dir: Path, platform: str, samples: int) -> list[float]:
    """`runsc do true`: the floor of what starting anything under gVisor costs here."""
    runs = []
    with tempfile.TemporaryDirectory() as root:
        for _ in range(samples):
            start = time.monotonic()
            subprocess.run(
                [
                    str(bin_dir / "runsc"),
                    f"--root={root}",
                    f"--platform={platform}",
                    "--network=none",
                    "do",
                    "true",
                ],
                check=True,
                capture_output=True,
            )
            runs.append((time.monotonic() - start) * 1000)
    return runs


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--bin-dir", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--platform", default="systrap")
    parser.add_argument("--out", type=Path, default=Path("bench/results/runtime.json"))
    args = parser.parse_args()
    core = client.CoreV1Api(api_client(args.kubeconfig))
    core.create_namespace({"metadata": {"name": NAMESPACES["runc"]}})
    try:
        # Interleaved, so drift on the machine touches both runtimes alike; one warm-up each.
        gvisor, runc = [], []
        ready_ms(core, "gvisor")
        ready_ms(core, "runc")
        for _ in range(args.samples):
            gvisor.append(ready_ms(core, "gvisor"))
            runc.append(ready_ms(core, "runc"))
        pss = pss_mib_of_sandbox(core)
    finally:
        core.delete_namespace(NAMESPACES["runc"])
    floor = runsc_do_true_ms(args.bin_dir, args.platform, args.samples)
    result = {
        "samples": args.samples,
        "gvisor_ready_ms_p50": round(statistics.median(gvisor), 1),
        "gvisor_ready_ms_p95": round(p(gvisor, 0.95), 1),
        "runc_ready_ms_p50": round(statistics.median(runc), 1),
        "gvisor_over_runc_ready_p50": round(statistics.median(gvisor) / statistics.median(runc), 3),
        "runsc_do_true_ms_p50": round(statistics.median(floor), 1),
        "sandbox_pss_mib": round(pss, 1),
        "runsc_platform": args.platform,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
