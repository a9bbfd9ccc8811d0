"""Leader election on a coordination.k8s.io Lease, so that several replicas of the control
plane are safe: every replica serves the edge and the API, one at a time runs what writes
on its own (the controller, the status mirror, the reaper).

The Kubernetes client's own elector does the work (LeaseLock). A replica that cannot renew
its lease within the deadline stops at once (the process exits and its pod restarts), as
client-go's controllers do: another replica may already be leading.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from kubernetes import client
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from warren_control.kube import Kube

LOG = logging.getLogger("warren_control.leader")
# The elector reports every retry of a follower at INFO.
logging.getLogger("leaderelection").setLevel(logging.WARNING)
EXIT_LOST = 3  # the exit status of a replica that lost its lease


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str
    name: str = "warren-control"
    # The pod's name (POD_NAME from the downward API), else the host name.
    identity: str = ""
    lease_seconds: int = 15
    renew_deadline_seconds: int = 10
    retry_seconds: int = 2

    def who(self) -> str:
        return self.identity or os.environ.get("POD_NAME") or socket.gethostname()


def _exit_lost() -> None:
    LOG.error("lost the lease: stopping, another replica leads now")
    os._exit(EXIT_LOST)  # no cleanup may run work this replica no longer owns


def lead(kube: Kube, settings: LeaseSettings, on_lost: Callable[[], None] = _exit_lost) -> None:
    """Block until this replica holds the lease, then keep renewing it in a thread; call
    `on_lost` if a renewal misses the deadline."""
    lock = LeaseLock(settings.name, settings.namespace, settings.who())  # type: ignore[no-untyped-call]
    # The lock's own client would read the library's global configuration.
    lock.api_instance = client.CoordinationV1Api(kube.api)
    leading = threading.Event()
    config = electionconfig.Config(  # type: ignore[no-untyped-call]
        lock,
        lease_duration=settings.lease_seconds,
        renew_deadline=settings.renew_deadline_seconds,
        retry_period=settings.retry_seconds,
        onstarted_leading=leading.set,
        onstopped_leading=on_lost,
    )
    election = leaderelection.LeaderElection(config)  # type: ignore[no-untyped-call]
    threading.Thread(target=election.run, name="lease", daemon=True).start()
    LOG.info("waiting for lease %s/%s as %s", settings.namespace, settings.name, settings.who())
    leading.wait()
    LOG.info("leading as %s", settings.who())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--leader-election",
        action="store_true",
        help="run only while this replica holds the lease (several replicas may run)",
    )
    parser.add_argument("--lease-namespace", default="warren-system", help="the Lease's namespace")
    parser.add_argument("--lease-name", default=LeaseSettings.name, help="the Lease's name")
    parser.add_argument(
        "--lease-identity", default="", help="this replica's name (default: POD_NAME, else the host name)"
    )


def lead_if_asked(args: argparse.Namespace) -> None:
    """With --leader-election: wait until this replica holds the lease."""
    if args.leader_election:
        settings = LeaseSettings(args.lease_namespace, args.lease_name, args.lease_identity)
        lead(Kube.connect(args.kubeconfig), settings)
