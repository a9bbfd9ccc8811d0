"""GET /sandboxes/{id}/metrics with the pinned SDK through the real edge: the control plane
reads the samples the sandbox's own agent keeps (the real agent, built here, playing the pod
at a loopback address as in test_e2b_api.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from api_stack import NAMESPACE, Stack, StandIn
from e2b import Sandbox
from e2b.exceptions import SandboxNotFoundException
from test_e2b_api import agent_binary, e2b_stack, new_org, record, run_pod
from warren_control.podspec import AGENT_CONTAINER, pod_name

pytest_plugins = ["api_fixtures"]
__all__ = ["agent_binary", "e2b_stack"]  # fixtures, used by name


def test_metrics_are_the_agent_s_samples(
    e2b_stack: Stack, standin: StandIn, agent_binary: Path, tmp_path: Path
) -> None:
    org = new_org(e2b_stack)
    sandbox = Sandbox.create("base", **org.opts)
    # No pod yet, so nothing measured yet.
    assert sandbox.get_metrics() == []
    pod = run_pod(e2b_stack, standin, agent_binary, tmp_path, sandbox.sandbox_id)
    kept = record(e2b_stack, sandbox.sandbox_id)
    name = pod_name(standin.get(kept.object_name)["metadata"]["uid"])
    standin.pods[(NAMESPACE, name)]["spec"] = {"initContainers": [{"name": AGENT_CONTAINER}]}
    try:
        samples = sandbox.get_metrics()
        assert len(samples) >= 1
        latest = samples[-1]
        assert latest.cpu_count >= 1 and 0.0 <= latest.cpu_used_pct <= 100.0
        assert 0 < latest.mem_used <= latest.mem_total
        assert 0 < latest.disk_used <= latest.disk_total
        assert abs(latest.timestamp - datetime.now(UTC)) < timedelta(seconds=30)
        # A range before the sandbox existed holds nothing; one around now holds the sample.
        long_ago = datetime.now(UTC) - timedelta(days=1)
        assert sandbox.get_metrics(start=long_ago - timedelta(hours=1), end=long_ago) == []
        around = sandbox.get_metrics(start=latest.timestamp - timedelta(seconds=1))
        assert latest.timestamp in [s.timestamp for s in around]
        # Another organization reads none of it.
        stranger = new_org(e2b_stack)
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_metrics(sandbox.sandbox_id, **stranger.opts)
        # Paused: no processes, so nothing is measured.
        sandbox.pause()
        assert Sandbox.get_metrics(sandbox.sandbox_id, **org.opts) == []
    finally:
        pod.process.terminate()
        pod.process.wait(timeout=10)
