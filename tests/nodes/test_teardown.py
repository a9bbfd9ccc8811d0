"""Last in the nodes tier: `warren cluster down` leaves nothing of the joined nodes on the
host: no network namespace, link, route, mount namespace or cgroup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from warren.node.joined import MOUNT_NS_DIR, Site

pytestmark = pytest.mark.nodes

WARREN = str(Path(sys.executable).parent / "warren")


def test_down_leaves_nothing_of_the_nodes_on_the_host(sites: list[Site]) -> None:
    down = subprocess.run(
        [WARREN, "cluster", "down", "--config", os.environ["WARREN_TEST_CONFIG"]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert down.returncode == 0, down.stderr[-2000:]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    routes = subprocess.run(["ip", "route"], capture_output=True, text=True, check=True).stdout
    for site in sites:
        assert site.netns not in netns
        assert (
            subprocess.run(["ip", "link", "show", site.link], capture_output=True, check=False).returncode
            != 0
        )
        assert site.pod_subnet not in routes
        assert not site.mount_ns.exists()
        assert not list(Path("/sys/fs/cgroup").glob(f"*/{site.cgroup}"))
    # No process of theirs: nothing names the cluster's state on its command line.
    state = os.environ["WARREN_HOME"]
    left = subprocess.run(["pgrep", "-fa", state], capture_output=True, text=True, check=False).stdout
    assert not [line for line in left.splitlines() if "pytest" not in line], left
    assert not [p for p in MOUNT_NS_DIR.iterdir() if any(p.name.startswith(f"{s.name}-") for s in sites)]
