"""Cold path benchmark: how long a sandbox's pod takes to be Ready when made directly, with
the kubelet learning of container starts and exits from its relist once a second (generic
PLEG, the default) and from containerd's events (evented PLEG, `node.evented_pleg`), each
measured on a throw-away cluster brought up with that setting in the same run. Writes
bench/results/coldpath.json.

    python bench/coldpath.py --kubeconfig K --image I --agent-image A --base-image B \
        --variant NAME --into F
    python bench/coldpath.py --finish F

- plain_pod_ready_ms_p50: a sandbox's pod without the agent (runsc, the CNI, the container).
- agent_pod_ready_ms_p50: the pod as the controller makes it: the agent's init container
  copies it in and a postStart hook starts it; Ready once it answers.
- agent_in_image_pod_ready_ms_p50: the same of the base template's image, built with the
  agent's layer, which starts it from the image (no init container).
- For each variant; then each evented figure over its generic one.

Run it through `make bench-coldpath`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from control import direct_pod_ms, percentile, write_result
from warren_control.kube import Kube
from warren_control.podspec import PodOptions

RESULTS = Path(__file__).parent / "results" / "coldpath.json"
# A sandbox's default size, and the deployment's shares of it.
SPEC = {"resources": {"cpu": "1", "memory": "1Gi"}}
SHARES = {"cpu_request_percent": 1, "memory_request_percent": 10}


def measure(kube: Kube, image: str, agent_image: str, base_image: str, samples: int) -> dict[str, float]:
    token = {"agentTokenSha256": hashlib.sha256(b"bench").hexdigest()}
    kinds = {
        "plain": (image, {"spec": SPEC, "options": PodOptions(**SHARES)}),
        "agent": (
            image,
            {"spec": {**SPEC, **token}, "options": PodOptions(agent_image=agent_image, **SHARES)},
        ),
        "agent_in_image": (
            base_image,
            {
                "spec": {**SPEC, **token},
                "options": PodOptions(
                    agent_image=agent_image, agent_in_images=frozenset({base_image}), **SHARES
                ),
            },
        ),
    }
    for pod_image, pod in kinds.values():
        direct_pod_ms(kube, pod_image, **pod)  # unmeasured: first-pod costs
    found: dict[str, list[float]] = {name: [] for name in kinds}
    for index in range(samples):
        print(f"pods {index + 1}/{samples}", file=sys.stderr, flush=True)
        for name, (pod_image, pod) in kinds.items():
            found[name].append(direct_pod_ms(kube, pod_image, **pod))
    result: dict[str, float] = {}
    for name, values in found.items():
        result[f"{name}_pod_ready_ms_p50"] = round(statistics.median(values), 1)
        result[f"{name}_pod_ready_ms_p99"] = round(percentile(values, 0.99), 1)
    return result


def finish(path: Path) -> dict[str, Any]:
    """The variants' figures, and each evented one over its generic one."""
    variants: dict[str, dict[str, float]] = json.loads(path.read_text())
    result: dict[str, Any] = {"variants": variants}
    generic, evented = variants.get("generic"), variants.get("evented")
    if generic and evented:
        for name in ("plain_pod_ready_ms_p50", "agent_pod_ready_ms_p50", "agent_in_image_pod_ready_ms_p50"):
            result[f"evented_over_generic_{name.removesuffix('_ms_p50')}"] = round(
                evented[name] / generic[name], 3
            )
    if generic:
        result["agent_in_image_over_agent"] = round(
            generic["agent_in_image_pod_ready_ms_p50"] / generic["agent_pod_ready_ms_p50"], 3
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig")
    parser.add_argument("--image", help="an image the node has")
    parser.add_argument("--agent-image", help="the agent image the node has")
    parser.add_argument(
        "--base-image", help="the base template's image the node has (with the agent's layer)"
    )
    parser.add_argument("--variant", help="the name this cluster's setting is recorded under")
    parser.add_argument("--into", type=Path, help="the file the variants' figures collect in")
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--finish", type=Path, help="write the results from the collected variants")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.finish:
        write_result(args.output, finish(args.finish))
        return
    if not (
        args.kubeconfig and args.image and args.agent_image and args.base_image and args.variant and args.into
    ):
        parser.error(
            "give --kubeconfig, --image, --agent-image, --base-image, --variant and --into (or --finish)"
        )
    figures = measure(
        Kube.connect(args.kubeconfig), args.image, args.agent_image, args.base_image, args.samples
    )
    collected = json.loads(args.into.read_text()) if args.into.exists() else {}
    collected[args.variant] = figures
    args.into.write_text(json.dumps(collected))
    print(json.dumps({args.variant: figures}), file=sys.stderr)


if __name__ == "__main__":
    main()
