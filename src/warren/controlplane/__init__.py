"""The control plane (packages/warren-control) deployed on the local cluster."""
