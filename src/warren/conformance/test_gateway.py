"""The egress gateway, tried from inside sandboxes of the installed platform (real gVisor pods).

An HTTPS host in its own network namespace at a public documentation address stands for a
model API; another stands for somewhere else. An organization's secret is bound to the
first; a sandbox bound to the secret calls it through $WARREN_GATEWAY_URL with busybox's
wget, and the host receives the real key, which the sandbox never sees (not in its
environment, its files, any process's environ, nor any answer). From inside the sandbox:
a spoofed Host, an absolute URL in the request line, the other host named in the path, a
path that climbs out of the prefix, CONNECT: the key reaches the bound destination only,
the other host nothing at all. A sandbox of the same organization not bound to the secret,
and one of another organization (made with `warren-control admin` in a control pod), are
refused; a revoked secret stops at once; a request past the budget is refused; every use
is in the secret's audit.

Needs --gateway-test-ca (the CA the deployed gateway trusts, services.gateway_trusted_ca),
--egress-test-hosts local and the platform tier's --api-url and --api-key-file.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from warren.conformance.kube import exec_in, ready_nodes
from warren.conformance.testhosts import ProbeHost

MODEL_HOST = "203.0.113.20"  # TEST-NET-3: a public address, as a model API's would be
ELSEWHERE = "203.0.113.21"
VALUE = "sk-conformance-" + uuid.uuid4().hex
WAIT_S = 400.0
CONTROL = "/opt/warren/control/bin/warren-control"  # in the warren-control image


@pytest.fixture(scope="module")
def ca_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    given: Path | None = request.config.getoption("--gateway-test-ca")
    if given is None:
        pytest.skip("the gateway tests need --gateway-test-ca (the CA the platform's gateway trusts)")
    if request.config.getoption("--egress-test-hosts") != "local":
        pytest.skip(
            "the gateway tests need test hosts: --egress-test-hosts local (root, on the nodes' machine)"
        )
    if not (given / "ca.crt").is_file() or not (given / "ca.key").is_file():
        raise pytest.UsageError(f"--gateway-test-ca {given} holds no ca.crt and ca.key")
    copy = tmp_path_factory.mktemp("gateway-ca")
    for name in ("ca.crt", "ca.key"):
        shutil.copy(given / name, copy / name)
    return copy


def _https_host(ca: Path, address: str, logs: Path) -> ProbeHost:
    from warren_common.pki import SERVER, Leaf, Pki

    pki = Pki(ca)
    name = "host-" + address.replace(".", "-")
    pki.ensure_leaf(Leaf(name, "ca", address, (), (SERVER,), (), (address,)))
    return ProbeHost.create(address, (pki.path(name, "crt"), pki.path(name, "key"), logs / f"{name}.log"))


@pytest.fixture(scope="module")
def hosts(ca_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ProbeHost]]:
    logs = tmp_path_factory.mktemp("gateway-hosts")
    made: dict[str, ProbeHost] = {}
    try:
        made["model"] = _https_host(ca_dir, MODEL_HOST, logs)
        made["elsewhere"] = _https_host(ca_dir, ELSEWHERE, logs)
        yield made
    finally:
        for host in made.values():
            host.remove()


@pytest.fixture(scope="module")
def made(platform: Any) -> Iterator[list[tuple[Any, str]]]:
    """(client, sandbox id) of every sandbox made here, deleted at the end."""
    boxes: list[tuple[Any, str]] = []
    yield boxes
    for owner, sandbox_id in boxes:
        try:
            owner.delete(sandbox_id)
        except Exception as exc:  # keep deleting the rest; say what stayed
            print(f"could not delete {sandbox_id}: {exc}")


def _sandbox(owner: Any, image: str, made: list[tuple[Any, str]], secrets: list[str] | None = None) -> str:
    options = {"secrets": secrets} if secrets else {}
    created = owner.create(image, command=["sleep", "86400"], cpu_millis=100, memory_mib=128, **options)
    made.append((owner, created.id))
    assert owner.wait_until(created.id, "Running", timeout=WAIT_S).phase == "Running"
    return str(created.id)


@pytest.fixture(scope="module")
def secret(platform: Any, hosts: dict[str, ProbeHost]) -> Iterator[str]:
    name = "conformance-" + uuid.uuid4().hex[:8]
    platform.create_secret(
        name,
        VALUE,
        [f"https://{MODEL_HOST}/v1"],
        env="MODEL_API_KEY",
        budget={"requests": 6, "period_s": 3600},
    )
    yield name
    if any(s["name"] == name for s in platform.list_secrets()):  # the last test revokes it
        platform.revoke_secret(name)


@pytest.fixture(scope="module")
def bound(platform: Any, image: str, made: list[tuple[Any, str]], secret: str) -> str:
    return _sandbox(platform, image, made, [secret])


def sh(owner: Any, sandbox_id: str, script: str) -> str:
    """The script's output (stdout and stderr) in the sandbox, whatever its exit code."""
    result = owner.run(sandbox_id, ["sh", "-c", script + " 2>&1"], timeout=120)
    return str(result.stdout.decode(errors="replace"))


def wget(
    owner: Any, sandbox_id: str, target: str, *options: str, gateway: str = "$WARREN_GATEWAY_URL"
) -> str:
    """busybox wget through the gateway: the answer's status line and body. A sandbox not
    bound to any secret has no WARREN_GATEWAY_URL: it is given the address (anyone may
    know it)."""
    quoted = " ".join(f'"{o}"' for o in options)  # double quotes: $MODEL_API_KEY is the sandbox's
    return sh(owner, sandbox_id, f'wget -S -q -O- {quoted} "{gateway}/{target}"')


def test_the_destination_gets_the_key_and_the_sandbox_only_its_placeholder(
    platform: Any, bound: str, secret: str, hosts: dict[str, ProbeHost]
) -> None:
    env = sh(platform, bound, "env")
    assert f"MODEL_API_KEY=warren-secret-placeholder-{secret}" in env and "WARREN_GATEWAY_URL=http" in env
    answer = wget(
        platform, bound, f"{secret}/{MODEL_HOST}/v1/chat", "--header", "Authorization: Bearer $MODEL_API_KEY"
    )
    assert "200 OK" in answer, answer
    (seen,) = hosts["model"].seen()
    assert seen["headers"]["Authorization"] == f"Bearer {VALUE}"
    assert seen["path"] == "/v1/chat"
    # The host echoed what it received: the sandbox reads the placeholder in its place.
    assert VALUE not in answer and f"warren-secret-placeholder-{secret}" in answer
    inside = sh(
        platform,
        bound,
        f"cat /proc/[0-9]*/environ | tr '\\0' '\\n' | grep -c {VALUE}; "
        f"grep -rls {VALUE} /bin /etc /home /root /tmp /usr /var /workspace /.warren 2>/dev/null; echo done",
    )
    assert inside.split() == ["0", "done"], inside


def test_spoofed_hosts_absolute_urls_and_other_paths_send_the_key_nowhere_else(
    platform: Any, bound: str, secret: str, hosts: dict[str, ProbeHost]
) -> None:
    before = len(hosts["model"].seen())
    spoofed = wget(platform, bound, f"{secret}/{MODEL_HOST}/v1/spoofed", "--header", f"Host: {ELSEWHERE}")
    assert "200 OK" in spoofed, spoofed
    # An absolute URL naming the other host, as a proxy client sends it (busybox's http_proxy).
    absolute = sh(
        platform,
        bound,
        f'http_proxy="$WARREN_GATEWAY_URL" wget -S -q -O- "http://{ELSEWHERE}/{secret}/{MODEL_HOST}/v1/absolute"',
    )
    assert "200 OK" in absolute, absolute
    refused = {
        f"{secret}/{ELSEWHERE}/v1/x": ("403",),  # not a destination of the secret
        f"{secret}/{MODEL_HOST}/admin": ("403",),  # outside its prefix
        # Climbing out, escaped: refused as it is (400), or outside the prefix once the
        # client itself resolved it (busybox wget does: 403).
        f"{secret}/{MODEL_HOST}/v1/%2e%2e/admin": ("400", "403"),
        f"{secret}/{MODEL_HOST}@{ELSEWHERE}/v1/x": ("400",),
    }
    for target, statuses in refused.items():
        answer = wget(platform, bound, target)
        assert any(f"HTTP/1.1 {status}" in answer for status in statuses), (target, answer)
    # A tunnel, to do TLS of its own past the gateway: refused (the HTTP server refuses the
    # authority form itself; the gateway refuses any other CONNECT).
    connect = sh(
        platform,
        bound,
        "host=${WARREN_GATEWAY_URL#http://}; "
        f"printf 'CONNECT {ELSEWHERE}:443 HTTP/1.1\\r\\nHost: {ELSEWHERE}:443\\r\\n\\r\\n' "
        '| nc -w 10 "${host%:*}" "${host##*:}"',
    )
    assert connect.startswith(("HTTP/1.1 400", "HTTP/1.1 405")), connect
    paths = [str(s["path"]) for s in hosts["model"].seen()[before:]]
    assert paths == ["/v1/spoofed", "/v1/absolute"]
    assert all(s["headers"]["Host"] == MODEL_HOST for s in hosts["model"].seen())
    assert not hosts["elsewhere"].seen()  # nothing ever reached it


def test_a_sandbox_on_every_node_reaches_the_gateway(
    platform: Any,
    image: str,
    made: list[tuple[Any, str]],
    hosts: dict[str, ProbeHost],
    core: client.CoreV1Api,
) -> None:
    """Each node's own egress floor lets its sandboxes reach the gateway (and the gateway
    knows them by their pods' addresses there): one sandbox on each Ready node, placed by
    leaving only that node schedulable while it is made."""
    nodes = ready_nodes(core)
    name = "conformance-nodes-" + uuid.uuid4().hex[:8]
    platform.create_secret(name, VALUE, [f"https://{MODEL_HOST}/v1"])
    try:
        for node in nodes:
            with only_schedulable(core, node, nodes):
                box = _sandbox(platform, image, made, [name])
            before = len(hosts["model"].seen())
            assert "200 OK" in wget(platform, box, f"{name}/{MODEL_HOST}/v1/node"), node
            assert hosts["model"].seen()[before]["headers"]["Authorization"] == f"Bearer {VALUE}", node
    finally:
        platform.revoke_secret(name)


@contextlib.contextmanager
def only_schedulable(core: client.CoreV1Api, node: str, nodes: list[str]) -> Iterator[None]:
    others = [n for n in nodes if n != node]
    for other in others:
        core.patch_node(other, {"spec": {"unschedulable": True}})
    try:
        yield
    finally:
        for other in others:
            core.patch_node(other, {"spec": {"unschedulable": False}})


def test_only_bound_sandboxes_of_its_organization_use_it_and_revocation_stops_it_at_once(
    platform: Any,
    image: str,
    made: list[tuple[Any, str]],
    bound: str,
    secret: str,
    hosts: dict[str, ProbeHost],
    other_org: Any,
) -> None:
    gateway = sh(platform, bound, 'echo "$WARREN_GATEWAY_URL"').strip()
    unbound = _sandbox(platform, image, made)
    assert "403" in wget(platform, unbound, f"{secret}/{MODEL_HOST}/v1/x", gateway=gateway)
    theirs = _sandbox(other_org, image, made)
    assert "404" in wget(other_org, theirs, f"{secret}/{MODEL_HOST}/v1/x", gateway=gateway)
    sent = len(hosts["model"].seen())
    # The budget is 6 requests an hour: 3 were sent; 3 more go, the next is refused.
    for _ in range(3):
        assert "200 OK" in wget(platform, bound, f"{secret}/{MODEL_HOST}/v1/budget")
    over = wget(platform, bound, f"{secret}/{MODEL_HOST}/v1/budget")
    assert "429" in over, over
    platform.update_secret(secret, budget={"requests": 100, "period_s": 3600})
    assert "200 OK" in wget(platform, bound, f"{secret}/{MODEL_HOST}/v1/budget")
    platform.revoke_secret(secret)
    revoked = wget(platform, bound, f"{secret}/{MODEL_HOST}/v1/after-revoke")
    assert "HTTP/1.1 403" in revoked, revoked  # revoked (busybox wget prints no error's body)
    assert len(hosts["model"].seen()) == sent + 4
    # The audit, a revoked secret's too: every attempt of this organization's sandboxes.
    uses = platform.secret_uses(secret)
    outcomes = {u["outcome"] for u in uses}
    assert outcomes == {
        "sent",
        "not_a_destination",
        "bad_path",
        "not_bound",
        "over_budget",
        "revoked",
    }
    assert sum(u["outcome"] == "sent" for u in uses) == 7
    assert {u["sandbox_id"] for u in uses} == {bound, unbound}
    assert all(u["bytes_received"] > 0 for u in uses if u["outcome"] == "sent")


@pytest.fixture(scope="module")
def other_org(request: pytest.FixtureRequest, platform: Any, core: client.CoreV1Api) -> Iterator[Any]:
    """A client of a second organization, made by the operator's admin commands in a control pod."""
    from warren_control.sdk import Client

    pods = core.list_namespaced_pod("warren-system", label_selector="app.kubernetes.io/name=warren-control")
    pod = next(p.metadata.name for p in pods.items if p.status.phase == "Running")
    name = "conformance-other-" + uuid.uuid4().hex[:6]
    org = exec_in(core, "warren-system", pod, [CONTROL, "admin", "create-org", name])
    assert org.code == 0, org.output
    org_id = org.output.split()[0]
    key = exec_in(core, "warren-system", pod, [CONTROL, "admin", "issue-key", org_id, "conformance"])
    assert key.code == 0, key.output
    with Client(request.config.getoption("--api-url"), key.output.split()[0], timeout=60.0) as other:
        yield other
