"""The local cluster built from pinned sources: PKI, processes, components, lifecycle."""
