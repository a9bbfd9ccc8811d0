"""A benchmark's throw-away cluster beside the deployed platform leaves the deployed node's
egress floor alone.

`make bench-runtime` starts a cluster of its own on this machine. Its node would share the
deployed node's bridge, CNI network, kube-proxy rules and the nftables table of the egress
floor, so it refuses to start and names them, and its teardown (which runs anyway) must not
remove them: the sandboxes already running keep their floor. Runs against the platform
tests/cluster/run.sh deployed, before test_local_cluster.py takes it down.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from test_control_plane import SMALL, ok, read, sandbox
from test_killed_node import created_on

from warren.config import load_config
from warren.conformance.kube import busybox_pod, exec_in, running_pod, unique
from warren.kube import api_client
from warren.node.images import busybox_image
from warren.node.layout import FLOOR_TABLE

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]


def _nft(*args: str) -> Any:
    result = subprocess.run(["nft", "-j", *args], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"nft {' '.join(args)}: {result.stderr}"
    return json.loads(result.stdout)["nftables"]


def floor_rules() -> list[Any]:
    """The floor's table without the members of its sets: its chains, rules and sets."""
    items = _nft("list", "table", "inet", FLOOR_TABLE)
    for item in items:
        if "set" in item:
            item["set"].pop("elem", None)
    return items


def enrolled() -> set[str]:
    elems = _nft("list", "set", "inet", FLOOR_TABLE, "sandbox_v4")[1]["set"].get("elem", [])
    return {e if isinstance(e, str) else json.dumps(e) for e in elems}


def bridge_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, check=False).returncode == 0


def test_bench_runtime_beside_the_deployed_platform_leaves_its_floor(
    env: dict[str, str], state: Path, first_node: str
) -> None:
    """Also a sandbox of the platform's own, with its workspace, on the same node: its
    network and its workspace serve on throughout."""
    config = load_config(Path(env["WARREN_TEST_CONFIG"]))
    joined = [n.name for n in config.cluster.joined_nodes]
    box = created_on(env, state, first_node, joined, *SMALL, busybox_image(), "--", "sleep", "86400")
    written = secrets.token_bytes(1 << 20)
    try:
        ok(sandbox(env, "write-file", box, "/workspace/before.bin", stdin=written))
        beside_the_bench(state, first_node)
        assert read(env, box, "/workspace/before.bin") == written
        ok(sandbox(env, "write-file", box, "/workspace/after.txt", stdin=b"after the benchmark\n"))
        assert read(env, box, "/workspace/after.txt") == b"after the benchmark\n"
    finally:
        sandbox(env, "delete", "--no-wait", box)


def beside_the_bench(state: Path, first_node: str) -> None:
    """A plain sandbox pod on the node keeps its floor while `make bench-runtime` refuses to
    start a cluster beside the node, and still answers."""
    kubeconfig = state / "admin.kubeconfig"
    core = client.CoreV1Api(api_client(kubeconfig))
    namespace = "warren-sandboxes"
    name = unique("beside")
    # On the node in the host's network: the one whose names the benchmark's would share.
    pod = busybox_pod(name, busybox_image())
    pod["spec"]["nodeName"] = first_node
    running_pod(core, namespace, pod)
    try:
        ip = core.read_namespaced_pod(name, namespace).status.pod_ip
        rules, members = floor_rules(), enrolled()
        assert ip in members, f"the sandbox pod {ip} is not enrolled in the floor: {members}"

        bench_env = {k: v for k, v in os.environ.items() if k != "WARREN_HOME"}
        bench = subprocess.run(
            ["make", "-s", "bench-runtime"],
            cwd=REPO,
            env=bench_env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        output = bench.stdout + bench.stderr
        assert bench.returncode != 0, f"the benchmark's cluster started beside a deployed node:\n{output}"
        assert "a Warren node already runs in this network namespace" in output, output
        assert f"inet {FLOOR_TABLE}" in output and str(state) in output, output

        assert floor_rules() == rules, "the benchmark changed the deployed node's floor"
        assert ip in enrolled(), "the running sandbox lost its enrolment in the floor"
        assert bridge_exists("warren0")
        assert exec_in(core, namespace, name, ["true"]).code == 0
    finally:
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
