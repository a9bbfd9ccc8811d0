"""The existing cluster of the multi-host test: a throw-away control plane
(warren_common.kubecluster, its `workloads` preset: etcd, kube-apiserver, the controllers that
deletion and rollouts need, a scheduler) started inside the control host's namespaces, its admin
kubeconfig at /etc/kubernetes/admin.conf there, as on a kubeadm host. Its one node is kwok's,
named like the lab's node host: Warren's workloads are scheduled there and roll out (their pods
turn Ready, the install Job's pod succeeds), and nothing runs.

    python run_control_plane.py BIN_DIR NODE_NAME    # prints "ready" once up, serves until SIGTERM
"""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path

from warren_common.kubecluster import KubeCluster, workloads

ADMIN_KUBECONFIG = Path("/etc/kubernetes/admin.conf")


def main() -> None:
    with KubeCluster(Path(sys.argv[1]), workloads(node=sys.argv[2])) as cluster:
        ADMIN_KUBECONFIG.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cluster.admin_kubeconfig, ADMIN_KUBECONFIG)
        ADMIN_KUBECONFIG.chmod(0o600)
        print("ready", flush=True)
        signal.pause()  # SIGTERM ends it (KubeCluster turns it into SystemExit and cleans up)


if __name__ == "__main__":
    main()
