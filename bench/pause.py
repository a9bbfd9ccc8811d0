"""Pause and resume with memory against a cold start of the same image, on the deployed
platform, in one run. Writes bench/results/pause.json.

    python bench/pause.py --url URL --api-key-file F --kubeconfig K [--samples 5] [--hold-mib 32]

Each sample is one sandbox of the base template's image (the agent in it, as a memory
capture needs) running a shell that holds `--hold-mib` of random bytes in memory (a tmpfs
file in the gVisor sandbox's own memory, which does not compress) and counts:

- cold_create_to_exec: create (a command of its own: never a warm pool's pod) until a
  command run through the API answers;
- pause: a stop with memory capture until its image is a restore point: sealed over its
  workspace's write record (the capture, the pod's end, the proof in storage) and proved by a
  restore (a pod restored from it onto a fork of the workspace ran, and is gone);
  `sealed_ms` is the part until the seal, `verify_ms` the proof's restore alone;
- resume: a start until a command run through the API answers, read from the restored
  process (its counter carried on from where it stood, or the sample fails), in a resume
  slot: the run keeps a resume pool (SandboxPool `resume: true`) of the samples' image,
  command and size, one slot per Ready node, as an operator would for the sandboxes they
  pause;
- resume_in_new_pod: the same for a second sandbox that no slot fits (its command differs
  by a comment), whose resume makes its pod, as every resume did before resume slots.

`image_mib_per_rss_mib` is the stored image's size over the sandbox's memory in use as
its own /proc/meminfo reports it at the pause. `resume_over_cold` is the ratio the issue
bounds. With a second Ready node, each sample is then paused again and resumed with its node
cordoned: `resume_other_node` is that start until the restored process answers on the other
node (the image staged there from object storage). With one node it is null and says why.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from warren_common.testing import wait_for
from warren_control.kube import Kube
from warren_control.podspec import GROUP, PLURAL, VERSION
from warren_control.sdk import Client, WarrenError

RESULTS = Path(__file__).parent / "results" / "pause.json"
POOL = "bench-pause-resumes"
SYSTEM = "warren-system"
WAIT_S = 300.0
POLL_S = 0.05  # fine enough for the figures it times
COUNT = "/tmp/count"  # noqa: S108  # inside the sandbox, in its own memory
HOLD = r"""
head -c {mib}M /dev/urandom > /tmp/held
n=0
while true; do n=$((n + 1)); echo $n > {count}; sleep 0.2; done
"""


def base_image(kube: Kube) -> str:
    """The base template's image, from the control plane's own arguments."""
    deployment = kube.request("GET", f"/apis/apps/v1/namespaces/{SYSTEM}/deployments/warren-control")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return next(a.split("=", 2)[2] for a in args if a.startswith("--template=base="))


def memory_image(kube: Kube, workspace: str, *, proved: bool = False) -> dict[str, Any] | None:
    """The sealed (with `proved`, also proved) memory image record of the Sandbox resource
    with this workspace."""
    record = (sandbox_of(kube, workspace).get("status") or {}).get("memoryImage") or {}
    if record.get("unrestorable"):
        raise SystemExit(f"bench-pause: the image did not restore: {record['unrestorable']}")
    done = (record.get("verification") or {}).get("done") or not proved
    return dict(record) if "sealedSeq" in record and done else None


def soon(check: Any, what: str) -> Any:
    return wait_for(check, WAIT_S, what, interval=POLL_S)


def answers(warren: Client, sandbox_id: str) -> int | None:
    try:
        done = warren.run(sandbox_id, ["cat", COUNT], timeout=30)
    except WarrenError:  # not running yet: the next try tells
        return None
    return int(done.stdout) if done.exit_code == 0 and done.stdout.strip() else None


def in_use_mib(warren: Client, sandbox_id: str) -> float:
    meminfo = warren.run(sandbox_id, ["cat", "/proc/meminfo"], timeout=30).stdout.decode()
    fields = {line.split(":")[0]: int(line.split()[1]) for line in meminfo.splitlines() if line.strip()}
    return (fields["MemTotal"] - fields["MemAvailable"]) / 1024


def node_of(kube: Kube, workspace: str) -> str:
    pods = kube.request("GET", "/api/v1/pods", query={"labelSelector": f"warren.dev/workspace={workspace}"})
    (node,) = {
        pod["spec"].get("nodeName")
        for pod in pods.get("items") or []
        if not pod["metadata"].get("deletionTimestamp")
    }
    return str(node)


def cordon(kube: Kube, node: str, *, on: bool) -> None:
    body = {"spec": {"unschedulable": on}}
    kube.request("PATCH", f"/api/v1/nodes/{node}", body=body, content_type="application/merge-patch+json")


def resume_elsewhere(warren: Client, kube: Kube, sandbox_id: str, workspace: str) -> float:
    """Pause again, cordon the sandbox's node, and time the start until the process restored
    on another node answers (its counter carried on)."""
    node = node_of(kube, workspace)
    before = answers(warren, sandbox_id) or 0
    warren.stop(sandbox_id, memory=True)
    soon(lambda: memory_image(kube, workspace, proved=True), "the second memory image proved")
    cordon(kube, node, on=True)
    try:
        began = time.perf_counter()
        warren.start(sandbox_id)
        count = soon(lambda: answers(warren, sandbox_id), "the sandbox resumed on another node answers")
        resumed_ms = (time.perf_counter() - began) * 1000
    finally:
        cordon(kube, node, on=False)
    if node_of(kube, workspace) == node or count < before:
        raise SystemExit(
            f"bench-pause: not resumed on another node with its memory (counter {count}, was {before})"
        )
    return resumed_ms


def pools_path(namespace: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/sandboxpools"


def keep_slots(kube: Kube, sandbox: dict[str, Any], size: int) -> str:
    """A resume pool of the Sandbox's image, command and size, `size` slots; its namespace."""
    spec, namespace = sandbox["spec"], sandbox["metadata"]["namespace"]
    pool_spec = {key: spec[key] for key in ("image", "command", "resources", "reservation") if spec.get(key)}
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SandboxPool",
        "metadata": {"name": POOL},
        "spec": {**pool_spec, "resume": True, "size": size, "refillPerSecond": 10},
    }
    kube.request("POST", pools_path(namespace), body=body)
    return str(namespace)


def slots_ready(kube: Kube, namespace: str, size: int) -> bool:
    """Whether the pool has `size` slots waiting, spread over the nodes as far as it goes."""
    pods = kube.request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query={"labelSelector": f"warren.dev/pool={POOL}"}
    )
    waiting = [
        p
        for p in pods.get("items") or []
        if not p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName")
    ]
    status = kube.request("GET", f"{pools_path(namespace)}/{POOL}").get("status") or {}
    return int(status.get("ready") or 0) >= size and len({p["spec"]["nodeName"] for p in waiting}) >= min(
        size, 2
    )


def sandbox_of(kube: Kube, workspace: str) -> dict[str, Any]:
    """The Sandbox resource with this workspace."""
    listed = kube.request("GET", f"/apis/{GROUP}/{VERSION}/{PLURAL}")
    for item in listed.get("items") or []:
        if ((item.get("spec") or {}).get("workspace") or {}).get("id") == workspace:
            return dict(item)
    raise SystemExit(f"bench-pause: no Sandbox resource with workspace {workspace} in this cluster")


def pause_and_resume(
    warren: Client, kube: Kube, sandbox_id: str, workspace: str
) -> tuple[float, float, float, dict[str, Any]]:
    """(pause ms, of which sealed ms, resume ms, the image record) of one pause and resume."""
    before = answers(warren, sandbox_id) or 0
    began = time.perf_counter()
    warren.stop(sandbox_id, memory=True)
    soon(lambda: memory_image(kube, workspace), "the memory image sealed")
    sealed_ms = (time.perf_counter() - began) * 1000
    record = soon(lambda: memory_image(kube, workspace, proved=True), "the memory image proved")
    pause_ms = (time.perf_counter() - began) * 1000
    began = time.perf_counter()
    warren.start(sandbox_id)
    count = soon(lambda: answers(warren, sandbox_id), "the resumed sandbox answers")
    resume_ms = (time.perf_counter() - began) * 1000
    if count < before:
        raise SystemExit(f"bench-pause: the resumed counter read {count}, below {before}: not restored")
    return pause_ms, sealed_ms, resume_ms, record


def sample(
    warren: Client,
    kube: Kube,
    image: str,
    hold_mib: int,
    *,
    elsewhere: bool,
    slots: Callable[[dict[str, Any]], None],
) -> dict[str, float]:
    command = ["sh", "-c", HOLD.format(mib=hold_mib, count=COUNT)]
    began = time.perf_counter()
    created = warren.create(image, command=command, memory_mib=256)
    try:
        soon(lambda: answers(warren, created.id), "the cold sandbox answers")
        cold_ms = (time.perf_counter() - began) * 1000
        soon(lambda: (answers(warren, created.id) or 0) > 3, "the held memory is written")
        rss = in_use_mib(warren, created.id)
        workspace = warren.workspace_proof(created.id).workspace_id
        slots(sandbox_of(kube, workspace))
        pause_ms, sealed_ms, resume_ms, record = pause_and_resume(warren, kube, created.id, workspace)
        other = (
            {"resume_other_node_ms": resume_elsewhere(warren, kube, created.id, workspace)}
            if elsewhere
            else {}
        )
        return {
            **other,
            "resume_in_new_pod_ms": resume_in_new_pod(warren, kube, image, command),
            "cold_ms": cold_ms,
            "pause_ms": pause_ms,
            "sealed_ms": sealed_ms,
            "verify_ms": float(record["verification"]["ms"]),
            "resume_ms": resume_ms,
            "image_mib": int(record["bytes"]) / (1 << 20),
            "rss_mib": rss,
        }
    finally:
        warren.delete(created.id)


def resume_in_new_pod(warren: Client, kube: Kube, image: str, command: list[str]) -> float:
    """A resume of a sandbox no slot fits (its command differs by a comment): ms."""
    other = warren.create(image, command=[*command[:2], command[2] + "# no slot fits\n"], memory_mib=256)
    try:
        soon(lambda: (answers(warren, other.id) or 0) > 3, "the second sandbox counts")
        workspace = warren.workspace_proof(other.id).workspace_id
        return pause_and_resume(warren, kube, other.id, workspace)[2]
    finally:
        warren.delete(other.id)


def ready_nodes(kube: Kube) -> int:
    return sum(
        1
        for node in kube.request("GET", "/api/v1/nodes").get("items") or []
        if not (node.get("spec") or {}).get("unschedulable")
        and any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or []
        )
    )


def measure(url: str, key: str, kubeconfig: str, samples: int, hold_mib: int) -> dict[str, Any]:
    kube = Kube.connect(kubeconfig)
    image = base_image(kube)
    count = ready_nodes(kube)
    namespace: list[str] = []

    def slots(sandbox: dict[str, Any]) -> None:
        """The resume pool, made for the first sample's shape; every resume waits for its slots."""
        if not namespace:
            namespace.append(keep_slots(kube, sandbox, count))
        soon(lambda: slots_ready(kube, namespace[0], count), "the resume pool's slots waiting")

    try:
        with Client(url, key, timeout=60.0) as warren:
            runs = [
                sample(warren, kube, image, hold_mib, elsewhere=count > 1, slots=slots)
                for _ in range(samples)
            ]
    finally:
        if namespace:
            kube.request("DELETE", f"{pools_path(namespace[0])}/{POOL}")
    p50 = {name: statistics.median(run[name] for run in runs) for name in runs[0]}
    return {
        "samples": samples,
        "hold_mib": hold_mib,
        "image": image,
        "pause_ms_p50": round(p50["pause_ms"], 1),
        "sealed_ms_p50": round(p50["sealed_ms"], 1),
        "verify_ms_p50": round(p50["verify_ms"], 1),
        "resume_ms_p50": round(p50["resume_ms"], 1),
        "cold_create_to_exec_ms_p50": round(p50["cold_ms"], 1),
        "resume_over_cold": round(p50["resume_ms"] / p50["cold_ms"], 3),
        "resume_in_new_pod_ms_p50": round(p50["resume_in_new_pod_ms"], 1),
        "resume_in_new_pod_over_cold": round(p50["resume_in_new_pod_ms"] / p50["cold_ms"], 3),
        "resume_slots": f"a resume pool of the samples' shape, {count} slot(s)",
        "image_mib_p50": round(p50["image_mib"], 1),
        "rss_mib_p50": round(p50["rss_mib"], 1),
        "image_mib_per_rss_mib": round(p50["image_mib"] / p50["rss_mib"], 3),
        "resume_other_node_ms_p50": round(p50["resume_other_node_ms"], 1) if count > 1 else None,
        "resume_other_node": (
            f"the image staged on another of {count} Ready nodes, its own cordoned"
            if count > 1
            else f"not measured: this cluster has {count} Ready node(s), and a resume needs another"
        ),
        "runs": [{k: round(v, 1) for k, v in run.items()} for run in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", required=True, help="the edge's URL")
    parser.add_argument("--api-key-file", required=True, help="a file holding a Warren API key")
    parser.add_argument("--kubeconfig", required=True, help="the cluster's admin kubeconfig")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--hold-mib", type=int, default=32)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    key = Path(args.api_key_file).read_text().strip()
    result = measure(args.url, key, args.kubeconfig, args.samples, args.hold_mib)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
