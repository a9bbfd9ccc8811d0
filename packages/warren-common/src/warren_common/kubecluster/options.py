"""What a throw-away control plane runs: the options, the presets, the binaries they need."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
# kwok's Stage objects. kwok v0.8.0 has no built-in stages and refuses to start without some.
NODE_STAGES = HERE / "kwok-stages.yaml"  # a node turns Ready, a pod Running and Ready at once
JOB_STAGES = HERE / "kwok-job-stages.yaml"  # a Job's running pod then Succeeds

# What deletion needs: the API server only marks a namespace Terminating (the namespace
# controller empties it), and a foreground delete waits for the garbage collector. The token
# controller fills ServiceAccount token Secrets (a control plane's kubeconfig is made from one).
DELETION_CONTROLLERS = (
    "namespace-controller",
    "garbage-collector-controller",
    "serviceaccount-token-controller",
)
# What rolls workloads out, so an installer that waits for a rollout sees one.
WORKLOAD_CONTROLLERS = (
    "serviceaccount-controller",  # a namespace's default ServiceAccount: pods without one are refused
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "statefulset-controller",
    "job-controller",
    "endpoints-controller",  # pulumi-kubernetes waits for a Service's Endpoints
    "endpointslice-controller",
)
BUILD_SCRIPT = "tools/build-cluster-binaries.sh"


@dataclass(frozen=True)
class Options:
    """etcd and kube-apiserver always; the rest on request."""

    # kube-controller-manager's --controllers; none: no controller manager at all.
    controllers: tuple[str, ...] = ()
    scheduler: bool = False
    # kwok playing the kubelet of fake nodes: they and their pods only write status.
    kwok: bool = False
    stages: tuple[Path, ...] = (NODE_STAGES,)
    # Fake nodes made (and waited for Ready) by start(); add_fake_nodes makes more later.
    nodes: tuple[str, ...] = ()
    # kwok renews a Lease per node every quarter of this, as a kubelet does; 0: none. No node
    # lifecycle controller runs to read them, and at 1,000 nodes they are real load.
    node_lease_seconds: int = 0
    prefix: str = "warren-kube-"  # of the temporary directory

    def __post_init__(self) -> None:
        if self.nodes and not self.kwok:
            raise ValueError("fake nodes need kwok (kwok=True): nothing else would make them Ready")

    def binaries(self) -> tuple[str, ...]:
        wanted = ["etcd", "kube-apiserver"]
        if self.controllers:
            wanted.append("kube-controller-manager")
        if self.scheduler:
            wanted.append("kube-scheduler")
        if self.kwok:
            wanted.append("kwok")
        return tuple(wanted)


def workloads(node: str = "kwok-node-0") -> Options:
    """Workloads roll out: deletion's and the rollout controllers, a scheduler, and one fake
    node whose pods turn Ready at once and whose Job pods then succeed. Nothing runs."""
    return Options(
        controllers=DELETION_CONTROLLERS + WORKLOAD_CONTROLLERS,
        scheduler=True,
        kwok=True,
        stages=(NODE_STAGES, JOB_STAGES),
        nodes=(node,),
        prefix="warren-apiserver-",
    )


class MissingBinariesError(RuntimeError):
    def __init__(self, bin_dir: Path, missing: list[str]) -> None:
        super().__init__(
            f"{bin_dir} lacks {', '.join(missing)}: run {BUILD_SCRIPT}, which builds them "
            "(or finds them in its cache) and prints the directory to use"
        )
        self.missing = missing


def missing_binaries(bin_dir: Path, options: Options) -> list[str]:
    return [
        name
        for name in options.binaries()
        if not ((bin_dir / name).is_file() and os.access(bin_dir / name, os.X_OK))
    ]


def require_binaries(bin_dir: Path, options: Options) -> None:
    if missing := missing_binaries(bin_dir, options):
        raise MissingBinariesError(bin_dir, missing)
