"""A throw-away Kubernetes control plane for tests, from the real binaries
(tools/build-cluster-binaries.sh): etcd and kube-apiserver, and as each test needs them
kube-controller-manager with the controllers it names, kube-scheduler, and kwok playing the
kubelet of fake nodes (their pods only change status; nothing runs).

Its own CA, every file in one temporary directory, every server on free loopback ports (a
start that lost a port to another process is tried again on new ones), every process in a
session of its own that dies with the test process (PR_SET_PDEATHSIG). Needs the
`kubecluster` extra (cryptography, for the CA).
"""

from warren_common.kubecluster.client import ApiError, Client
from warren_common.kubecluster.cluster import KubeCluster
from warren_common.kubecluster.commands import Obj, node_names
from warren_common.kubecluster.options import (
    DELETION_CONTROLLERS,
    JOB_STAGES,
    NODE_STAGES,
    WORKLOAD_CONTROLLERS,
    MissingBinariesError,
    Options,
    missing_binaries,
    workloads,
)
from warren_common.kubecluster.processes import PortTakenError, Process

__all__ = [
    "DELETION_CONTROLLERS",
    "JOB_STAGES",
    "NODE_STAGES",
    "WORKLOAD_CONTROLLERS",
    "ApiError",
    "Client",
    "KubeCluster",
    "MissingBinariesError",
    "Obj",
    "Options",
    "PortTakenError",
    "Process",
    "missing_binaries",
    "node_names",
    "workloads",
]
