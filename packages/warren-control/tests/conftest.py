"""Fixtures shared by the test modules.

PostgreSQL: a real server from the distribution's package, started here in a temporary directory
and stopped after (`postgres_server`, `postgres_url`, `fresh_postgres_url`).

kwok: one throw-away control plane with kwok's simulated nodes for the scale tier's modules
(`kwok`; tests/kwok_cluster.py), started on first use and shared by them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, text
from warren_common.testing import free_port

if TYPE_CHECKING:
    from kwok_cluster import KwokCluster

# --- PostgreSQL --------------------------------------------------------------------------------

_PG_USER = "warren"
_UNPRIVILEGED = 65534  # nobody: PostgreSQL refuses to run as root


def _unavailable(reason: str) -> None:
    # CI runs these tests on purpose: there a missing server fails instead of skipping.
    (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)


def _postgres_bindir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config:
        found = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(found.stdout.strip())
        if found.returncode == 0 and (candidate / "initdb").exists():
            return candidate
    # Debian keeps the server binaries per major version, off PATH.
    found_initdb = Path("/usr/lib/postgresql").glob("*/bin/initdb")
    versions = sorted(found_initdb, key=lambda initdb: int(initdb.parts[-3]))
    return versions[-1].parent if versions else None


class PostgresServer:
    """One throw-away cluster: trust authentication on a Unix socket only, no durability (fsync
    off) because nothing here outlives the test run."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        # Not under pytest's temporary root: that is private to the user running the tests, and
        # the server may have to run as another one.
        self.root = Path(tempfile.mkdtemp(prefix="warren-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "socket"
        self.port = free_port()
        self._as_root = os.geteuid() == 0

    def _run(self, *argv: str) -> None:
        prefix = (
            ["setpriv", f"--reuid={_UNPRIVILEGED}", f"--regid={_UNPRIVILEGED}", "--clear-groups"]
            if self._as_root
            else []
        )
        done = subprocess.run([*prefix, *argv], cwd=self.root, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{argv[0]} failed: {done.stdout}{done.stderr}{tail}")

    def start(self) -> None:
        self.socket_dir.mkdir()
        if self._as_root:
            for path in (self.root, self.socket_dir):
                os.chown(path, _UNPRIVILEGED, _UNPRIVILEGED)
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            _PG_USER,
            "--auth=trust",
            "--no-locale",
            "--encoding=UTF8",
            "--no-sync",
        )
        options = (
            f"-k {self.socket_dir} -p {self.port} -c listen_addresses='' -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "start",
        )

    def stop(self) -> None:
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{_PG_USER}@/{database}?host={self.socket_dir}&port={self.port}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its SQLAlchemy URL."""
        name = name or f"t_{uuid.uuid4().hex[:16]}"
        engine = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as connection:
                connection.execute(text(f'CREATE DATABASE "{name}" TEMPLATE template0'))
        finally:
            engine.dispose()
        return self.url(name)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = _postgres_bindir()
    if bindir is None:
        _unavailable("no PostgreSQL server binaries (Debian package postgresql)")
        raise AssertionError  # not reached: skip and fail raise
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        _unavailable("running as root needs setpriv (util-linux) to start PostgreSQL unprivileged")
    server = PostgresServer(bindir)
    try:
        server.start()
    except BaseException:
        shutil.rmtree(server.root, ignore_errors=True)
        raise
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """One database for the whole session (tests that share it must not assume it is empty)."""
    return postgres_server.create_database("warren")


@pytest.fixture
def fresh_postgres_url(postgres_server: PostgresServer) -> str:
    """An empty database of its own for one test."""
    return postgres_server.create_database()


# --- product records on either database --------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def records_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of each kind the product records support, not yet migrated."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'records.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database()


_skipped: list[str] = []


# --- kwok --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kwok() -> Iterator[KwokCluster]:
    # Imported here: only the scale tier needs the cluster client and the binaries.
    from kwok_cluster import KwokCluster, missing_binaries, warren_cli

    bin_dir = os.environ.get("WARREN_BIN_DIR")
    if not bin_dir:
        _unavailable(
            "no cluster binaries: set WARREN_BIN_DIR to the directory tools/build-cluster-binaries.sh "
            "prints (tests/run-scale.sh does)"
        )
        raise AssertionError  # not reached: skip and fail raise
    if missing := missing_binaries(Path(bin_dir)):
        _unavailable(f"WARREN_BIN_DIR={bin_dir} lacks {', '.join(missing)}")
    if not warren_cli().exists():
        _unavailable(f"no {warren_cli()}: `make venv` installs the warren command that applies the floor")
    with KwokCluster(Path(bin_dir)) as made:
        yield made


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """In CI every selected test must run: a skipped test fails the session."""
    if os.environ.get("CI") and _skipped:
        print(f"\nCI=true and {len(_skipped)} test(s) skipped: {', '.join(_skipped)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
