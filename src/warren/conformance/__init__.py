"""The conformance suite: proves the isolation floor against any cluster's real API server.

Run it with `warren conformance --kubeconfig PATH`. Tests read the cluster through the
`kube` fixture and leave nothing behind: every object they make lives in a namespace or
under a name that the suite creates and deletes itself.
"""
