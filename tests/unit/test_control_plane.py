"""The local control plane's files, `warren sandbox` finding the local deployment, and
`cluster down` stopping the control plane before the node it uses (no cluster needed)."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from warren_common.pki import Leaf

from warren.cli import main
from warren.cluster.components import Component
from warren.cluster.local import ClusterContext, LocalCluster
from warren.cluster.process import ProcessSpec, Supervisor, proc_start_time
from warren.config import ClusterConfig, ConfigError, parse_config
from warren.controlplane import access
from warren.controlplane.local import PROCESS, layout

SLEEP = (sys.executable, "-c", "import time; time.sleep(300)")


def test_ports_must_differ() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.control_plane: edge_port and api_port must differ"):
        parse_config({"cluster": {"control_plane": {"edge_port": 9000, "api_port": 9000}}})


def test_the_controller_kubeconfig_is_the_admins_cluster_with_the_token_only(tmp_path: Path) -> None:
    admin = tmp_path / "admin.kubeconfig"
    cluster = {"server": "https://127.0.0.1:6443", "certificate-authority-data": "Q0E="}
    admin.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "warren", "cluster": cluster}],
                "users": [{"name": "admin", "user": {"client-key-data": "S0VZ"}}],
                "contexts": [{"name": "admin@warren", "context": {"cluster": "warren", "user": "admin"}}],
                "current-context": "admin@warren",
            }
        )
    )
    doc = yaml.safe_load(access.kubeconfig_for_token(admin, "the-token"))
    assert doc["clusters"][0]["cluster"] == cluster
    assert doc["users"] == [{"name": "warren-controller", "user": {"token": "the-token"}}]
    assert "S0VZ" not in json.dumps(doc)


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[str, str]]

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization", "")))
        body = json.dumps({"items": [], "next_cursor": None}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def api() -> Iterator[tuple[str, list[tuple[str, str]]]]:
    seen: list[tuple[str, str]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()
    server.server_close()


def test_sandbox_commands_default_to_the_local_deployment(
    tmp_path: Path, api: tuple[str, list[tuple[str, str]]]
) -> None:
    url, seen = api
    files = layout(tmp_path / "cluster")
    files.root.mkdir(parents=True)
    files.url.write_text(url + "\n")
    files.api_key.write_text("wk_local\n")
    env = {"WARREN_HOME": str(tmp_path), "WARREN_URL": None, "WARREN_API_KEY": None}
    runner = CliRunner()

    result = runner.invoke(main, ["sandbox", "list"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.split() == ["ID", "PHASE", "CREATED", "IMAGE"]
    assert seen[-1][0].startswith("/v1/sandboxes")
    assert seen[-1][1] == "Bearer wk_local"

    # The environment, then the flags, win over the local deployment.
    result = runner.invoke(main, ["sandbox", "list"], env={**env, "WARREN_API_KEY": "wk_env"})
    assert (result.exit_code, seen[-1][1]) == (0, "Bearer wk_env")
    result = runner.invoke(main, ["sandbox", "--api-key", "wk_flag", "--json", "list"], env=env)
    assert (result.exit_code, result.output, seen[-1][1]) == (0, "", "Bearer wk_flag")


def test_sandbox_commands_without_a_deployment_say_what_is_missing(tmp_path: Path) -> None:
    env = {"WARREN_HOME": str(tmp_path), "WARREN_URL": None, "WARREN_API_KEY": None}
    result = CliRunner().invoke(main, ["sandbox", "list"], env=env)
    assert result.exit_code != 0
    assert "WARREN_URL" in str(result.exception) + result.output


class _Node:
    """A node whose teardown notes whether the control plane was still running."""

    name = "fake"

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.control_plane_running_at_teardown: bool | None = None

    def claim(self, ctx: ClusterContext) -> None:
        pass

    def leaves(self, ctx: ClusterContext) -> Sequence[Leaf]:
        return []

    def prepare(self, ctx: ClusterContext) -> None:
        pass

    def components(self, ctx: ClusterContext) -> Sequence[Component]:
        return []

    def after_up(self, ctx: ClusterContext) -> None:
        pass

    def teardown(self, ctx: ClusterContext, wipe: bool) -> list[str]:
        self.control_plane_running_at_teardown = self.supervisor.running(PROCESS) is not None
        return []


def test_cluster_down_stops_the_control_plane_before_the_node(tmp_path: Path) -> None:
    node = _Node(Supervisor(tmp_path))
    config = ClusterConfig(advertise_address="127.0.0.1")
    cluster = LocalCluster(config, tmp_path, Path("/nonexistent"), nodes=[node])
    record = cluster.supervisor.start(ProcessSpec(PROCESS, SLEEP))
    stopped = cluster.down()
    assert PROCESS in stopped
    assert node.control_plane_running_at_teardown is False
    assert cluster.supervisor.running(PROCESS) is None
    assert proc_start_time(record.pid) is None
