"""`warren-egress-floor`: a chained CNI plugin that enrols sandbox pods in the node's
nftables egress floor before any of their containers start.

On ADD it asks the API server whether the pod's namespace is a sandbox namespace and, if
so, adds the pod's addresses to the floor's sets; on DEL it removes them. It fails closed:
if the namespace cannot be read, the pod is treated as a sandbox pod, and if the address
cannot be enrolled, the pod's network setup fails (so the pod never runs unfloored).

Only the standard library is used: the plugin runs once per pod start, as a fresh process.
"""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

SUPPORTED = ["0.4.0", "1.0.0"]


class PluginError(Exception):
    def __init__(self, code: int, msg: str, details: str = "") -> None:
        super().__init__(msg)
        self.code, self.msg, self.details = code, msg, details


def cni_args() -> dict[str, str]:
    pairs = (item.split("=", 1) for item in os.environ.get("CNI_ARGS", "").split(";") if "=" in item)
    return dict(pairs)


def is_sandbox_namespace(conf: dict[str, Any], namespace: str) -> bool:
    """True unless the API server says the namespace lacks the sandbox label (fail closed)."""
    label = conf.get("sandboxLabel", "warren.dev/sandbox")
    api = conf["api"]
    context = ssl.create_default_context(cafile=api["ca"])
    context.load_cert_chain(api["cert"], api["key"])
    url = f"{api['server']}/api/v1/namespaces/{urllib.parse.quote(namespace)}"
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:  # noqa: S310  # our API server
            labels = json.load(response).get("metadata", {}).get("labels") or {}
    except (urllib.error.URLError, OSError, ValueError):
        return True
    return bool(labels.get(label) == "true")


def addresses(prev: dict[str, Any]) -> list[str]:
    return [str(ipaddress.ip_interface(ip["address"]).ip) for ip in prev.get("ips", [])]


def _nft(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nft", *args], capture_output=True, text=True, check=False)


def _set_for(address: str) -> str:
    return "sandbox_v4" if ipaddress.ip_address(address).version == 4 else "sandbox_v6"  # noqa: PLR2004


def enrol(table: str, ips: list[str]) -> None:
    for ip in ips:
        result = _nft("add", "element", "inet", table, _set_for(ip), "{", ip, "}")
        if result.returncode != 0:
            raise PluginError(11, f"cannot add {ip} to the egress floor", result.stderr.strip())


def release(table: str, ips: list[str]) -> None:
    for ip in ips:
        _nft("delete", "element", "inet", table, _set_for(ip), "{", ip, "}")  # gone already: fine


def main() -> int:
    command = os.environ.get("CNI_COMMAND", "")
    if command == "VERSION":
        print(json.dumps({"cniVersion": "1.0.0", "supportedVersions": SUPPORTED}))
        return 0
    conf = json.load(sys.stdin)
    state = Path(conf.get("stateDir", "/var/lib/warren/egress-floor"))
    container = os.environ.get("CNI_CONTAINERID", "")
    record = state / f"{container}.json"
    table = conf.get("table", "warren_floor")
    try:
        if command == "ADD":
            prev = conf.get("prevResult")
            if not prev:
                raise PluginError(7, "warren-egress-floor must be chained after an IPAM-bearing plugin")
            namespace = cni_args().get("K8S_POD_NAMESPACE", "")
            ips = addresses(prev)
            if not namespace or is_sandbox_namespace(conf, namespace):
                enrol(table, ips)
                state.mkdir(parents=True, exist_ok=True)
                record.write_text(json.dumps({"namespace": namespace, "ips": ips}))
            print(json.dumps(prev))
        elif command == "DEL":
            if record.exists():
                release(table, json.loads(record.read_text())["ips"])
                record.unlink()
        elif command == "CHECK":
            if record.exists():
                for ip in json.loads(record.read_text())["ips"]:
                    got = _nft("get", "element", "inet", table, _set_for(ip), "{", ip, "}")
                    if got.returncode != 0:
                        raise PluginError(11, f"{ip} is missing from the egress floor")
        else:
            raise PluginError(4, f"unknown CNI_COMMAND {command!r}")
    except PluginError as err:
        print(
            json.dumps(
                {
                    "cniVersion": conf.get("cniVersion", "1.0.0"),
                    "code": err.code,
                    "msg": err.msg,
                    "details": err.details,
                }
            )
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
