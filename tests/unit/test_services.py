"""Service units as the roles write them, read and run without systemd: parsing (and refusing
what the supervisor cannot honour), then real processes started, left alone, restarted
when the unit's environment changes, checked without acting, and stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from warren_common.testing import wait_for

from warren.cli import main
from warren.cluster.components import Health
from warren.cluster.local import ClusterError
from warren.cluster.process import Supervisor
from warren.services import runner
from warren.services.unit import UnitError, load, parse

UNIT = """\
[Unit]
Description=a test service
After=network-online.target

[Service]
Type=simple
ExecStart=/bin/sleep 300
Environment="A=one two" B=2
EnvironmentFile={env_file}
TimeoutStopSec=3min
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def write_unit(tmp_path: Path, text: str | None = None, name: str = "svc") -> Path:
    env_file = tmp_path / f"{name}.env"
    if not env_file.exists():
        env_file.write_text("# credentials\nROTATES='v1'\nB=from-file\n")
    path = tmp_path / f"{name}.service"
    path.write_text((text or UNIT).format(env_file=env_file))
    return path


def test_a_unit_reads_as_systemd_would(tmp_path: Path) -> None:
    unit = load(write_unit(tmp_path))
    assert unit.name == "svc"
    assert unit.argv == ("/bin/sleep", "300")
    assert unit.stop_timeout_s == 180
    # The environment file comes after Environment= and wins, as in systemd.
    assert unit.environment() == {"A": "one two", "B": "from-file", "ROTATES": "v1"}


@pytest.mark.parametrize(
    ("service", "says"),
    [
        ("ExecStart=sleep 1", "absolute path"),
        ("ExecStart=/bin/true\nExecStart=/bin/false", "exactly one ExecStart"),
        ("ExecStart=/bin/true\nDynamicUser=yes", "DynamicUser not supported without systemd"),
        ("ExecStart=/bin/true\nTimeoutStopSec=soon", "is not seconds"),
        ("ExecStart=/bin/true\nEnvironment=NOEQUALS", "is not KEY=VALUE"),
    ],
)
def test_what_the_supervisor_cannot_honour_is_refused(service: str, says: str) -> None:
    with pytest.raises(UnitError, match=says):
        parse(f"[Service]\n{service}\n", "bad")


def test_a_missing_environment_file_is_named_unless_optional(tmp_path: Path) -> None:
    unit = parse(f"[Service]\nExecStart=/bin/true\nEnvironmentFile=-{tmp_path}/none\n", "opt")
    assert unit.environment() == {}
    unit = parse(f"[Service]\nExecStart=/bin/true\nEnvironmentFile={tmp_path}/none\n", "req")
    with pytest.raises(UnitError, match="does not exist"):
        unit.environment()


def environ_of(pid: int) -> dict[str, str]:
    """The service's environment once it runs its own program: until the new process execs,
    /proc shows the environment it was forked with, without the unit's."""

    def read() -> dict[str, str] | None:
        raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        found = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
        return found if "ROTATES" in found else None

    return wait_for(read, 10, f"process {pid} to run with the unit's environment", interval=0.05)


def test_up_starts_leaves_restarts_and_down_stops(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path / "state")
    path = write_unit(tmp_path)
    started = runner.up(supervisor, load(path), None, timeout=10)
    assert (started.action, started.changed) == ("started", True)
    assert started.pid is not None and environ_of(started.pid)["ROTATES"] == "v1"

    again = runner.up(supervisor, load(path), None, timeout=10)
    assert (again.action, again.pid) == ("unchanged", started.pid)

    # A rotated credential: check mode says so and changes nothing; up restarts.
    (tmp_path / "svc.env").write_text("ROTATES=rotated\n")
    planned = runner.up(supervisor, load(path), None, timeout=10, check=True)
    assert (planned.action, planned.pid) == ("restarted", started.pid)
    restarted = runner.up(supervisor, load(path), None, timeout=10)
    assert restarted.action == "restarted" and restarted.pid not in (None, started.pid)
    assert restarted.pid is not None and environ_of(restarted.pid)["ROTATES"] == "rotated"
    with pytest.raises(ProcessLookupError):
        os.kill(started.pid, 0)

    assert runner.down(supervisor, load(path), "svc") is True
    assert supervisor.running("svc") is None
    assert runner.down(supervisor, load(path), "svc") is False


def test_an_unhealthy_service_fails_up_and_names_its_log(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path / "state")
    path = write_unit(tmp_path, "[Service]\nExecStart=/bin/sleep 300\n", name="sick")
    with pytest.raises(ClusterError, match="not healthy"):
        runner.up(supervisor, load(path), Health(command=("false",)), timeout=2)
    supervisor.stop("sick")


def test_the_cli_prints_what_it_did_as_json(tmp_path: Path) -> None:
    path = write_unit(tmp_path, "[Service]\nExecStart=/bin/sleep 300\n", name="cli")
    state = str(tmp_path / "state")
    cli = CliRunner()
    first = cli.invoke(main, ["service", "up", str(path), "--state-dir", state, "--health-command", "true"])
    assert first.exit_code == 0, first.output
    said = json.loads(first.stdout.strip().splitlines()[-1])
    assert said["action"] == "started" and said["changed"] is True
    second = cli.invoke(main, ["service", "up", str(path), "--state-dir", state])
    assert json.loads(second.stdout.strip().splitlines()[-1])["changed"] is False
    status = cli.invoke(main, ["service", "status", "cli", "--state-dir", state])
    assert status.exit_code == 0 and json.loads(status.stdout)["pid"] == said["pid"]
    planned = cli.invoke(main, ["service", "down", "cli", "--state-dir", state, "--check"])
    assert json.loads(planned.stdout) == {"name": "cli", "changed": True}
    assert cli.invoke(main, ["service", "status", "cli", "--state-dir", state]).exit_code == 0
    down = cli.invoke(main, ["service", "down", "cli", "--state-dir", state])
    assert json.loads(down.stdout) == {"name": "cli", "changed": True}
    assert cli.invoke(main, ["service", "status", "cli", "--state-dir", state]).exit_code == 1
    for check in ((), ("--check",)):
        again = cli.invoke(main, ["service", "down", "cli", "--state-dir", state, *check])
        assert json.loads(again.stdout) == {"name": "cli", "changed": False}


def test_restart_is_forced_when_asked(tmp_path: Path) -> None:
    supervisor = Supervisor(tmp_path / "state")
    path = write_unit(tmp_path, "[Service]\nExecStart=/bin/sleep 300\n", name="forced")
    first = runner.up(supervisor, load(path), None, timeout=10)
    again = runner.up(supervisor, load(path), None, timeout=10, restart=True)
    assert again.action == "restarted" and again.pid != first.pid
    supervisor.stop("forced")


def test_a_kill_signal_is_read_and_a_wrong_one_named() -> None:
    import signal

    unit = parse("[Service]\nExecStart=/bin/true\nKillSignal=SIGINT\n", "pg")
    assert unit.kill_signal is signal.SIGINT
    assert parse("[Service]\nExecStart=/bin/true\nKillSignal=INT\n", "pg").kill_signal is signal.SIGINT
    with pytest.raises(UnitError, match="not a signal name"):
        parse("[Service]\nExecStart=/bin/true\nKillSignal=SIGNOPE\n", "pg")
