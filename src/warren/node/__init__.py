"""The local cluster's node: containerd with runc and gVisor, CNI, kubelet, kube-proxy
and cluster DNS, plugged into `LocalCluster` as a `NodeProvider`."""
