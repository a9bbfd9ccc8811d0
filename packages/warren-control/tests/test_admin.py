"""`warren-control admin`: organizations and API keys made on the records database itself (SQLite
and PostgreSQL), and the keys it prints working, and then refused once revoked, at the real edge."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import pytest
from api_stack import StandIn, serve_stack
from warren_control import admin, cli, keys, store
from warren_control.db import make_engine, session_factory, upgrade

pytest_plugins = ["api_fixtures"]


def run(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> tuple[int, str, str]:
    action, *rest = argv
    code = cli.main(["admin", action, "--database-url", url, *rest])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def listed(capsys: pytest.CaptureFixture[str], url: str, *argv: str) -> list[dict[str, object]]:
    code, out, _ = run(capsys, url, "list-keys", "--json", *argv)
    assert code == 0
    return [json.loads(line) for line in out.splitlines()]


def test_organizations_and_keys_from_the_command_line(
    records_url: str, standin: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, records_url, "migrate")[0] == 0
    code, out, _ = run(
        capsys,
        records_url,
        "create-org",
        "acme",
        "--quota-sandboxes",
        "3",
        "--quota-cpu-millis",
        "2000",
        "--quota-memory-mib",
        "4096",
        "--idle-timeout",
        "600",
        "--max-lifetime",
        "3600",
        "--may-persist",
    )
    assert code == 0
    org_id = out.strip()
    assert org_id.startswith("org_")
    sessions = session_factory(make_engine(records_url))
    with sessions() as session:
        org = store.get_org(session, org_id)
        assert org is not None
        made = (org.name, org.quota_sandboxes, org.quota_cpu_millis, org.quota_memory_mib)
        assert made == ("acme", 3, 2000, 4096)
        assert (org.idle_timeout_s, org.max_lifetime_s, org.may_persist) == (600, 3600, True)

    code, _, err = run(capsys, records_url, "create-org", "acme")
    assert (code, err.strip()) == (1, "error: an organization named 'acme' exists already")

    # By name or by id; the key is printed once, alone on stdout.
    code, out, err = run(capsys, records_url, "issue-key", "acme", "alice", "--scope", "sandboxes")
    assert code == 0
    token = out.strip()
    key_id = keys.parse(token).key_id
    assert "shown this once" in err
    code, out, _ = run(capsys, records_url, "issue-key", org_id, "alice")
    assert code == 0
    second = out.strip()
    assert second != token

    rows = listed(capsys, records_url, "--org", "acme")
    assert [r["key_id"] for r in rows] == [key_id, keys.parse(second).key_id]
    assert rows[0]["user"] == rows[1]["user"] == "alice"
    assert rows[0]["scopes"] == ["sandboxes"]
    assert rows[0]["revoked_at"] is None
    assert token not in json.dumps(rows)
    code, out, _ = run(capsys, records_url, "list-keys")
    assert out.splitlines()[0].split()[:2] == ["KEY", "ID"]
    assert key_id in out

    with serve_stack(records_url, standin) as stack:

        def status(api_key: str) -> int:
            response = httpx.get(f"{stack.edge}/v1/sandboxes", headers={"Authorization": f"Bearer {api_key}"})
            return response.status_code

        assert status(token) == 200
        # Revoking takes the id or the whole key, and holds from the edge's next request.
        code, out, _ = run(capsys, records_url, "revoke-key", token)
        assert (code, out.strip()) == (0, key_id)
        assert status(token) == 401
        assert status(second) == 200
        code, _, _ = run(capsys, records_url, "revoke-key", keys.parse(second).key_id)
        assert code == 0
        assert status(second) == 401

    revoked = listed(capsys, records_url, "--org", org_id)
    assert all(r["revoked_at"] for r in revoked)


def test_an_e2b_key_works_in_the_sdk_s_header_until_revoked(
    records_url: str, standin: StandIn, capsys: pytest.CaptureFixture[str]
) -> None:
    upgrade(records_url)
    assert run(capsys, records_url, "create-org", "sdk-users")[0] == 0
    code, out, _ = run(capsys, records_url, "issue-key", "sdk-users", "agent", "--e2b")
    token = out.strip()
    assert code == 0
    assert token.startswith("e2b_")
    assert [r["key_id"] for r in listed(capsys, records_url, "--org", "sdk-users")] == [
        keys.parse(token).key_id
    ]
    with serve_stack(records_url, standin) as stack:

        def status() -> int:
            return httpx.get(f"{stack.edge}/v1/sandboxes", headers={"X-API-KEY": token}).status_code

        assert status() == 200
        assert run(capsys, records_url, "revoke-key", token)[0] == 0
        assert status() == 401


def test_refusals_name_what_is_missing(records_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    upgrade(records_url)
    code, _, err = run(capsys, records_url, "issue-key", "nobody", "alice")
    assert (code, err.strip()) == (1, "error: no organization with the id or name 'nobody'")
    code, _, err = run(capsys, records_url, "revoke-key", "abcdefghijkl")
    assert (code, err.strip()) == (1, "error: no API key with the id 'abcdefghijkl'")
    code, _, err = run(capsys, records_url, "create-org", "timeless", "--idle-timeout", "0")
    assert (code, err.strip()) == (1, "error: idle_timeout_s may not be 0")
    code, _, err = run(capsys, records_url, "list-keys", "--org", "nobody")
    assert code == 1


def test_no_database_no_command(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARREN_DATABASE_URL", raising=False)
    with pytest.raises(SystemExit, match="WARREN_DATABASE_URL"):
        cli.main(["admin", "list-keys"])


def test_bootstrap_makes_one_key_on_the_first_run_only(records_url: str, tmp_path: Path) -> None:
    key_file = tmp_path / "api-key"
    token = admin.bootstrap(records_url, key_file)
    assert token is not None
    assert key_file.read_text() == token + "\n"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*.tmp"))

    assert admin.bootstrap(records_url, key_file) is None
    assert key_file.read_text() == token + "\n"
    with session_factory(make_engine(records_url))() as session:
        rows = admin.list_keys(session, "default")
        assert [(r.key_id, r.user, r.revoked_at) for r in rows] == [(keys.parse(token).key_id, "admin", None)]
        record = store.lookup_key(session, keys.parse(token).key_id)
        assert record is not None
        assert keys.check(token, record.secret_sha256)


def test_a_key_file_that_cannot_be_written_leaves_no_organization(records_url: str, tmp_path: Path) -> None:
    with pytest.raises(OSError):
        admin.bootstrap(records_url, tmp_path / "missing-directory" / "api-key")
    with session_factory(make_engine(records_url))() as session:
        assert store.get_org_by_name(session, "default") is None
    # The next run starts over.
    assert admin.bootstrap(records_url, tmp_path / "api-key") is not None


def test_bootstrap_from_the_command_line_says_whether_it_acted(
    records_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "first-key"
    boot = ("bootstrap", "--key-file", str(key_file), "--org", "boot")
    acted = {"changed": True, "migrated": True, "created": True, "org": "boot", "key_file": str(key_file)}
    # Check mode says what it would do and does none of it.
    code, out, _ = run(capsys, records_url, *boot, "--check")
    assert code == 0 and json.loads(out) == acted
    assert not key_file.exists()
    assert admin.bootstrap_plan(records_url, "boot") == (True, True)

    code, out, _ = run(capsys, records_url, *boot)
    assert code == 0 and json.loads(out) == acted
    token = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for check in ((), ("--check",)):
        code, out, _ = run(capsys, records_url, *boot, *check)
        assert code == 0 and json.loads(out) == {
            **acted,
            "changed": False,
            "migrated": False,
            "created": False,
        }
    assert key_file.read_text().strip() == token


def test_an_organizations_reservation_reaches_its_new_sandboxes_pods(
    records_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """set-reservation changes what the organization's next sandboxes reserve: the record
    carries the share, and the Sandbox object the API writes passes it to the controller."""
    from warren_control.api.cluster import resource_for

    upgrade(records_url)
    org_id = run(capsys, records_url, "create-org", "dense")[1].strip()
    code, out, err = run(capsys, records_url, "set-reservation", "dense", "--cpu-percent", "2")
    assert (code, out.strip()) == (0, org_id)
    assert "cpu 2%, memory the default" in err
    code, _, err = run(capsys, records_url, "set-reservation", "dense", "--memory-percent", "101")
    assert (code, err.strip()) == (
        1,
        "error: the memory reservation is 101%: give a percentage from 1 to 100",
    )

    sessions = session_factory(make_engine(records_url))
    spec = {
        "image": "busybox",
        "cpu_millis": 1000,
        "memory_mib": 1024,
        "idle_timeout_s": 60,
        "max_lifetime_s": 600,
    }
    with sessions.begin() as session:
        user = store.create_user(session, org_id, "dana")
        record = store.create_sandbox(session, org_id, user.id, spec)
        # A fork copies its parent's spec: the organization's share at the fork wins.
        admin.set_reservation(session, org_id, cpu_percent=None, memory_percent=None)
        child = store.create_sandbox(session, org_id, user.id, dict(record.spec))
    assert record.spec["reservation"] == {"cpu_percent": 2}
    assert resource_for(record, "ns", b"k" * 32)["spec"]["reservation"] == {"cpuPercent": 2}
    assert "reservation" not in child.spec
    assert "reservation" not in resource_for(child, "ns", b"k" * 32)["spec"]


def test_set_pool_cap_sets_and_clears_an_organizations_cap(
    records_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    upgrade(records_url)
    org_id = run(capsys, records_url, "create-org", "capped")[1].strip()
    code, out, err = run(capsys, records_url, "set-pool-cap", "capped", "3")
    assert (code, out.strip()) == (0, org_id) and "at most 3 at once" in err
    sessions = session_factory(make_engine(records_url))
    with sessions() as session:
        assert admin.find_org(session, org_id).pool_sandboxes_max == 3
    code, _, err = run(capsys, records_url, "set-pool-cap", "capped", "none")
    assert code == 0 and "as many as the pools have" in err
    with sessions() as session:
        assert admin.find_org(session, org_id).pool_sandboxes_max is None
    with pytest.raises(SystemExit):
        run(capsys, records_url, "set-pool-cap", "capped", "-1")
    assert "is not a number of sandboxes (0 or more) or none" in capsys.readouterr().err
