"""The `warren` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from warren import paths
from warren.cluster.local import BIN_DIR_RECORD, ClusterError, LocalCluster
from warren.config import ConfigError, WarrenConfig, load_config

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
    from warren.node.provider import LocalNode

    state = paths.cluster_state_dir()
    # A node that ran before is torn down even if the configuration no longer enables it.
    has_node = cfg.cluster.node.enabled or (not need_bins and (state / "node").is_dir())
    nodes = [LocalNode(cfg, progress=_say)] if has_node else []
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
def control_plane_kubeconfig(admin_kubeconfig: Path, output: Path) -> None:
    """Write (0600) a kubeconfig for the control plane's own ServiceAccount, warren-controller,
    unless OUTPUT already holds it. Prints JSON saying whether it changed (for installers)."""
    import json

    from warren.controlplane import access
    from warren.controlplane.local import write_private

    try:
        token = access.service_account_token(admin_kubeconfig)
    except (access.AccessError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    changed = write_private(output, access.kubeconfig_for_token(admin_kubeconfig, token))
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
def service_down(name: str, state_dir: Path | None, unit_file: Path | None) -> None:
    """Stop the service NAME (SIGTERM, then SIGKILL after its stop timeout). Prints JSON."""
    import json

    from warren.services import runner, unit

    loaded = unit.load(unit_file) if unit_file and unit_file.is_file() else None
    stopped = runner.down(_supervisor(state_dir), loaded, name)
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
    try:
        from warren_control import cli as control_cli
    except ImportError:
        raise click.ClickException("warren-control is not installed here: run `make venv`") from None
    from warren.controlplane.local import local_api_key, local_url

    # The same commands as `warren-control sandbox`; only the fallbacks are added here.
    state = paths.cluster_state_dir()
    for variable, fallback in (("WARREN_URL", local_url), ("WARREN_API_KEY", local_api_key)):
        if not os.environ.get(variable) and (found := fallback(state)):
            os.environ[variable] = found
    sys.exit(control_cli.main(["sandbox", *args]))


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


@main.command()
@config_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("rendered"),
    show_default=True,
    help="Directory to write the rendered YAML into.",
)
def render(config_path: Path | None, out_dir: Path) -> None:
    """Render every Kubernetes object of the platform to YAML files."""
    from warren.render import write

    for path in write(_config(config_path), out_dir):
        click.echo(path)


@main.command()
@config_option
@kubeconfig_option
@click.option("--dry-run", is_flag=True, help="Server-side dry run: validate, change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print what changed as JSON (for installers).")
def apply(config_path: Path | None, kubeconfig: Path | None, dry_run: bool, as_json: bool) -> None:
    """Apply the rendered objects with server-side apply."""
    import json

    from warren import kube
    from warren.render import render as render_objects

    cfg = _config(config_path)  # validated before anything touches the cluster
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
    type=click.Path(path_type=Path, dir_okay=False),
    help="Also import them into the containerd listening on this socket (namespace k8s.io).",
)
@bin_dir_option
def image_build(
    names: tuple[str, ...], out_dir: Path, import_into: Path | None, bin_dir: Path | None
) -> None:
    """Build image archives: busybox, pause, coredns (default: all)."""
    import subprocess

    from warren.node import images

    bins = _bin_dir(bin_dir)
    wanted = set(names) or {"busybox", "pause", "coredns"}
    unknown = wanted - {"busybox", "pause", "coredns"}
    if unknown:
        raise click.ClickException(
            f"unknown image {', '.join(sorted(unknown))}: choose busybox, pause, coredns"
        )
    for built in images.build_all(bins, out_dir, only=wanted):
        click.echo(f"{built.name}\t{built.manifest_digest}\t{built.archive}\tsha256:{built.archive_sha256}")
        if import_into:
            subprocess.run(
                [
                    str(bins / "ctr"),
                    "--address",
                    str(import_into),
                    "--namespace",
                    images.NAMESPACE,
                    "images",
                    "import",
                    str(built.archive),
                ],
                check=True,
                capture_output=True,
            )
            _say(f"imported {built.name}")


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
    from warren.conformance.runner import run

    _config(config_path)  # fail early on a bad file
    sys.exit(run(kubeconfig, junitxml, config_path, list(pytest_args)))


if __name__ == "__main__":
    main()
