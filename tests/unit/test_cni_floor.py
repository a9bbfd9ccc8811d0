import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from warren.node import cni_floor


def test_cni_args_parsed() -> None:
    os.environ["CNI_ARGS"] = "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=p"
    try:
        assert cni_floor.cni_args()["K8S_POD_NAMESPACE"] == "team-a"
    finally:
        del os.environ["CNI_ARGS"]


def test_addresses_from_previous_result() -> None:
    prev = {"ips": [{"address": "10.244.0.7/24"}, {"address": "fd00::7/64"}]}
    assert cni_floor.addresses(prev) == ["10.244.0.7", "fd00::7"]


def test_unreadable_namespace_counts_as_sandbox(tmp_path: Path) -> None:
    """Fail closed: with no API server to ask, the pod is floored."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket closes
    make_client_files(tmp_path)
    conf: dict[str, object] = {
        "api": {
            "server": f"https://127.0.0.1:{port}",
            "ca": str(tmp_path / "ca.crt"),
            "cert": str(tmp_path / "c.crt"),
            "key": str(tmp_path / "c.key"),
        }
    }
    assert cni_floor.is_sandbox_namespace(conf, "kube-system") is True


def make_client_files(directory: Path) -> None:
    from warren_common.pki import Leaf, Pki

    pki = Pki(directory)
    pki.ensure_ca("ca", "ca")
    pki.ensure_leaf(Leaf("c", "ca", "client"))


def run_plugin(command: str, conf: dict[str, object], env: dict[str, str] | None = None) -> tuple[int, dict]:
    result = subprocess.run(
        [sys.executable, "-m", "warren.node.cni_floor"],
        input=json.dumps(conf),
        capture_output=True,
        text=True,
        env={**os.environ, "CNI_COMMAND": command, **(env or {})},
        check=False,
    )
    return result.returncode, json.loads(result.stdout) if result.stdout.strip() else {}


def test_version_command() -> None:
    code, out = run_plugin("VERSION", {})
    assert code == 0 and "1.0.0" in out["supportedVersions"]


def test_add_without_previous_result_is_an_error(tmp_path: Path) -> None:
    code, out = run_plugin(
        "ADD", {"cniVersion": "1.0.0", "stateDir": str(tmp_path)}, {"CNI_CONTAINERID": "c1"}
    )
    assert code == 1 and out["code"] == 7 and "chained" in out["msg"]


def test_del_of_unknown_container_succeeds(tmp_path: Path) -> None:
    code, _ = run_plugin("DEL", {"cniVersion": "1.0.0", "stateDir": str(tmp_path)}, {"CNI_CONTAINERID": "c2"})
    assert code == 0
