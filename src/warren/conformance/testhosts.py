"""Test hosts for the egress and gateway tests: one network namespace per address, on this
machine.

Each host answers HTTP on its address with a line naming itself, or, made with a certificate,
HTTPS with what it received (and keeps a line of JSON for each request in its log). It is
created, with the route to it, before any probe; if it cannot be created the test fails
rather than probe an address that nothing local owns.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

PORT = 8080
SERVER = (  # plain TCPServer: HTTPServer would look its own address up in DNS first
    "import http.server, socketserver, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = ('warren-test-host ' + sys.argv[1] + '\\n').encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *a): pass\n"
    "socketserver.TCPServer.allow_reuse_address = True\n"
    "socketserver.TCPServer((sys.argv[1], int(sys.argv[2])), H).serve_forever()\n"
)
# An HTTPS host that answers with what it received: ADDRESS PORT LOG CERT KEY.
ECHO_SERVER = (
    "import http.server, json, socketserver, ssl, sys\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def _echo(self):\n"
    "        size = int(self.headers.get('Content-Length') or 0)\n"
    "        seen = {'method': self.command, 'path': self.path, 'headers': dict(self.headers),\n"
    "                'body': self.rfile.read(size).decode(errors='replace')}\n"
    "        with open(sys.argv[3], 'a') as log: log.write(json.dumps(seen) + '\\n')\n"
    "        body = json.dumps(seen).encode()\n"
    "        self.send_response(200); self.send_header('Content-Type', 'application/json')\n"
    "        self.send_header('Content-Length', str(len(body))); self.end_headers(); self.wfile.write(body)\n"
    "    do_GET = do_POST = _echo\n"
    "    def log_message(self, *a): pass\n"
    "socketserver.ThreadingTCPServer.allow_reuse_address = True\n"
    "server = socketserver.ThreadingTCPServer((sys.argv[1], int(sys.argv[2])), H)\n"
    "tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); tls.load_cert_chain(sys.argv[4], sys.argv[5])\n"
    "server.socket = tls.wrap_socket(server.socket, server_side=True)\n"
    "server.serve_forever()\n"
)


def _ip(*args: str, netns: str | None = None) -> str:
    argv = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result.stdout


def covered_by_a_route(address: str) -> str | None:
    """A route of this machine (other than the default) that already covers `address`."""
    target = ipaddress.ip_address(address)
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all")):
        dst = str(route.get("dst", ""))
        if dst in ("default", "") or route.get("type") in ("local", "broadcast"):
            continue
        try:
            if target in ipaddress.ip_network(dst if "/" in dst else f"{dst}/32", strict=False):
                return dst
        except ValueError:
            continue
    return None


@dataclass
class ProbeHost:
    address: str
    netns: str
    host_link: str
    server: subprocess.Popen[bytes] | None = None
    port: int = PORT
    log: Path | None = None  # an HTTPS echo host's requests, a JSON line each

    @property
    def url(self) -> str:
        return f"http://{self.address}:{PORT}/"

    def seen(self) -> list[dict[str, object]]:
        """What an HTTPS echo host received, oldest first."""
        if self.log is None or not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line]

    @classmethod
    def create(cls, address: str, tls: tuple[Path, Path, Path] | None = None) -> ProbeHost:
        """A host at `address`; with `tls` (certificate, key, log), an HTTPS echo host on 443."""
        clash = covered_by_a_route(address)
        if clash:
            raise RuntimeError(f"test host {address} would sit on {clash}, a network this machine routes")
        tag = uuid.uuid4().hex[:6]
        host = cls(address=address, netns=f"warren-th-{tag}", host_link=f"wth{tag}h")
        if tls is not None:
            host.port, host.log = 443, tls[2]
        serve = (
            [SERVER, address, str(PORT)]
            if tls is None
            else [ECHO_SERVER, address, "443", str(tls[2]), str(tls[0]), str(tls[1])]
        )
        peer = f"wth{tag}n"
        try:
            _ip("netns", "add", host.netns)
            _ip("link", "add", host.host_link, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", host.netns)
            _ip("addr", "add", f"{address}/32", "dev", peer, netns=host.netns)
            _ip("link", "set", "lo", "up", netns=host.netns)
            _ip("link", "set", peer, "up", netns=host.netns)
            _ip("route", "add", "default", "dev", peer, netns=host.netns)
            _ip("link", "set", host.host_link, "up")
            # The host side has no address: it answers ARP for the pods' and node's addresses.
            Path(f"/proc/sys/net/ipv4/conf/{host.host_link}/proxy_arp").write_text("1")
            _ip("route", "add", f"{address}/32", "dev", host.host_link)
            host.server = subprocess.Popen(
                ["ip", "netns", "exec", host.netns, sys.executable, "-c", *serve],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            host._wait_serving()
        except Exception:
            host.remove()
            raise
        return host

    def _wait_serving(self) -> None:
        probe = [
            "ip",
            "netns",
            "exec",
            self.netns,
            sys.executable,
            "-c",
            f"import socket; socket.create_connection(('{self.address}', {self.port}), timeout=1).close()",
        ]
        for _ in range(50):
            if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"test host {self.address} did not start serving")

    def remove(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
        subprocess.run(
            ["ip", "route", "del", f"{self.address}/32", "dev", self.host_link],
            capture_output=True,
            check=False,
        )
        subprocess.run(["ip", "link", "del", self.host_link], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", self.netns], capture_output=True, check=False)
