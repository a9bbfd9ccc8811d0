"""The `warren` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.table import Table

from warren import paths
from warren.cluster.local import BIN_DIR_RECORD, ClusterError, LocalCluster, NodeProvider
from warren.config import DEFAULT_IMAGE_REGISTRY, ConfigError, WarrenConfig, load_config

if TYPE_CHECKING:
    from warren.cluster.process import Supervisor

console = Console(stderr=True)


def _say(message: str) -> None:
    console.print(f"[dim]·[/dim] {message}", highlight=False)


def _config(path: Path | None) -> WarrenConfig:
    try:
        return load_config(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _bin_dir(value: Path | None) -> Path:
    """--bin-dir, else $WARREN_BIN_DIR, else the directory the running cluster was started
    from, else the directory of kube-apiserver on PATH."""
    if value:
        return value
    if env := os.environ.get("WARREN_BIN_DIR"):
        return Path(env)
    recorded = paths.cluster_state_dir() / BIN_DIR_RECORD
    if recorded.is_file() and Path(recorded.read_text().strip()).is_dir():
        return Path(recorded.read_text().strip())
    from shutil import which

    found = which("kube-apiserver")
    if found:
        return Path(found).parent
    raise click.ClickException(
        "cluster binaries not found: run tools/build-cluster-binaries.sh and pass the directory "
        "it prints with --bin-dir (or set WARREN_BIN_DIR)"
    )


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Warren configuration (YAML); default: the embedded defaults.",
)
kubeconfig_option = click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Cluster to use; default: the local cluster's admin kubeconfig.",
)


@click.group()
@click.version_option(package_name="warren")
def main() -> None:
    """Warren: sandboxes that fork, on your own infrastructure."""


# -- cluster ---------------------------------------------------------------------------


@main.group()
def cluster() -> None:
    """The local single-node cluster built from pinned sources."""


def _local(config_path: Path | None, bin_dir: Path | None, need_bins: bool = True) -> LocalCluster:
    cfg = _config(config_path)
    # down and status never start a binary, so they work even when no binaries are found.
    try:
        bins = _bin_dir(bin_dir)
    except click.ClickException:
        if need_bins:
            raise
        bins = Path()
    from warren.node.joined import joined_nodes
    from warren.node.provider import LocalNode

    state = paths.cluster_state_dir()
    # A node that ran before is torn down even if the configuration no longer enables it.
    has_node = cfg.cluster.node.enabled or (not need_bins and (state / "node").is_dir())
    nodes: list[NodeProvider] = [LocalNode(cfg, progress=_say)] if has_node else []
    nodes += joined_nodes(cfg, state, _say, leftovers=not need_bins)
    return LocalCluster(cfg.cluster, state, bins, nodes=nodes, progress=_say)


bin_dir_option = click.option(
    "--bin-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Directory with etcd, kube-apiserver, ... (tools/build-cluster-binaries.sh prints it).",
)


@cluster.command("up")
@config_option
@bin_dir_option
def cluster_up(config_path: Path | None, bin_dir: Path | None) -> None:
    """Start (or converge) the local cluster and wait until it is ready."""
    local = _local(config_path, bin_dir)
    try:
        local.up()
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(local.kubeconfig)


@cluster.command("down")
@click.option("--wipe", is_flag=True, help="Also delete the cluster's state (etcd data, certificates).")
@config_option
def cluster_down(wipe: bool, config_path: Path | None) -> None:
    """Stop exactly the processes `up` started."""
    local = _local(config_path, None, need_bins=False)
    try:
        stopped = local.down(wipe=wipe)
    except ClusterError as exc:
        raise click.ClickException(str(exc)) from None
    _say(f"stopped {len(stopped)} process(es)" + (" and wiped state" if wipe else ""))


@cluster.command("status")
@config_option
def cluster_status(config_path: Path | None) -> None:
    """Each component's process and health; exits 1 unless all are healthy."""
    local = _local(config_path, None, need_bins=False)
    rows = local.status()
    table = Table("component", "pid", "health", "detail", "log")
    for row in rows:
        health = "[green]healthy[/green]" if row.healthy else "[red]down[/red]"
        table.add_row(row.name, str(row.pid or "-"), health, row.detail[:40], str(row.log))
    out = Console()
    if not out.is_terminal:  # logs and pipes get full lines, not a table squeezed to 80 columns
        out = Console(width=200)
    out.print(table)
    if not rows or not all(r.healthy for r in rows):
        sys.exit(1)


@cluster.command("kubeconfig")
def cluster_kubeconfig() -> None:
    """Print the path of the local cluster's admin kubeconfig."""
    click.echo(paths.admin_kubeconfig())


# -- control plane ---------------------------------------------------------------------


@main.group("control-plane")
def control_plane() -> None:
    """Helpers for installing warren-control (the control_plane role uses them)."""


@control_plane.command("kubeconfig")
@click.option(
    "--admin-kubeconfig",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    required=True,
    help="A kubeconfig that may read Secrets in warren-system (the cluster's admin).",
)
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), required=True)
@click.option("--check", is_flag=True, help="Only say whether OUTPUT would change; write nothing.")
def control_plane_kubeconfig(admin_kubeconfig: Path, output: Path, check: bool) -> None:
    """Write (0600) a kubeconfig for the control plane's own ServiceAccount, warren-controller,
    unless OUTPUT already holds it. Prints JSON saying whether it changed (for installers)."""
    import json

    from warren_common.files import write_private

    from warren.controlplane import access

    try:
        token = access.service_account_token(admin_kubeconfig)
    except (access.AccessError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    wanted = access.kubeconfig_for_token(admin_kubeconfig, token)
    if check:
        changed = not (output.is_file() and output.read_text() == wanted)
    else:
        changed = write_private(output, wanted)
    click.echo(json.dumps({"changed": changed, "path": str(output)}))


@main.group("service")
def service() -> None:
    """Run a service unit (written by Warren's roles) without systemd, under Warren's supervisor."""


state_dir_option = click.option(
    "--state-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where pid records and logs live; default: the local cluster's state (so "
    "`warren cluster down` stops the service too).",
)


def _supervisor(state_dir: Path | None) -> Supervisor:
    from warren.cluster.process import Supervisor

    return Supervisor(state_dir or paths.cluster_state_dir())


@service.command("up")
@click.argument("unit_file", type=click.Path(path_type=Path, dir_okay=False))
@state_dir_option
@click.option("--health-url", default="", help="Healthy once this URL answers 200.")
@click.option("--health-command", default="", help="Healthy once this command exits 0 (split like a shell).")
@click.option("--timeout", type=int, default=120, show_default=True, help="Seconds to wait for health.")
@click.option("--check", is_flag=True, help="Only say what would change (for ansible --check).")
@click.option("--restart", is_flag=True, help="Restart even if unchanged (a file it reads changed).")
def service_up(  # noqa: PLR0917 (click passes every option by position)
    unit_file: Path,
    state_dir: Path | None,
    health_url: str,
    health_command: str,
    timeout: int,
    check: bool,
    restart: bool,
) -> None:
    """Start UNIT_FILE's ExecStart, or restart it if the unit or its environment changed, or
    leave it. Prints one JSON line: name, action (unchanged|started|restarted), changed, pid."""
    import json
    import shlex

    from warren.cluster.components import Health
    from warren.services import runner, unit

    try:
        loaded = unit.load(unit_file)
        health = Health(url=health_url, command=tuple(shlex.split(health_command)))
        done = runner.up(
            _supervisor(state_dir),
            loaded,
            health if (health_url or health_command) else None,
            timeout=timeout,
            progress=_say,
            check=check,
            restart=restart,
        )
    except (unit.UnitError, ClusterError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        json.dumps({"name": done.name, "action": done.action, "changed": done.changed, "pid": done.pid})
    )


@service.command("down")
@click.argument("name")
@state_dir_option
@click.option("--unit-file", type=click.Path(path_type=Path, dir_okay=False), help="For its TimeoutStopSec.")
@click.option("--check", is_flag=True, help="Only say whether it runs (would be stopped); stop nothing.")
def service_down(name: str, state_dir: Path | None, unit_file: Path | None, check: bool) -> None:
    """Stop the service NAME (SIGTERM, then SIGKILL after its stop timeout). Prints JSON."""
    import json

    from warren.services import runner, unit

    supervisor = _supervisor(state_dir)
    if check:
        stopped = supervisor.running(name) is not None
    else:
        loaded = unit.load(unit_file) if unit_file and unit_file.is_file() else None
        stopped = runner.down(supervisor, loaded, name)
    click.echo(json.dumps({"name": name, "changed": stopped}))


@service.command("status")
@click.argument("name")
@state_dir_option
def service_status(name: str, state_dir: Path | None) -> None:
    """Whether NAME runs (JSON); exits 1 if it does not."""
    import json

    supervisor = _supervisor(state_dir)
    record = supervisor.running(name)
    click.echo(
        json.dumps(
            {
                "name": name,
                "running": record is not None,
                "pid": record.pid if record else None,
                "log": str(supervisor.log_path(name)),
            }
        )
    )
    if record is None:
        sys.exit(1)


# Everything after `sandbox`, --help included, goes to warren-control's own parser.
PASS_THROUGH = {"ignore_unknown_options": True, "allow_interspersed_args": False, "help_option_names": []}


@main.command(context_settings=PASS_THROUGH)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def sandbox(args: tuple[str, ...]) -> None:
    """Sandboxes through the API: create, get, list, delete, fork, exec, stop, start, read-file,
    write-file, keepalive (`warren sandbox --help`). Talks to --url / WARREN_URL with --api-key /
    WARREN_API_KEY, by default the control plane deployed here."""
    _through_control("sandbox", args)


@main.command(context_settings=PASS_THROUGH)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def secret(args: tuple[str, ...]) -> None:
    """The organization's secrets, which the egress gateway adds to sandboxes' requests:
    create, update, list, get, revoke, uses (`warren secret --help`; docs/secrets.md). Values
    go in, never out. The same API as `warren sandbox`."""
    _through_control("secret", args)


def _through_control(command: str, args: tuple[str, ...]) -> None:
    """`warren-control COMMAND ARGS`, with the control plane deployed here as the default."""
    try:
        from warren_control import cli as control_cli
    except ImportError:
        raise click.ClickException("warren-control is not installed here: run `make venv`") from None
    from warren.controlplane.local import local_api_key, local_url

    state = paths.cluster_state_dir()
    for variable, fallback in (("WARREN_URL", local_url), ("WARREN_API_KEY", local_api_key)):
        if not os.environ.get(variable) and (found := fallback(state)):
            os.environ[variable] = found
    sys.exit(control_cli.main([command, *args]))


# -- render / apply ----------------------------------------------------------------------


@main.group("config")
def config_group() -> None:
    """The typed configuration every part is rendered from."""


@config_group.command("show")
@config_option
def config_show(config_path: Path | None) -> None:
    """Validate the configuration and print it, defaults filled in, as JSON (installers read
    their ports and names from it, so Ansible and the CLI cannot disagree)."""
    import json

    cfg = _config(config_path)
    click.echo(json.dumps(cfg.model_dump(mode="json"), indent=2, sort_keys=True))


local_node_option = click.option(
    "--local-node",
    is_flag=True,
    help="For the local cluster's node: its kubelet directory, host paths under its state, "
    "images imported (never pulled) and pinned by the digests the node holds, unless the "
    "configuration sets them.",
)


def _for_local_node(cfg: WarrenConfig) -> WarrenConfig:
    from warren.node import images
    from warren.node.layout import NodeLayout
    from warren.node.workloads import NODE_DIR, LocalNodeError, for_local_node

    state = paths.cluster_state_dir()
    if not cfg.services.enabled:
        return cfg
    node = NodeLayout(state / NODE_DIR)
    if not node.containerd_socket.exists():
        raise click.ClickException(
            f"no local node runs here ({node.containerd_socket} is missing): "
            "start it with `warren cluster up`"
        )
    try:
        return for_local_node(cfg, state, images.imported(_bin_dir(None), node))
    except LocalNodeError as exc:
        raise click.ClickException(str(exc)) from None


bundle_option = click.option(
    "--bundle",
    "bundle_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="An extracted air-gapped bundle the nodes get Warren's images from: the workloads are "
    "pinned by the digests its manifest records (never pulled by tag).",
)


def _with_images(cfg: WarrenConfig, local_node: bool, bundle_dir: Path | None) -> WarrenConfig:
    """`cfg` for the local node, or pinned by the bundle's digests, or as it is."""
    if local_node and bundle_dir:
        raise click.UsageError(
            "--local-node and --bundle exclude each other: the local node builds its own images"
        )
    if local_node:
        return _for_local_node(cfg)
    if bundle_dir:
        from warren.bundle import BundleError
        from warren.bundle.workloads import for_bundle

        try:
            return for_bundle(cfg, bundle_dir)
        except BundleError as exc:
            raise click.ClickException(str(exc)) from None
    return cfg


@main.command()
@config_option
@local_node_option
@bundle_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("rendered"),
    show_default=True,
    help="Directory to write the rendered YAML into.",
)
def render(config_path: Path | None, local_node: bool, bundle_dir: Path | None, out_dir: Path) -> None:
    """Render every Kubernetes object of the platform to YAML files."""
    from warren.render import write

    cfg = _with_images(_config(config_path), local_node, bundle_dir)
    for path in write(cfg, out_dir):
        click.echo(path)


@main.command()
@config_option
@kubeconfig_option
@local_node_option
@bundle_option
@click.option("--dry-run", is_flag=True, help="Server-side dry run: validate, change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON (for installers).")
def apply(  # noqa: PLR0917 (click passes every option by position)
    config_path: Path | None,
    kubeconfig: Path | None,
    local_node: bool,
    bundle_dir: Path | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Apply the rendered objects with server-side apply."""
    import json

    from warren import kube
    from warren.render import render as render_objects

    # Validated (the bundle's images included) before anything touches the cluster.
    cfg = _with_images(_config(config_path), local_node, bundle_dir)
    objects = render_objects(cfg)
    try:
        api = kube.api_client(kubeconfig or paths.admin_kubeconfig())
        changed = kube.apply(api, objects, progress=_say, dry_run=dry_run)
    except (FileNotFoundError, RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    verb = "would change" if dry_run else "changed"
    _say(f"{'validated' if dry_run else 'applied'} {len(objects)} objects; {verb} {len(changed)}")
    if as_json:
        click.echo(
            json.dumps({"changed": bool(changed), "objects": len(objects), "changed_objects": changed})
        )


# -- Warren's services on a cluster ---------------------------------------------------------


@main.group()
def platform() -> None:
    """Warren's own services on a cluster: their rollout and where they answer."""


@platform.command("ready")
@config_option
@kubeconfig_option
@click.option("--timeout", type=click.IntRange(1, 7200), default=900, show_default=True, help="Seconds.")
@click.option(
    "--record",
    "record_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Write the edge's URL and the first API key here (0600) for `warren sandbox`.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON (for installers).")
def platform_ready(
    config_path: Path | None, kubeconfig: Path | None, timeout: int, record_dir: Path | None, as_json: bool
) -> None:
    """Wait until every workload of warren-system is rolled out and ready (the install Job of
    this version complete), then say where the API is."""
    import base64
    import json

    from kubernetes import client as k8s

    from warren import kube, rollout
    from warren.config import SYSTEM_NAMESPACE
    from warren.controlplane.local import record

    cfg = _config(config_path)
    if not cfg.services.enabled:
        raise click.ClickException("services.enabled is false: Warren's services are not workloads here")
    try:
        api = kube.api_client(kubeconfig or paths.admin_kubeconfig())
        rollout.wait_ready(api, cfg, timeout, progress=_say)
        url = rollout.edge_url(api)
        try:
            secret: Any = k8s.CoreV1Api(api).read_namespaced_secret("warren-first-key", SYSTEM_NAMESPACE)
            key: str | None = base64.b64decode(secret.data["key"]).decode()
        except k8s.ApiException as exc:
            if exc.status != 404:  # noqa: PLR2004
                raise
            key = None  # made by an earlier install and since removed by the operator
    except (FileNotFoundError, rollout.RolloutError) as exc:
        raise click.ClickException(str(exc)) from None
    changed = record(record_dir, url, key) if record_dir else False
    _say(f"the API answers at {url}")
    if as_json:
        key_file = str(record_dir / "api-key") if record_dir and (record_dir / "api-key").is_file() else None
        click.echo(json.dumps({"changed": changed, "url": url, "key_file": key_file}))


@platform.command("store-secrets")
@config_option
@kubeconfig_option
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON (for installers).")
def platform_store_secrets(
    config_path: Path | None, kubeconfig: Path | None, dry_run: bool, as_json: bool
) -> None:
    """Make or update the external stores' Secrets in warren-system (services.stores:
    external) from a JSON object on stdin: {"database_url": "postgresql+psycopg://...",
    "object_store_credentials": "<the object store's credentials.env>"}. Prints each
    Secret's name and what happened to it, never a value."""
    import json

    from kubernetes.client.exceptions import ApiException

    from warren import kube
    from warren.store_secrets import StoreSecretsError, apply, wanted

    cfg = _config(config_path)
    try:
        document = json.loads(sys.stdin.read())
    except json.JSONDecodeError as exc:
        # The position only: the input holds credentials.
        raise click.ClickException(f"stdin is not JSON (line {exc.lineno}, column {exc.colno})") from None
    try:
        secrets = wanted(document, cfg)
        api = kube.api_client(kubeconfig or paths.admin_kubeconfig())
        outcome = apply(api, cfg, secrets, dry_run=dry_run, progress=_say)
    except (StoreSecretsError, FileNotFoundError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None
    except ApiException as exc:
        raise click.ClickException(f"the API server refused: {exc.status} {exc.reason}") from None
    if as_json:
        changed = any(what != "unchanged" for what in outcome.values())
        click.echo(json.dumps({"changed": changed, "secrets": outcome}))


# -- images ------------------------------------------------------------------------------


@main.group()
def image() -> None:
    """OCI images made from local files: no registry involved."""


@image.command("build")
@click.argument("names", nargs=-1)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("images"),
    show_default=True,
    help="Directory for the OCI image archives.",
)
@click.option(
    "--import",
    "import_into",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also import them into the containerd listening on this socket (namespace k8s.io); "
    "repeat it for each node of the local cluster.",
)
@bin_dir_option
@click.option(
    "--apt-sources",
    "apt_sources",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="An apt source file (.list or .sources) naming the Debian mirror the userland of the "
    "service images and of the base image comes from, instead of the host's own sources (a "
    "build host that is not Debian). Repeatable.",
)
@click.option(
    "--registry",
    default="warren.dev",
    show_default=True,
    help="Name prefix of the service and sandbox images (an operator's registry, e.g. "
    "registry.example:5000/warren).",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was built and imported as JSON.")
def image_build(  # noqa: PLR0917 (click passes every option by position)
    names: tuple[str, ...],
    out_dir: Path,
    import_into: tuple[Path, ...],
    bin_dir: Path | None,
    registry: str,
    as_json: bool,
    apt_sources: tuple[Path, ...] = (),
) -> None:
    """Build image archives: busybox, pause, coredns (from local files), Warren's services
    warren-control, warren-blockd, seaweedfs, postgres (a Debian userland from Debian's
    packages plus this checkout's wheels; as root), and the sandbox images agent (the
    in-sandbox agent alone, built with Go) and base (the sandbox template: a Debian userland
    with the agent; as root). Default: all. With --import, an image the node already holds
    with the same digest is left alone."""
    import json

    from warren.bundle import BundleError, build, cache
    from warren.images import sandbox
    from warren.images.rootfs import ImageError
    from warren.images.services import SERVICES, build_from_checkout
    from warren.node import images

    local = {"busybox", "pause", "coredns"}
    services = {s.name for s in SERVICES}
    sandboxes = set(sandbox.IMAGES)
    every = local | services | sandboxes
    wanted = set(names) or every
    unknown = wanted - every
    if unknown:
        raise click.ClickException(
            f"unknown image {', '.join(sorted(unknown))}: choose from {', '.join(sorted(every))}"
        )
    made = []
    try:
        if wanted & local:
            made += images.build_all(_bin_dir(bin_dir), out_dir, only=wanted & local)
        if wanted & services:
            made += build_from_checkout(
                build.find_repo(Path.cwd()),
                out_dir.absolute(),
                cache.default_root().absolute(),
                registry=registry,
                only=sorted(wanted & services),
                progress=_say,
                apt_sources=[path.absolute() for path in apt_sources] or None,
            )
        if wanted & sandboxes:
            made += sandbox.build_from_checkout(
                build.find_repo(Path.cwd()),
                out_dir.absolute(),
                cache.default_root().absolute(),
                registry=registry,
                only=sorted(wanted & sandboxes),
                progress=_say,
                apt_sources=[path.absolute() for path in apt_sources] or None,
            )
    except (BundleError, ImageError) as exc:
        raise click.ClickException(str(exc)) from None
    for built in made:
        if not as_json:
            click.echo(
                f"{built.name}\t{built.manifest_digest}\t{built.archive}\tsha256:{built.archive_sha256}"
            )
    imported: list[str] = []
    for socket in import_into:
        try:
            imported += images.import_built(_bin_dir(bin_dir), socket, made, _say)
        except ClusterError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        digests = {b.name: b.manifest_digest for b in made}
        click.echo(json.dumps({"changed": bool(imported), "imported": imported, "digests": digests}))


# `warren image import` and `push` take either archives or the bundle's service images.
archives_argument = click.argument(
    "archives", nargs=-1, type=click.Path(path_type=Path, dir_okay=False, exists=True)
)
bundle_images_option = click.option(
    "--bundle",
    "bundle_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Instead of ARCHIVES: the service images the configuration's workloads run, from this "
    "extracted bundle.",
)


@image.command("import")
@archives_argument
@bundle_images_option
@config_option
@click.option(
    "--containerd",
    "socket",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The node's containerd socket, e.g. /run/containerd/containerd.sock (namespace k8s.io).",
)
@bin_dir_option
@click.option("--dry-run", is_flag=True, help="Say what would be imported; import nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print what was imported as JSON (for installers).")
def image_import(  # noqa: PLR0917 (click passes every option by position)
    archives: tuple[Path, ...],
    bundle_dir: Path | None,
    config_path: Path | None,
    socket: Path,
    bin_dir: Path | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Import OCI image archives into a node's containerd (with `ctr` from --bin-dir), only
    those it does not hold with the same digest (a bundle's checked against the digests its
    manifest pins), each also named by its digest so that
    workloads pinned by digest find it without a registry."""
    import json

    from warren.bundle import BundleError
    from warren.bundle.images import workload_images
    from warren.images import Built
    from warren.images.registry import RegistryError, archive_image
    from warren.node import images

    if bool(archives) == bool(bundle_dir):
        raise click.UsageError("give either ARCHIVES or --bundle")
    made: list[Built] = []
    try:
        if bundle_dir:
            services = _config(config_path).services
            for found in workload_images(bundle_dir, services.image_tag, services.stores):
                name, digest = archive_image(found.archive)
                if (name, digest) != (found.name, found.digest):
                    raise BundleError(
                        f"{found.archive} holds {name} at {digest}, but the bundle's manifest pins "
                        f"{found.name} at {found.digest}: copy the bundle again (`warren bundle verify`)"
                    )
                made.append(Built(found.name, found.archive, found.digest, found.archive_sha256))
        else:
            from warren.bundle.manifest import hash_file

            for archive in archives:
                name, digest = archive_image(archive)
                made.append(Built(name, archive, digest, hash_file(archive)[1]))
        if not socket.exists():
            raise ClusterError(f"no containerd socket at {socket}: start containerd, or pass its socket")
        done = images.import_built(_bin_dir(bin_dir), socket, made, _say, dry_run=dry_run)
    except (BundleError, RegistryError, ClusterError) as exc:
        raise click.ClickException(str(exc)) from None
    if dry_run:
        for name in done:
            _say(f"would import {name}")
    if as_json:
        digests = {b.name: b.manifest_digest for b in made}
        click.echo(json.dumps({"changed": bool(done), "imported": done, "digests": digests}))


@image.command("push")
@archives_argument
@bundle_images_option
@config_option
@click.option(
    "--registry",
    help="Where to push: HOST[:PORT][/PATH]; each image keeps its own name and tag below it. "
    "Default with --bundle: the configuration's services.image_registry.",
)
@click.option(
    "--tls-verify/--no-tls-verify", default=True, show_default=True, help="Check the registry's TLS."
)
@click.option(
    "--authfile",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Registry credentials in containers-auth.json form (skopeo login writes one).",
)
@click.option("--dry-run", is_flag=True, help="Say what would be pushed; push nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print what was pushed as JSON (for installers).")
def image_push(  # noqa: PLR0917 (click passes every option by position)
    archives: tuple[Path, ...],
    bundle_dir: Path | None,
    config_path: Path | None,
    registry: str | None,
    tls_verify: bool,
    authfile: Path | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Push OCI image archives (`warren image build`, the bundle's images/) to an operator's
    registry with skopeo, each unless the registry already serves it with the same digest;
    prints each image's reference and digest."""
    import json

    from warren.bundle import BundleError
    from warren.bundle.images import workload_images
    from warren.images.registry import RegistryError, push

    if bool(archives) == bool(bundle_dir):
        raise click.UsageError("give either ARCHIVES or --bundle")
    if bundle_dir:
        services = _config(config_path).services
        if registry and registry != services.image_registry:
            # The workloads name the configuration's registry: images elsewhere would not be found.
            raise click.UsageError(
                f"--registry {registry} is not the configuration's services.image_registry "
                f"({services.image_registry}): set that instead, or leave --registry out"
            )
        registry = services.image_registry
        if registry == DEFAULT_IMAGE_REGISTRY:
            raise click.UsageError(
                f"services.image_registry is {registry}, the name the images are built under, which "
                "no registry serves: set it to your registry (or import the images into the nodes "
                "with `warren image import --bundle`)"
            )
        try:
            archives = tuple(
                i.archive for i in workload_images(bundle_dir, services.image_tag, services.stores)
            )
        except BundleError as exc:
            raise click.ClickException(str(exc)) from None
    if not registry:
        raise click.UsageError("--registry is required with ARCHIVES")
    results = []
    for archive in archives:
        try:
            pushed = push(archive, registry, tls_verify=tls_verify, authfile=authfile, dry_run=dry_run)
        except RegistryError as exc:
            raise click.ClickException(str(exc)) from None
        results.append(pushed)
        if not pushed.changed:
            _say(f"{pushed.reference} is served already")
        elif dry_run:
            _say(f"would push {pushed.reference}")
        if not as_json:
            click.echo(f"{pushed.reference}\t{pushed.digest}")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "changed": any(p.changed for p in results),
                    "pushed": [p.reference for p in results if p.changed],
                    "digests": {p.reference: p.digest for p in results},
                }
            )
        )


# -- bundle ------------------------------------------------------------------------------


@main.group()
def bundle() -> None:
    """The air-gapped bundle: every artifact an install without a network needs, in one archive."""


@bundle.command("build")
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Archive to write (.tar.gz); default: dist/warren-bundle-<version>.tar.gz in the checkout.",
)
@click.option(
    "--cache",
    "cache_dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Cache for the slow parts (wheels, Debian packages); default: $WARREN_CACHE/bundle.",
)
@click.option(
    "--pulumi/--no-pulumi",
    default=True,
    show_default=True,
    help="Include the Pulumi binaries when tools/build-pulumi.sh can build them.",
)
def bundle_build(output: Path | None, cache_dir: Path | None, pulumi: bool) -> None:
    """Build the bundle from this checkout (run it on a connected Debian machine of the target release).

    Writes the archive, FILE.manifest.json and FILE.sha256 beside it; prints the archive's path.
    """
    from warren.bundle import BundleError, build, cache

    try:
        repo = build.find_repo(Path.cwd())
        result = build.build(
            repo,
            (output or build.default_output(repo)).absolute(),
            (cache_dir or cache.default_root()).absolute(),
            progress=_say,
            with_pulumi=pulumi,
        )
    except BundleError as exc:
        raise click.ClickException(str(exc)) from None
    table = Table("part", "files", "MiB (uncompressed)")
    for part, (files, size) in result.parts().items():
        table.add_row(part, str(files), f"{size / 2**20:.1f}")
    console.print(table)
    for note in result.manifest.notes:
        _say(f"note: {note}")
    _say(
        f"{result.archive_size / 2**20:.1f} MiB written in {result.seconds['total']:.0f} s "
        f"({', '.join(f'{k} {v:.0f} s' for k, v in result.seconds.items() if k != 'total')})"
    )
    click.echo(result.archive)


@bundle.command("verify")
@click.argument("target", type=click.Path(path_type=Path))
def bundle_verify(target: Path) -> None:
    """Check an archive (or a directory it was extracted to) against its manifest.

    Exits 1 naming every changed, missing or extra file; nothing is written.
    """
    from warren.bundle.verify import verify

    report = verify(target, _say)
    if not report.ok:
        raise click.ClickException(report.summary())
    click.echo(report.summary())


@bundle.command("extract")
@click.argument("archive", type=click.Path(path_type=Path, dir_okay=False))
@click.argument("dest", type=click.Path(path_type=Path, file_okay=False))
def bundle_extract(archive: Path, dest: Path) -> None:
    """Verify ARCHIVE, then extract it into DEST (new or empty; one holding this bundle is left as it is).

    Nothing is written unless the whole archive verifies.
    """
    from warren.bundle import BundleError
    from warren.bundle.extract import extract

    try:
        outcome, report = extract(archive, dest, _say)
    except BundleError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{dest}: {outcome.value} ({report.checked_files} files verified)")


# -- conformance -------------------------------------------------------------------------


def _needs_extra(extra: str, module: str, command: str) -> None:
    """Stop with the fix when an optional part's dependency is not installed (the core
    install leaves out ansible-core and pytest)."""
    from importlib.util import find_spec

    if find_spec(module) is None:
        raise click.ClickException(
            f"{command} needs warren's `{extra}` extra, and {module} is not installed here: "
            f"pip install 'warren[{extra}]'"
        )


@main.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--kubeconfig",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    required=True,
    help="The cluster to prove.",
)
@click.option("--junitxml", type=click.Path(path_type=Path, dir_okay=False), help="Write JUnit XML here.")
@config_option
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def conformance(
    kubeconfig: Path, junitxml: Path | None, config_path: Path | None, pytest_args: tuple[str, ...]
) -> None:
    """Run the conformance suite against any cluster (extra arguments go to pytest)."""
    _needs_extra("conformance", "pytest", "warren conformance")
    from warren.conformance.runner import run

    _config(config_path)  # fail early on a bad file
    sys.exit(run(kubeconfig, junitxml, config_path, list(pytest_args)))


if __name__ == "__main__":
    main()
