"""warren-blockd: the workspace layer (chunks, manifests, replication, serving)."""

__version__ = "0.1.0"
