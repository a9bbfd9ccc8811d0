"""Prometheus metrics of the daemon, in one registry served at /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

REGISTRY = CollectorRegistry()

# Every state a VM record passes through; a gauge per state, zero when none is in it.
STATES = ("booting", "running", "snapshotting", "snapshotted", "restoring", "stopping")
# Wide: a TCG cold boot on a busy host takes seconds, a KVM restore tens of milliseconds.
BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

VMS = Gauge("forkd_vms", "VMs this daemon holds, by state", ["state"], registry=REGISTRY)
TEMPLATES = Gauge("forkd_templates", "Templates registered or built", registry=REGISTRY)
SNAPSHOTS = Gauge("forkd_snapshots", "Snapshots on node disk", registry=REGISTRY)
BOOT_SECONDS = Histogram(
    "forkd_boot_seconds", "Cold boot: QEMU start to the agent answering", buckets=BUCKETS, registry=REGISTRY
)
SNAPSHOT_SECONDS = Histogram(
    "forkd_snapshot_seconds",
    "Snapshot: pause, device state saved, files linked",
    buckets=BUCKETS,
    registry=REGISTRY,
)
CHILD_SECONDS = Histogram(
    "forkd_branch_child_seconds",
    "One child: QEMU start to reseeded and ready for a command",
    buckets=BUCKETS,
    registry=REGISTRY,
)
BRANCH_SECONDS = Histogram(
    "forkd_branch_seconds", "One branch request, all its children", buckets=BUCKETS, registry=REGISTRY
)
CHILDREN = Counter(
    "forkd_branch_children", "Children started by branch requests", ["result"], registry=REGISTRY
)
EXECS = Counter("forkd_execs", "Commands run through guest agents", ["result"], registry=REGISTRY)
REFUSED_GENERATIONS = Counter(
    "forkd_generation_mismatches",
    "Branches refused because the disk is not the snapshot's generation",
    registry=REGISTRY,
)


def count_states(states: list[str]) -> None:
    for state in STATES:
        VMS.labels(state).set(states.count(state))


def exposition() -> bytes:
    return generate_latest(REGISTRY)
