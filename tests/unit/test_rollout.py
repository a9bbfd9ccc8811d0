"""The rollout rules `warren platform ready` waits by (src/warren/rollout.py), on objects as
the API server returns them: kubectl's rules per kind, and which pods can never start."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from warren.config import parse_config
from warren.rollout import HOPELESS, INSTALL, _ready, workloads


def meta(generation: int = 2) -> client.V1ObjectMeta:
    return client.V1ObjectMeta(name="x", generation=generation)


def deployment(**status: Any) -> client.V1Deployment:
    return client.V1Deployment(
        metadata=meta(),
        spec=client.V1DeploymentSpec(replicas=2, selector={}, template={}),
        status=client.V1DeploymentStatus(**status),
    )


@pytest.mark.parametrize(
    ("status", "ready"),
    [
        ({"observed_generation": 2, "replicas": 2, "updated_replicas": 2, "available_replicas": 2}, True),
        # The controller has not seen the newest spec yet.
        ({"observed_generation": 1, "replicas": 2, "updated_replicas": 2, "available_replicas": 2}, False),
        # An old replica still runs beside the new ones (a rollout under way).
        ({"observed_generation": 2, "replicas": 3, "updated_replicas": 2, "available_replicas": 3}, False),
        ({"observed_generation": 2, "replicas": 2, "updated_replicas": 2, "available_replicas": 1}, False),
    ],
)
def test_a_deployment_is_ready_when_every_replica_runs_the_newest_spec(
    status: dict[str, int], ready: bool
) -> None:
    assert _ready("Deployment", deployment(**status)) is ready


def test_a_daemonset_needs_every_scheduled_pod_updated_and_available() -> None:
    def daemonset(desired: int, updated: int, available: int) -> client.V1DaemonSet:
        return client.V1DaemonSet(
            metadata=meta(),
            spec=client.V1DaemonSetSpec(selector={}, template={}),
            status=client.V1DaemonSetStatus(
                observed_generation=2,
                desired_number_scheduled=desired,
                updated_number_scheduled=updated,
                number_available=available,
                current_number_scheduled=desired,
                number_misscheduled=0,
                number_ready=available,
            ),
        )

    assert _ready("DaemonSet", daemonset(1, 1, 1))
    assert not _ready("DaemonSet", daemonset(1, 0, 1))  # the old pod still serves
    assert not _ready("DaemonSet", daemonset(0, 0, 0))  # no sandbox node at all


def test_the_install_job_is_done_once_it_succeeded() -> None:
    done = client.V1Job(metadata=meta(), status=client.V1JobStatus(succeeded=1))
    assert _ready("Job", done)
    assert not _ready("Job", client.V1Job(metadata=meta(), status=client.V1JobStatus(active=1)))


def test_what_is_waited_for_follows_the_configuration() -> None:
    embedded = parse_config({})
    names = [(w.kind, w.name) for w in workloads(embedded)]
    assert names[:2] == [("StatefulSet", "warren-objects"), ("StatefulSet", "warren-postgres")]
    assert ("Job", INSTALL) in names
    external = parse_config(
        {"services": {"stores": "external", "object_store_endpoint": "https://s3.example"}}
    )
    assert "StatefulSet" not in {w.kind for w in workloads(external)}


def test_only_reasons_no_wait_fixes_are_hopeless() -> None:
    assert {"ErrImageNeverPull", "InvalidImageName"} == HOPELESS
    assert "ImagePullBackOff" not in HOPELESS and "CrashLoopBackOff" not in HOPELESS
