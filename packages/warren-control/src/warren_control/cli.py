"""`warren-control`: the control plane's one program.

    warren-control serve --role api|edge|controller|mirror|reaper|gateway|all ...
    warren-control openapi [--output FILE]
    warren-control admin migrate|create-org|issue-key|revoke-key|list-keys ...   (admin_cli.py)
    warren-control install ...   the install Job's work on the cluster (install.py)
    warren-control sandbox create|get|list|delete|fork|exec|stop|start|read-file|write-file|keepalive ...
    warren-control secret create|update|list|get|revoke|uses ...   (write-only: values go in, never out)

The sandbox commands talk to the edge with the SDK: `--url` / WARREN_URL and `--api-key` /
WARREN_API_KEY. Long operations (a sandbox coming up, stopping, going away) print their
progress on stderr; results go to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from warren_control import install
from warren_control.admin_cli import add_admin_parser
from warren_control.leader import add_arguments, lead_if_asked
from warren_control.podspec import add_request_arguments
from warren_control.sdk import Client, Phase, Sandbox, WarrenError
from warren_control.workspaces import DEFAULT_RETENTION_S

DEFAULT_EDGE_PORT = 8080
DEFAULT_API_PORT = 8081
DEFAULT_GATEWAY_PORT = 8090
# Libraries that log each request or connection at info (the edge's proxying through httpx,
# the Kubernetes client's pool, alembic's plugin setup): their warnings only.
QUIET_LOGGERS = ("httpx", "httpcore", "urllib3", "kubernetes", "alembic.runtime.plugins")


# --- serve -------------------------------------------------------------------------------------


def _stamp_key(args: argparse.Namespace) -> bytes:
    if args.stamp_key_file:
        key = Path(args.stamp_key_file).read_bytes().strip()
    else:
        key = os.environ.get("WARREN_STAMP_KEY", "").encode()
    if len(key) < 32:  # noqa: PLR2004 (identity.MIN_KEY_BYTES)
        raise SystemExit("a stamp key of at least 32 bytes is needed: --stamp-key-file or WARREN_STAMP_KEY")
    return key


def _database_url(args: argparse.Namespace) -> str:
    url: str | None = args.database_url or os.environ.get("WARREN_DATABASE_URL")
    if not url:
        raise SystemExit("a database is needed: --database-url or WARREN_DATABASE_URL")
    return url


def _api_settings(args: argparse.Namespace, *, read_through: bool) -> Any:
    from warren_control import db, workspaces
    from warren_control.api.service import ApiSettings

    url = _database_url(args)
    if args.migrate:
        db.upgrade(url)
    return ApiSettings(
        database_url=url,
        stamp_key=_stamp_key(args) if args.role in {"api", "edge", "all"} else b"",
        kubeconfig=args.kubeconfig,
        namespace=args.sandbox_namespace,
        gpu_available=args.gpu,
        memory_capture=args.memory_capture,
        capturable_images=frozenset(args.agent_in_image) if args.agent_image else None,
        workspaces=args.workspaces,
        workspace_store=workspaces.from_arguments(
            args.workspace_store, args.workspace_store_endpoint, args.workspace_store_tool
        ),
        read_through=read_through,
        workspace_retention_s=args.workspace_retention_hours * 3600,
        templates=dict(args.template),
        pools=_pools(args),
        fork_pools=_pools(args, fork=True),
        start_wait_s=args.start_wait,
        sandbox_domain=args.sandbox_domain,
        secrets_key=_secrets_key(args),
        gateway_url=args.gateway_url,
    )


def _secrets_key(args: argparse.Namespace) -> bytes | None:
    """The key material secrets are sealed under: --secrets-key-file, checked before
    anything starts; None where no gateway is deployed (secrets are refused then)."""
    if not args.secrets_key_file:
        if args.gateway_url or args.role == "gateway":
            raise SystemExit(
                "the egress gateway needs --secrets-key-file (at least 32 bytes, kept like the stamp key)"
            )
        return None
    try:
        key = Path(args.secrets_key_file).read_bytes().strip()
    except OSError as exc:
        raise SystemExit(f"cannot read --secrets-key-file {args.secrets_key_file}: {exc}") from None
    if len(key) < 32:  # noqa: PLR2004 (vault.MIN_KEY_MATERIAL)
        raise SystemExit(
            f"--secrets-key-file {args.secrets_key_file} holds {len(key)} bytes; at least 32 are needed"
        )
    return key


def _pools(args: argparse.Namespace, *, fork: bool = False) -> frozenset[str]:
    flag, names = ("--fork-pool", args.fork_pool) if fork else ("--pool", args.pool)
    unknown = sorted(set(names) - {name for name, _ in args.template})
    if unknown:
        raise SystemExit(
            f"error: {flag} {unknown[0]} names no template: give --template {unknown[0]}=IMAGE too"
        )
    return frozenset(names)


def _template(text: str) -> tuple[str, Any]:
    from warren_control import templates

    try:
        return templates.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _api_app(settings: Any) -> Any:
    from warren_control.api.app import make_api

    return make_api(settings)


def _background(args: argparse.Namespace, settings: Any, roles: Sequence[str], stop: threading.Event) -> None:
    """Start the mirror and/or the reaper in threads that end when `stop` is set."""
    from warren_control import db
    from warren_control.api.cluster import Cluster
    from warren_control.kube import Kube
    from warren_control.mirror import Mirror, MirrorOptions
    from warren_control.reaper import Reaper, ReaperOptions

    sessions = db.session_factory(db.make_engine(settings.database_url))
    workers: list[Any] = []
    if "mirror" in roles:
        options = MirrorOptions(resync_seconds=args.resync_seconds)
        workers.append(Mirror(sessions, Kube.connect(args.kubeconfig), settings.namespace, options))
    if "reaper" in roles:
        reaping = ReaperOptions(
            interval_s=args.reap_interval, workspace_retention_s=settings.workspace_retention_s
        )
        workers.append(Reaper(sessions, Cluster(settings), reaping, settings.workspace_store))
    for worker in workers:
        threading.Thread(target=worker.run, args=(stop,), name=type(worker).__name__, daemon=True).start()


def _gateway_app(args: argparse.Namespace, settings: Any, stop: threading.Event) -> Any:
    """The egress gateway (gateway.py), knowing sandboxes by their pods' addresses: on each
    sandbox node, for that node's pods (its Service keeps traffic on the node)."""
    from warren_control import db
    from warren_control.gateway import Gateway, PodAddresses, make_gateway, tls_context
    from warren_control.kube import Kube
    from warren_control.vault import SecretBox

    try:
        verify = tls_context(args.gateway_ca_file)
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"cannot use --gateway-ca-file {args.gateway_ca_file}: {exc}; give PEM certificates"
        ) from None
    addresses = PodAddresses(Kube.connect(args.kubeconfig), settings.namespace, node=args.gateway_node)
    addresses.run(stop)
    sessions = db.session_factory(db.make_engine(settings.database_url))
    return make_gateway(Gateway(sessions, SecretBox(settings.secrets_key), addresses, verify=verify))


def _until_signalled(stop: threading.Event) -> None:
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(3600):
        pass


def _edge_app(args: argparse.Namespace, api_url: str, api: Any = None) -> Any:
    from warren_control import db, store
    from warren_control.edge import make_edge
    from warren_control.oidc import OidcVerifier

    sessions = db.session_factory(db.make_engine(_database_url(args)))
    oidc = None
    if args.oidc_issuer:
        if not args.oidc_audience:
            raise SystemExit("--oidc-issuer needs --oidc-audience")
        oidc = OidcVerifier.discover(args.oidc_issuer, args.oidc_audience, org_claim=args.oidc_org_claim)
    return make_edge(
        api_url,
        _stamp_key(args),
        store.DatabaseKeyResolver(sessions),
        oidc,
        sandbox_domain=args.sandbox_domain,
        backend_app=api,
    )


class _Tls(NamedTuple):
    cert: str | None = None
    key: str | None = None


_PLAIN_HTTP = _Tls()


def _tls(args: argparse.Namespace) -> _Tls:
    """The edge's certificate and key (neither: plain HTTP), checked before anything starts:
    both or neither, readable, and a key that fits the certificate."""
    import ssl

    cert, key = args.tls_cert, args.tls_key
    if cert is None and key is None:
        return _Tls()
    if cert is None or key is None:
        given, missing = ("--tls-cert", "--tls-key") if cert is not None else ("--tls-key", "--tls-cert")
        raise SystemExit(f"{given} needs {missing}: give the edge's certificate and its key, or neither")
    if args.role not in {"edge", "all"}:
        raise SystemExit("--tls-cert and --tls-key are the edge's: use them with --role edge or --role all")
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(
            f"cannot use --tls-cert {cert} with --tls-key {key}: {exc}; give a PEM certificate "
            "(chain) and the PEM private key it was issued for"
        ) from None
    return _Tls(cert, key)


def _configure_logs(level: str) -> None:
    """JSON lines on stderr for everything a role logs: its own loggers, uvicorn's (which
    propagate to the root's handler: no log config of uvicorn's own)."""
    import logging

    from warren_common import logs

    logs.configure(level, quiet=QUIET_LOGGERS)
    logging.getLogger("uvicorn.access").addFilter(_access_fields)


def _access_fields(record: Any) -> bool:
    """uvicorn's access line, also as fields: (client, method, path, HTTP version, status)."""
    if isinstance(record.args, tuple) and len(record.args) == 5:  # noqa: PLR2004
        client, method, path, _version, status = record.args
        record.fields = {"client": client, "method": method, "path": path, "status": status}
    return True


def _server(app: Any, host: str, port: int, tls: _Tls) -> Any:
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="info",
        log_config=None,  # uvicorn's loggers propagate to the JSON handler (_configure_logs)
        proxy_headers=False,
        ssl_certfile=tls.cert,
        ssl_keyfile=tls.key,
    )
    return uvicorn.Server(config)


def _serve_forever(app: Any, host: str, port: int, tls: _Tls = _PLAIN_HTTP) -> None:
    _server(app, host, port, tls).run()


def _serve_in_thread(app: Any, host: str, port: int, tls: _Tls = _PLAIN_HTTP) -> Any:
    server = _server(app, host, port, tls)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    return server


def _run_controller(args: argparse.Namespace) -> None:
    from warren_control import controller, workspaces
    from warren_control.podspec import PodOptions, blockd_volume

    store = workspaces.from_arguments(
        args.workspace_store, args.workspace_store_endpoint, args.workspace_store_tool
    )
    options = controller.ControllerOptions(
        pod=PodOptions(
            image_pull_policy=args.image_pull_policy,
            cpu_request_percent=args.cpu_request_percent,
            memory_request_percent=args.memory_request_percent,
            agent_image=args.agent_image,
            agent_in_images=frozenset(args.agent_in_image),
            bind_in_place=args.bind_in_place,
            memory_images_dir=args.memory_images_dir,
        ),
        workspace=blockd_volume if args.workspaces else controller.no_workspace,
        release_workspace=store.release if store is not None else None,
        workspace_seq=(lambda w: store.proof(w).replicated_sequence) if store is not None else None,
        bind=_bind_options(args.blockd_bind_token_file),
        node_lost_seconds=args.node_lost_seconds,
    )
    controller.run(args.watch_namespace or [args.sandbox_namespace], args.kubeconfig, options=options)


def _bind_options(token_file: str | None) -> Any:
    """The nodes' bind API, from the token file the Secret warren-blockd-bind is mounted as."""
    if not token_file:
        return None
    from warren_control.binder import BindOptions

    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        raise SystemExit(f"--blockd-bind-token-file {token_file}: {exc.strerror}") from None
    if not token:
        raise SystemExit(f"--blockd-bind-token-file {token_file} is empty")
    return BindOptions(token=token)


def cmd_serve(args: argparse.Namespace) -> int:
    role = args.role
    stop = threading.Event()
    tls = _tls(args)
    _configure_logs(args.log_level)
    if role == "api":
        # Without a mirror deployed, reads converge each record from the cluster themselves.
        settings = _api_settings(args, read_through=not args.no_read_through)
        _serve_forever(_api_app(settings), args.host, args.port or DEFAULT_API_PORT)
    elif role == "edge":
        api_url = args.api_url or f"http://127.0.0.1:{DEFAULT_API_PORT}"
        _serve_forever(_edge_app(args, api_url), args.host, args.port or DEFAULT_EDGE_PORT, tls)
    elif role == "controller":
        lead_if_asked(args)
        _run_controller(args)
    elif role == "gateway":
        settings = _api_settings(args, read_through=False)
        stop_pods = threading.Event()
        try:
            _serve_forever(
                _gateway_app(args, settings, stop_pods), args.host, args.port or DEFAULT_GATEWAY_PORT
            )
        finally:
            stop_pods.set()
    elif role in {"mirror", "reaper"}:
        settings = _api_settings(args, read_through=False)
        lead_if_asked(args)
        _background(args, settings, [role], stop)
        _until_signalled(stop)
    else:  # all: API on loopback, the edge in front, mirror and reaper beside, the controller in charge
        settings = _api_settings(args, read_through=False)
        api_port = args.api_port or DEFAULT_API_PORT
        # The API keeps its loopback port (for probes and for tools); the edge calls it in
        # process, which spares every request a second connection.
        api = _api_app(settings)
        servers = [_serve_in_thread(api, "127.0.0.1", api_port)]
        servers.append(
            _serve_in_thread(
                _edge_app(args, f"http://127.0.0.1:{api_port}", api),
                args.host,
                args.port or DEFAULT_EDGE_PORT,
                tls,
            )
        )
        try:
            lead_if_asked(args)
            _background(args, settings, ["mirror", "reaper"], stop)
            _run_controller(args)
        finally:
            stop.set()
            for server in servers:
                server.should_exit = True
    return 0


def cmd_openapi(args: argparse.Namespace) -> int:
    from warren_control.api.app import document

    text = json.dumps(document(), indent=2, sort_keys=True) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


# --- sandbox -----------------------------------------------------------------------------------


class Progress:
    """Progress lines on stderr: each state a sandbox passes through, with the time taken.
    Safe to share between the threads that wait for a fork's children."""

    def __init__(self, stream: TextIO, quiet: bool = False) -> None:
        self.stream = stream
        self.quiet = quiet
        self.started = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, sandbox: Sandbox) -> None:
        if self.quiet:
            return
        elapsed = time.monotonic() - self.started
        reason = f" ({sandbox.reason})" if sandbox.reason else ""
        with self._lock:
            print(f"[{elapsed:5.1f}s] {sandbox.id} {sandbox.phase}{reason}", file=self.stream, flush=True)


def _client(args: argparse.Namespace) -> Client:
    url = args.url or os.environ.get("WARREN_URL")
    key = args.api_key or os.environ.get("WARREN_API_KEY")
    if not url or not key:
        raise SystemExit("set --url and --api-key (or WARREN_URL and WARREN_API_KEY)")
    return Client(url, key)


def _show(sandbox: Sandbox, args: argparse.Namespace) -> None:
    if args.json:
        print(json.dumps(dict(sandbox.raw), indent=2))
    else:
        print(sandbox.id)


def _wait(
    client: Client, args: argparse.Namespace, sandbox_id: str, phase: Phase, progress: Progress | None = None
) -> Sandbox:
    return client.wait_until(
        sandbox_id,
        phase,
        timeout=args.timeout,
        progress=progress or Progress(sys.stderr, quiet=args.quiet),
        unschedulable_for=args.unschedulable_for or None,
    )


def sandbox_create(client: Client, args: argparse.Namespace) -> int:
    command = args.command or None
    if command and command[0] == "--":
        command = command[1:] or None
    sandbox = client.create(
        args.image,
        command=command,
        cpu_millis=args.cpu_millis,
        memory_mib=args.memory_mib,
        persistent=args.persistent,
        idle_timeout_s=args.idle_timeout,
        max_lifetime_s=args.max_lifetime,
        workspace_size_gib=args.workspace_size_gib,
        workspace_template=args.template,
        **({"on_idle": args.on_idle} if args.on_idle else {}),
        **({"secrets": args.secret} if args.secret else {}),
    )
    if args.wait:
        sandbox = _wait(client, args, sandbox.id, "Running")
    _show(sandbox, args)
    return 0


def sandbox_get(client: Client, args: argparse.Namespace) -> int:
    print(json.dumps(dict(client.get(args.id).raw), indent=2))
    return 0


def sandbox_list(client: Client, args: argparse.Namespace) -> int:
    if args.json:
        for sandbox in client.list():
            print(json.dumps(dict(sandbox.raw)))
        return 0
    print(f"{'ID':<32} {'PHASE':<12} {'CREATED':<26} IMAGE")
    for sandbox in client.list():
        created = sandbox.created_at.isoformat(timespec="seconds") if sandbox.created_at else ""
        print(f"{sandbox.id:<32} {sandbox.phase:<12} {created:<26} {sandbox.spec.get('image', '')}")
    return 0


def sandbox_delete(client: Client, args: argparse.Namespace) -> int:
    sandbox = client.delete(args.id)
    if args.wait and sandbox.phase != "Deleted":
        _wait(client, args, args.id, "Deleted")
    print(args.id)
    return 0


def sandbox_fork(client: Client, args: argparse.Namespace) -> int:
    """Fork, then wait for every child at once (each on its own, with progress): the command
    ends when each child runs or cannot, and says why for each that cannot."""
    results = client.fork(args.id, args.count, secrets=args.secrets)
    progress = Progress(sys.stderr, quiet=args.quiet)

    def settle(child: Sandbox) -> Sandbox | WarrenError:
        try:
            return _wait(client, args, child.id, "Running", progress) if args.wait else child
        except WarrenError as exc:
            return exc

    made = [r.sandbox for r in results if r.sandbox is not None]
    with ThreadPoolExecutor(max_workers=max(1, min(len(made), 16))) as pool:
        settled = dict(zip((c.id for c in made), pool.map(settle, made), strict=True))
    failed = 0
    for number, result in enumerate(results, 1):
        if result.sandbox is None:
            failed += 1
            print(f"child {number}: {result.error}: {result.message}", file=sys.stderr)
            continue
        outcome = settled[result.sandbox.id]
        if isinstance(outcome, WarrenError):
            failed += 1
            print(f"child {number} ({result.sandbox.id}): {outcome}", file=sys.stderr)
            continue
        _show(outcome, args)
    return 1 if failed else 0


def sandbox_exec(client: Client, args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command and args.command[0] == "--" else args.command
    if not command:
        raise SystemExit("name the command to run: sandbox exec ID -- COMMAND [ARG...]")
    stdin = sys.stdin.buffer.read() if args.stdin else None
    stream = client.exec(args.id, command, timeout=args.exec_timeout, stdin=stdin)
    while True:
        try:
            chunk = next(stream)
        except StopIteration as done:
            return int(done.value)
        target = sys.stdout if chunk.stream == "stdout" else sys.stderr
        target.flush()
        target.buffer.write(chunk.data)
        target.buffer.flush()


def sandbox_stop(client: Client, args: argparse.Namespace) -> int:
    sandbox = client.stop(args.id, memory=args.memory)
    if args.wait:
        sandbox = _wait(client, args, args.id, "Stopped")
    _show(sandbox, args)
    return 0


def sandbox_start(client: Client, args: argparse.Namespace) -> int:
    sandbox = client.start(args.id, cold=args.cold)
    if args.wait:
        sandbox = _wait(client, args, args.id, "Running")
    _show(sandbox, args)
    return 0


def sandbox_read_file(client: Client, args: argparse.Namespace) -> int:
    data = client.read_file(args.id, args.path)
    if args.output and args.output != "-":
        Path(args.output).write_bytes(data)
    else:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    return 0


def sandbox_write_file(client: Client, args: argparse.Namespace) -> int:
    data = sys.stdin.buffer.read() if args.source == "-" else Path(args.source).read_bytes()
    size = client.write_file(args.id, args.path, data)
    print(f"{size} bytes written to {args.path}", file=sys.stderr)
    return 0


def sandbox_keepalive(client: Client, args: argparse.Namespace) -> int:
    _show(client.keepalive(args.id), args)
    return 0


def sandbox_workspace(client: Client, args: argparse.Namespace) -> int:
    proof = client.workspace_proof(args.id)
    print(
        json.dumps(
            {
                "workspace_id": proof.workspace_id,
                "replicated_sequence": proof.replicated_sequence,
                "checked_at": proof.checked_at.isoformat() if proof.checked_at else None,
            }
        )
    )
    return 0


# --- parser ------------------------------------------------------------------------------------


def _serve_parser(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run one role of the control plane (or all of them)")
    serve.add_argument(
        "--role", choices=["api", "edge", "controller", "mirror", "reaper", "gateway", "all"], required=True
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (edge, api)")
    serve.add_argument("--log-level", default="info", help="logs are JSON lines on stderr, one event each")
    serve.add_argument(
        "--port",
        type=int,
        help=f"port (edge {DEFAULT_EDGE_PORT}, api {DEFAULT_API_PORT}, gateway {DEFAULT_GATEWAY_PORT})",
    )
    serve.add_argument("--api-port", type=int, help="with --role all: the API's loopback port")
    serve.add_argument(
        "--secrets-key-file",
        help="api, gateway: the key material organization secrets are sealed under (at least 32 bytes)",
    )
    serve.add_argument(
        "--gateway-url",
        help="api: the egress gateway's URL as sandbox pods reach it (their WARREN_GATEWAY_URL)",
    )
    serve.add_argument(
        "--gateway-node",
        default=os.environ.get("WARREN_GATEWAY_NODE"),
        help="gateway: serve only this node's sandbox pods (or WARREN_GATEWAY_NODE; default: every node's)",
    )
    serve.add_argument(
        "--gateway-ca-file",
        help="gateway: PEM certificates trusted for destinations besides the system's "
        "(a private model host's)",
    )
    serve.add_argument("--api-url", help="with --role edge: where the API listens")
    serve.add_argument("--database-url", help="records database (or WARREN_DATABASE_URL)")
    serve.add_argument("--migrate", action="store_true", help="upgrade the database schema first")
    serve.add_argument("--stamp-key-file", help="the identity stamp key (or WARREN_STAMP_KEY)")
    serve.add_argument("--kubeconfig", help="kubeconfig file; the pod's service account when absent")
    serve.add_argument("--sandbox-namespace", default="warren-sandboxes")
    serve.add_argument(
        "--watch-namespace", action="append", help="controller: a namespace to watch (repeatable)"
    )
    serve.add_argument("--gpu", action="store_true", help="the cluster has GPUs")
    serve.add_argument("--memory-capture", action="store_true", help="memory capture is available")
    _workspace_arguments(serve)
    add_request_arguments(serve)
    _e2b_and_edge_arguments(serve)
    # The controller, the mirror and the reaper run only while this replica leads; the
    # edge and the API serve in every one.
    add_arguments(serve)
    serve.add_argument("--resync-seconds", type=float, default=60.0, help="mirror: full pass interval")
    # Short: an E2B sandbox's timeout is an end time a client expects kept within seconds, and
    # a sweep is one indexed query.
    serve.add_argument("--reap-interval", type=float, default=5.0, help="reaper: seconds between sweeps")
    serve.add_argument("--oidc-issuer", help="edge: accept bearer tokens from this issuer")
    serve.add_argument("--oidc-audience", help="edge: the audience tokens must name")
    serve.add_argument("--oidc-org-claim", default="org", help="edge: the claim naming the organization")
    serve.set_defaults(handler=cmd_serve)


def _workspace_arguments(serve: Any) -> None:
    """serve: the workspace layer's options."""
    serve.add_argument(
        "--workspaces",
        action="store_true",
        help="the workspace layer is deployed: the API allows workspaces, the controller mounts them",
    )
    serve.add_argument(
        "--blockd-bind-token-file",
        help="controller: the nodes' warren-blockd bind API token (Secret warren-blockd-bind), for "
        "pools whose pods take their workspace at the claim",
    )
    serve.add_argument(
        "--bind-in-place",
        action="store_true",
        help="controller: the nodes' warren-blockd bind workspaces beneath running containers "
        "(its --runtime-state), so a claim from a bindAtClaim pool starts no container",
    )
    serve.add_argument(
        "--memory-images-dir",
        help="controller: where each node's warren-blockd keeps memory images, as the host has "
        "it (its --host-state-dir followed by /images); resume pools' pods wait for theirs there",
    )
    serve.add_argument(
        "--workspace-store",
        help="API: the bucket the nodes' warren-blockd replicate to, s3://BUCKET[/PREFIX] "
        "(or WARREN_WORKSPACE_STORE; credentials from the AWS environment variables)",
    )
    serve.add_argument(
        "--workspace-store-endpoint",
        help="API: the S3 endpoint of --workspace-store (or WARREN_WORKSPACE_STORE_ENDPOINT)",
    )
    serve.add_argument(
        "--workspace-store-tool",
        help="API: the warren-blockd command that reads the store (or WARREN_WORKSPACE_STORE_TOOL)",
    )
    serve.add_argument(
        "--workspace-retention-hours",
        type=float,
        default=DEFAULT_RETENTION_S / 3600,
        help="API, reaper: how long a deleted sandbox's workspace stays in storage (a template "
        "until then); then the reaper releases it",
    )
    serve.add_argument(
        "--image-pull-policy",
        choices=["Always", "IfNotPresent", "Never"],
        default="IfNotPresent",
        help="controller: the sandbox pods' image pull policy",
    )


def _e2b_and_edge_arguments(serve: Any) -> None:
    """serve: the E2B surface's and the edge's options."""
    serve.add_argument(
        "--template",
        action="append",
        type=_template,
        default=[],
        metavar="NAME=IMAGE",
        help="api: a template the E2B surface's templateID may name (repeatable)",
    )
    serve.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NAME",
        help="api: the template NAME has a warm pool (the SandboxPool NAME in the sandbox "
        "namespace): creates it describes claim from it (repeatable)",
    )
    serve.add_argument(
        "--fork-pool",
        action="append",
        default=[],
        metavar="NAME",
        help="api: the children of forks of template NAME's sandboxes claim from the SandboxPool "
        "NAME-forks, whose pods take their workspace at the claim (repeatable)",
    )
    serve.add_argument(
        "--start-wait",
        type=float,
        default=50.0,
        metavar="SECONDS",
        help="api: how long an E2B create, connect or fork waits for its sandboxes to run (0: not at all)",
    )
    serve.add_argument(
        "--sandbox-domain",
        help="api, edge: the domain sandboxes' hosts are under ({port}-{id}.DOMAIN): what E2B "
        "clients are told, and the host names the edge routes to sandboxes",
    )
    serve.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="edge: serve HTTPS with this PEM certificate (chain); for sandbox hosts, a wildcard "
        "one for *.DOMAIN of --sandbox-domain. Needs --tls-key",
    )
    serve.add_argument("--tls-key", metavar="FILE", help="edge: the PEM private key of --tls-cert")
    serve.add_argument(
        "--no-read-through",
        action="store_true",
        help="api: answer reads from the records alone (a status mirror is deployed)",
    )


def _sandbox_parser(commands: Any) -> None:  # noqa: PLR0915 (the whole command tree, in one place)
    sandbox = commands.add_parser("sandbox", help="manage sandboxes through the API")
    sandbox.add_argument("--url", help="the edge's URL (or WARREN_URL)")
    sandbox.add_argument("--api-key", help="an API key (or WARREN_API_KEY)")
    sandbox.add_argument("--json", action="store_true", help="print sandboxes as JSON")
    sandbox.add_argument("--quiet", action="store_true", help="no progress output")
    sandbox.add_argument("--timeout", type=float, default=300.0, help="how long to wait (seconds)")
    sandbox.add_argument(
        "--unschedulable-for",
        type=float,
        default=60.0,
        help="stop waiting once no node had room for a sandbox this long (seconds; 0: until --timeout)",
    )
    actions = sandbox.add_subparsers(dest="action", required=True)

    def action(name: str, handler: Callable[[Client, argparse.Namespace], int], help_text: str) -> Any:
        parser = actions.add_parser(name, help=help_text)
        parser.set_defaults(api_handler=handler)
        return parser

    def with_wait(parser: Any) -> None:
        parser.add_argument("--no-wait", dest="wait", action="store_false", help="return at once")

    create = action("create", sandbox_create, "create a sandbox and wait until it runs")
    create.add_argument("image")
    create.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    create.add_argument("--cpu-millis", type=int)
    create.add_argument("--memory-mib", type=int)
    create.add_argument("--persistent", action="store_true")
    create.add_argument("--idle-timeout", type=int, help="seconds")
    create.add_argument("--max-lifetime", type=int, help="seconds")
    create.add_argument("--workspace-size-gib", type=int)
    create.add_argument("--template", help="a workspace id to start from")
    idle = "what the idle timeout does (pause keeps memory)"
    create.add_argument("--on-idle", choices=["delete", "stop", "pause"], help=idle)
    create.add_argument(
        "--secret",
        action="append",
        metavar="NAME",
        help="a secret it may use through the egress gateway (repeatable)",
    )
    with_wait(create)

    action("get", sandbox_get, "show a sandbox").add_argument("id")
    action("list", sandbox_list, "list the organization's sandboxes")

    delete = action("delete", sandbox_delete, "delete a sandbox and wait until it is gone")
    delete.add_argument("id")
    with_wait(delete)

    fork = action("fork", sandbox_fork, "fork a sandbox into new ones")
    fork.add_argument("id")
    fork.add_argument("--count", type=int, default=1)
    fork.add_argument("--secrets", action="store_true", help="the children keep the parent's secret bindings")
    with_wait(fork)

    run = action("exec", sandbox_exec, "run a command in a sandbox (exits with its exit code)")
    run.add_argument("id")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    run.add_argument("--exec-timeout", type=int, default=600, help="seconds")
    run.add_argument("--stdin", action="store_true", help="send this program's standard input to the command")

    stop = action("stop", sandbox_stop, "stop a sandbox (its workspace stays)")
    stop.add_argument("id")
    stop.add_argument("--memory", action="store_true", help="keep its processes' memory")
    with_wait(stop)

    start = action("start", sandbox_start, "start a stopped sandbox")
    start.add_argument("id")
    start.add_argument("--cold", action="store_true", help="start afresh even where its memory was kept")
    with_wait(start)

    read = action("read-file", sandbox_read_file, "print a file of a sandbox")
    read.add_argument("id")
    read.add_argument("path")
    read.add_argument("--output", "-o", help="write to this file instead of stdout")

    write = action("write-file", sandbox_write_file, "write a file in a sandbox")
    write.add_argument("id")
    write.add_argument("path")
    write.add_argument("source", nargs="?", default="-", help="local file, or - for stdin")

    action("keepalive", sandbox_keepalive, "restart a sandbox's idle timer").add_argument("id")
    action(
        "workspace", sandbox_workspace, "what object storage proves about a sandbox's workspace (JSON)"
    ).add_argument("id")

    sandbox.set_defaults(handler=cmd_through_api)


def _secret_parser(commands: Any) -> None:
    secret = commands.add_parser(
        "secret", help="manage the organization's secrets through the API (write-only)"
    )
    secret.add_argument("--url", help="the edge's URL (or WARREN_URL)")
    secret.add_argument("--api-key", help="an API key (or WARREN_API_KEY)")
    actions = secret.add_subparsers(dest="action", required=True)

    def how(parser: Any) -> None:
        parser.add_argument(
            "--destination", action="append", metavar="URL", help="https://HOST[:PORT][/PREFIX] (repeatable)"
        )
        parser.add_argument("--header", help="the header it goes in (default Authorization)")
        parser.add_argument(
            "--template", help="the header's value with {secret} where it goes (default 'Bearer {secret}')"
        )
        parser.add_argument("--query", help="a query parameter it goes in instead of a header")
        parser.add_argument("--budget-requests", type=int, help="requests at most in each --budget-period")
        parser.add_argument(
            "--budget-bytes", type=int, help="bytes both ways at most in each --budget-period"
        )
        parser.add_argument("--budget-period", type=int, default=3600, help="seconds (default 3600)")
        parser.add_argument(
            "--value-file",
            help="read the value from this file (default: standard input), one line, never an argument",
        )

    create = actions.add_parser("create", help="store a secret (its value from --value-file or stdin)")
    create.add_argument("name")
    create.add_argument("--env", help="the variable a sandbox bound to it holds a placeholder in")
    how(create)
    create.set_defaults(api_handler=secret_create)
    rotate = actions.add_parser("update", help="rotate its value (--rotate) or change where and how it goes")
    rotate.add_argument("name")
    rotate.add_argument("--rotate", action="store_true", help="a new value, from --value-file or stdin")
    how(rotate)
    rotate.set_defaults(api_handler=secret_update)
    actions.add_parser("list", help="the live secrets").set_defaults(api_handler=secret_list)
    for name, handler, text in (
        ("get", secret_get, "one secret, without its value"),
        ("revoke", secret_revoke, "revoke it: the next request that would carry it is refused"),
        ("uses", secret_uses, "its audit: every request made with it, or refused, newest first"),
    ):
        one = actions.add_parser(name, help=text)
        one.add_argument("name")
        one.set_defaults(api_handler=handler)
    secret.set_defaults(handler=cmd_through_api)


def _secret_value(args: argparse.Namespace) -> str:
    """The value, from a file or stdin (an argument would be in the shell's history and ps)."""
    raw = Path(args.value_file).read_text() if args.value_file else sys.stdin.read()
    return raw.rstrip("\r\n")


def _secret_how(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key in ("header", "template", "query"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    if args.destination:
        options["destinations"] = args.destination
    if args.budget_requests is not None or args.budget_bytes is not None:
        options["budget"] = {
            "requests": args.budget_requests,
            "bytes": args.budget_bytes,
            "period_s": args.budget_period,
        }
    return options


def secret_create(client: Client, args: argparse.Namespace) -> int:
    options = _secret_how(args)
    destinations = options.pop("destinations", None)
    if not destinations:
        raise SystemExit("give at least one --destination https://HOST[:PORT][/PREFIX]")
    if args.env:
        options["env"] = args.env
    print(json.dumps(client.create_secret(args.name, _secret_value(args), destinations, **options), indent=2))
    return 0


def secret_update(client: Client, args: argparse.Namespace) -> int:
    changes = _secret_how(args)
    if args.rotate:
        changes["value"] = _secret_value(args)
    if not changes:
        raise SystemExit(
            "nothing to change: give --rotate, --destination, --header, --template, --query or a budget"
        )
    print(json.dumps(client.update_secret(args.name, **changes), indent=2))
    return 0


def secret_list(client: Client, args: argparse.Namespace) -> int:
    for secret in client.list_secrets():
        print(json.dumps(secret))
    return 0


def secret_get(client: Client, args: argparse.Namespace) -> int:
    print(json.dumps(client.get_secret(args.name), indent=2))
    return 0


def secret_revoke(client: Client, args: argparse.Namespace) -> int:
    print(json.dumps(client.revoke_secret(args.name), indent=2))
    return 0


def secret_uses(client: Client, args: argparse.Namespace) -> int:
    for use in client.secret_uses(args.name):
        print(json.dumps(use))
    return 0


def cmd_through_api(args: argparse.Namespace) -> int:
    """A sandbox or secret command: its handler with an SDK client of the edge."""
    with _client(args) as client:
        try:
            code: int = args.api_handler(client, args)
        except WarrenError as exc:
            print(f"error: {exc.code}: {exc.message}", file=sys.stderr)
            return 1
    return code


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="warren-control", description=(__doc__ or "").splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)
    _serve_parser(commands)
    openapi = commands.add_parser("openapi", help="print the API's OpenAPI document")
    openapi.add_argument("--output", "-o", help="write it to this file")
    openapi.set_defaults(handler=cmd_openapi)
    _sandbox_parser(commands)
    _secret_parser(commands)
    add_admin_parser(commands)
    install.add_parser(commands)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
