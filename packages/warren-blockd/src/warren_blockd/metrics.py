"""Prometheus metrics of the daemon, in one registry served at /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()

READ_BYTES = Counter("blockd_read_bytes", "Bytes served to workspace devices", registry=REGISTRY)
WRITE_BYTES = Counter("blockd_write_bytes", "Bytes written to workspace devices", registry=REGISTRY)
CACHE_HITS = Counter(
    "blockd_chunk_cache_hits", "Chunk reads served from the node", ["tier"], registry=REGISTRY
)
CHUNK_FETCHES = Counter("blockd_chunk_fetches", "Chunks faulted in from object storage", registry=REGISTRY)
CORRUPT_CHUNKS = Counter(
    "blockd_corrupt_chunks", "Chunks refused because they failed verification", ["where"], registry=REGISTRY
)
FETCH_SECONDS = Histogram("blockd_chunk_fetch_seconds", "Time to fault in one chunk", registry=REGISTRY)
FLUSHES = Counter("blockd_flushes", "Batches sealed on node disk (local receipts)", registry=REGISTRY)
BACKLOG_BYTES = Gauge(
    "blockd_backlog_bytes", "Spooled bytes not yet replicated", ["workspace"], registry=REGISTRY
)
REPLICATED_SEQ = Gauge(
    "blockd_replicated_seq", "Newest log record confirmed in storage", ["workspace"], registry=REGISTRY
)
BACKPRESSURE_WAITS = Counter(
    "blockd_backpressure_waits", "Times a writer waited at the backlog bound", registry=REGISTRY
)
SPLIT_BRAIN = Counter("blockd_split_brain", "Lanes stopped because another writer won", registry=REGISTRY)
MOUNTED = Gauge("blockd_mounted_workspaces", "Workspaces mounted on this node", registry=REGISTRY)
CONSOLIDATIONS = Counter("blockd_consolidations", "Manifests consolidated", registry=REGISTRY)
FORK_FREEZES = Counter(
    "blockd_fork_batches",
    "Forks made, each one settle of the source (and freeze, if mounted)",
    registry=REGISTRY,
)
FORK_CHILDREN = Counter("blockd_fork_children", "Children those forks made or tried", registry=REGISTRY)


def exposition() -> bytes:
    return generate_latest(REGISTRY)
