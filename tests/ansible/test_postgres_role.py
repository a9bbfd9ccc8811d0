"""The postgres role applied to this machine with ansible-playbook, the way an operator runs it.

One deployment per module: the role runs against localhost with Warren's supervisor in place of
systemd, every path in a temporary directory and a free port, and the server is stopped and the
directory removed at the end. Needs root (the server runs as the `postgres` account) and the
distribution's PostgreSQL; `make ansible-test` runs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import testinfra

pytestmark = [pytest.mark.ansible, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
PLAYBOOK = Path(__file__).with_name("postgres.yml")
PG_BIN = Path("/usr/lib/postgresql/15/bin")
SERVICE = "warren-postgres"
RECAP = re.compile(
    r"^localhost\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)


def _unavailable(reason: str) -> None:
    # CI runs these tests on purpose: there a missing precondition fails instead of skipping.
    (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Play:
    rc: int
    ok: int
    changed: int
    unreachable: int
    failed: int
    output: str

    def describe(self) -> str:
        return (
            f"rc={self.rc} ok={self.ok} changed={self.changed} failed={self.failed}"
            f" (changed: {self.changed_tasks()})\n{self.output[-6000:]}"
        )

    def changed_tasks(self) -> list[str]:
        """Names of the tasks that reported a change (for failure messages and checks)."""
        names, current = [], ""
        for line in self.output.splitlines():
            if line.startswith("TASK ["):
                current = line[len("TASK [") :].split("]", 1)[0]
            elif line.startswith("changed:"):
                names.append(current)
        return names


class Deployment:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _free_port()
        self.state_dir = root / "state"
        self.units_dir = root / "units"
        self.data_dir = root / "lib" / "postgres"
        self.config_dir = root / "etc" / "postgres"
        self.credentials = root / "secrets" / "postgres-password"
        self.url_file = root / "secrets" / "database-url"
        self.vars_file = root / "vars.json"
        self.vars_file.write_text(
            json.dumps(
                {
                    "service_manager": "supervisor",
                    "service_warren": str(BIN / "warren"),
                    "service_units_dir": str(self.units_dir),
                    "service_state_dir": str(self.state_dir),
                    "postgres_data_dir": str(self.data_dir),
                    "postgres_config_dir": str(self.config_dir),
                    "postgres_credentials_file": str(self.credentials),
                    "postgres_url_file": str(self.url_file),
                    "postgres_port": self.port,
                }
            )
        )
        self.first: Play | None = None

    @property
    def socket_dir(self) -> Path:
        return self.data_dir.with_name(self.data_dir.name + "-socket")

    def play(self, *args: str) -> Play:
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        done = subprocess.run(
            [str(BIN / "ansible-playbook"), str(PLAYBOOK), "-e", f"@{self.vars_file}", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        output = done.stdout + done.stderr
        recap = RECAP.search(output)
        assert recap, f"no PLAY RECAP in the output:\n{output[-6000:]}"
        counts = {key: int(value) for key, value in recap.groupdict().items()}
        print(f"ansible-playbook {' '.join(args) or '(apply)'}: rc={done.returncode} {counts}")
        return Play(rc=done.returncode, output=output, **counts)

    def url(self) -> str:
        return self.url_file.read_text().strip()

    def stop(self) -> None:
        subprocess.run(
            [
                str(BIN / "warren"),
                "service",
                "down",
                SERVICE,
                "--state-dir",
                str(self.state_dir),
                "--unit-file",
                str(self.units_dir / f"{SERVICE}.service"),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )

    def server_pid(self) -> int:
        status = subprocess.run(
            [str(BIN / "warren"), "service", "status", SERVICE, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 0, status.stdout + status.stderr
        return int(json.loads(status.stdout)["pid"])


def psql(
    url: str, sql: str, *, database: str | None = None, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run SQL with psql over TCP, as the URL (the control plane's) says, optionally changing
    the database or user it names."""
    match = re.fullmatch(r"postgresql\+psycopg://([^:]+):([^@]+)@([^:/]+):(\d+)/(\w+)", url)
    assert match, f"not a postgresql+psycopg URL with user, password, host, port and database: {url!r}"
    url_user, password, host, port, url_db = match.groups()
    conninfo = f"host={host} port={port} dbname={database or url_db} user={user or url_user}"
    return subprocess.run(
        ["psql", "-X", "-w", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", conninfo, "-c", sql],
        env={**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def deployment() -> Iterator[Deployment]:
    if os.geteuid() != 0:
        _unavailable("the postgres role test runs as root (the server runs as the postgres account)")
    if not (PG_BIN / "initdb").exists() or not shutil.which("psql"):
        _unavailable(f"PostgreSQL 15 is not installed ({PG_BIN})")
    if not (BIN / "ansible-playbook").exists():
        _unavailable("no ansible-playbook in .venv: run `make venv`")
    # Not under pytest's temporary root: the postgres account must reach the data directory.
    root = Path(tempfile.mkdtemp(prefix="warren-postgres-role-"))
    root.chmod(0o755)
    (root / "units").mkdir()
    deployed = Deployment(root)
    try:
        deployed.first = deployed.play()
        yield deployed
    finally:
        deployed.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_the_first_run_sets_everything_up(deployment: Deployment) -> None:
    first = deployment.first
    assert first is not None
    assert first.rc == 0 and first.failed == 0 and first.unreachable == 0, first.describe()
    assert first.changed > 0, first.describe()
    changed = first.changed_tasks()
    for task in ("Postgres | Initialise the cluster", "Postgres | Create the role warren"):
        assert any(name.endswith(task) for name in changed), changed


def test_the_url_reaches_an_unprivileged_owner_of_its_database(deployment: Deployment) -> None:
    url = deployment.url()
    assert url.startswith("postgresql+psycopg://warren:")
    assert url.endswith(f"@127.0.0.1:{deployment.port}/warren")
    password = deployment.credentials.read_text().strip()
    assert len(password) >= 32 and f":{password}@" in url

    one = psql(url, "SELECT 1")
    assert (one.returncode, one.stdout.strip()) == (0, "1"), one.stderr
    made = psql(
        url,
        "CREATE TABLE records_probe (id int PRIMARY KEY); INSERT INTO records_probe VALUES (7); "
        "SELECT id FROM records_probe; DROP TABLE records_probe",
    )
    assert made.returncode == 0 and made.stdout.split() == ["7"], made.stderr
    privileges = psql(
        url, "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user"
    )
    assert privileges.stdout.strip() == "f|f|f", privileges.stderr

    # Its password opens its own database only, and never the superuser's account.
    other_db = psql(url, "SELECT 1", database="postgres")
    assert other_db.returncode != 0 and "no pg_hba.conf entry" in other_db.stderr
    as_superuser = psql(url, "SELECT 1", user="postgres")
    assert as_superuser.returncode != 0 and "no pg_hba.conf entry" in as_superuser.stderr


def test_files_process_and_socket_are_locked_down(deployment: Deployment) -> None:
    host = testinfra.get_host("local://")
    for secret in (deployment.credentials, deployment.url_file):
        found = host.file(str(secret))
        assert found.is_file and found.mode == 0o600 and found.user == "root", secret
    data = host.file(str(deployment.data_dir))
    assert data.is_directory and data.mode == 0o700
    assert (data.user, data.group) == ("postgres", "postgres")
    for conf in ("postgresql.conf", "pg_hba.conf"):
        found = host.file(str(deployment.config_dir / conf))
        assert found.mode == 0o640 and (found.user, found.group) == ("root", "postgres"), conf
    assert "scram-sha-256" in host.file(str(deployment.config_dir / "postgresql.conf")).content_string

    pid = deployment.server_pid()
    server = host.process.get(pid=pid)
    assert server.user == "postgres" and server.comm == "postgres"
    assert str(deployment.data_dir) in server.args
    children = host.process.filter(ppid=pid)
    assert children and {child.user for child in children} == {"postgres"}

    listening = [s for s in host.socket.get_listening_sockets() if s.endswith(f":{deployment.port}")]
    assert listening == [f"tcp://127.0.0.1:{deployment.port}"]
    assert host.socket(f"unix://{deployment.socket_dir}/.s.PGSQL.{deployment.port}").is_listening


def test_a_second_run_changes_nothing(deployment: Deployment) -> None:
    pid = deployment.server_pid()
    again = deployment.play()
    assert again.rc == 0 and again.failed == 0, again.describe()
    assert again.changed == 0, again.describe()
    assert deployment.server_pid() == pid


def test_check_and_diff_change_nothing_and_fail_nothing(deployment: Deployment) -> None:
    checked = deployment.play("--check", "--diff")
    assert checked.rc == 0 and checked.failed == 0, checked.describe()
    assert checked.changed == 0, checked.describe()
    password = deployment.credentials.read_text().strip()
    assert password not in checked.output


def test_deleting_the_password_file_rotates_the_password(deployment: Deployment) -> None:
    old_url = deployment.url()
    pid = deployment.server_pid()
    deployment.credentials.unlink()

    planned = deployment.play("--check", "--diff")
    assert planned.rc == 0 and planned.failed == 0 and planned.changed > 0, planned.describe()
    assert not deployment.credentials.exists() and deployment.url() == old_url

    rotated = deployment.play()
    assert rotated.rc == 0 and rotated.failed == 0, rotated.describe()
    changed = rotated.changed_tasks()
    assert any(name.endswith("Postgres | Set the role's password from the password file") for name in changed)
    new_url = deployment.url()
    assert new_url != old_url
    assert deployment.server_pid() == pid  # a new password needs no restart

    works = psql(new_url, "SELECT current_user")
    assert (works.returncode, works.stdout.strip()) == (0, "warren"), works.stderr
    refused = psql(old_url, "SELECT 1")
    assert refused.returncode != 0 and "password authentication failed" in refused.stderr

    settled = deployment.play()
    assert settled.rc == 0 and settled.changed == 0, settled.describe()
