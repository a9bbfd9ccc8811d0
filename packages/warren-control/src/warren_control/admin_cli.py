"""`warren-control admin ...`: the operator's commands on the records database (admin.py).

    warren-control admin migrate
    warren-control admin create-org NAME [--quota-sandboxes N] [--quota-cpu-millis N]
        [--quota-memory-mib N] [--idle-timeout S] [--max-lifetime S] [--may-persist]
    warren-control admin set-reservation ORG [--cpu-percent N] [--memory-percent N]
                                   what its new sandboxes reserve of their size (unset: the default)
    warren-control admin set-pool-cap ORG N|none
                                   how many of its sandboxes may come from warm pools at once
    warren-control admin issue-key ORG USER [--scope S]... [--e2b]
                                   prints the key, the only time it is shown (--e2b: as e2b_<hex>)
    warren-control admin revoke-key KEY                      a key id, or the whole key
    warren-control admin list-keys [--org ORG]

The database is `--database-url` or WARREN_DATABASE_URL. Results go to stdout, notes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the database layer is imported when an admin command runs, not for every command
    from sqlalchemy.orm import Session

    from warren_control.admin import KeyRow


@contextmanager
def _session(args: argparse.Namespace) -> Iterator[Session]:
    """One transaction, committed if the command succeeds."""
    from warren_control import db

    engine = db.make_engine(_url(args))
    try:
        with db.session_factory(engine).begin() as session:
            yield session
    finally:
        engine.dispose()


def _url(args: argparse.Namespace) -> str:
    url: str | None = args.database_url or os.environ.get("WARREN_DATABASE_URL")
    if not url:
        raise SystemExit("a database is needed: --database-url or WARREN_DATABASE_URL")
    return url


def _when(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment else "-"


def _row(key: KeyRow) -> dict[str, Any]:
    def iso(moment: datetime | None) -> str | None:
        return moment.isoformat() if moment else None

    return {
        "key_id": key.key_id,
        "org_id": key.org_id,
        "org": key.org_name,
        "user": key.user,
        "scopes": list(key.scopes),
        "created_at": iso(key.created_at),
        "last_used_at": iso(key.last_used_at),
        "revoked_at": iso(key.revoked_at),
    }


def admin_migrate(args: argparse.Namespace) -> int:
    from warren_control import db

    db.upgrade(_url(args))
    print("records schema is up to date", file=sys.stderr)
    return 0


def admin_bootstrap(args: argparse.Namespace) -> int:
    """For installers (the control_plane role): idempotent, says on stdout whether it acted."""
    from warren_control import admin

    url = _url(args)
    migrate, create = admin.bootstrap_plan(url, args.org)
    if not args.check:  # what it did: another installer may have made the organization since
        create = admin.bootstrap(url, Path(args.key_file), org_name=args.org, subject=args.user) is not None
    answer = {"changed": migrate or create, "migrated": migrate, "created": create}
    print(json.dumps({**answer, "org": args.org, "key_file": args.key_file}))
    return 0


def admin_create_org(args: argparse.Namespace) -> int:
    from warren_control import admin

    given = {
        "sandboxes": args.quota_sandboxes,
        "cpu_millis": args.quota_cpu_millis,
        "memory_mib": args.quota_memory_mib,
        "idle_timeout_s": args.idle_timeout,
        "max_lifetime_s": args.max_lifetime,
    }
    quotas = admin.Quotas(**{field: value for field, value in given.items() if value is not None})
    with _session(args) as session:
        org = admin.create_org(session, args.name, quotas, may_persist=args.may_persist)
        print(org.id)
    return 0


def admin_set_reservation(args: argparse.Namespace) -> int:
    from warren_control import admin

    with _session(args) as session:
        org = admin.set_reservation(
            session, args.org, cpu_percent=args.cpu_percent, memory_percent=args.memory_percent
        )
        shares = {"cpu": org.cpu_request_percent, "memory": org.memory_request_percent}
    said = ", ".join(f"{k} {'the default' if v is None else f'{v}%'}" for k, v in shares.items())
    print(org.id)
    print(f"new sandboxes reserve {said} of their size; running ones keep theirs", file=sys.stderr)
    return 0


def admin_set_pool_cap(args: argparse.Namespace) -> int:
    from warren_control import admin

    with _session(args) as session:
        org = admin.set_pool_cap(session, args.org, None if args.most == "none" else int(args.most))
        most = org.pool_sandboxes_max
    print(org.id)
    said = "as many as the pools have" if most is None else f"at most {most}"
    print(f"its sandboxes from warm pools: {said} at once; past that, creates start cold", file=sys.stderr)
    return 0


def admin_issue_key(args: argparse.Namespace) -> int:
    from warren_control import admin

    with _session(args) as session:
        issued = admin.issue_key(
            session, args.org, args.user, args.scope or (), "e2b" if args.e2b else "warren"
        )
    # Printed after the commit, so a key that is shown is a key that works.
    print(issued.token)
    print(f"key {issued.key_id}: shown this once, only a hash of it is kept", file=sys.stderr)
    return 0


def admin_revoke_key(args: argparse.Namespace) -> int:
    from warren_control import admin

    with _session(args) as session:
        row = admin.revoke_key(session, args.key)
    print(row.key_id)
    print(f"revoked at {_when(row.revoked_at)}; the edge refuses it from its next request", file=sys.stderr)
    return 0


def admin_list_keys(args: argparse.Namespace) -> int:
    from warren_control import admin

    with _session(args) as session:
        rows = admin.list_keys(session, args.org)
    if args.json:
        for key in rows:
            print(json.dumps(_row(key)))
        return 0
    print(f"{'KEY ID':<14} {'ORG':<20} {'USER':<20} {'CREATED':<26} {'LAST USED':<26} {'REVOKED':<26} SCOPES")
    for key in rows:
        print(
            f"{key.key_id:<14} {key.org_name:<20} {key.user:<20} {_when(key.created_at):<26} "
            f"{_when(key.last_used_at):<26} {_when(key.revoked_at):<26} {','.join(key.scopes) or '-'}"
        )
    return 0


def cmd_admin(args: argparse.Namespace) -> int:
    from warren_control.admin import AdminError

    try:
        code: int = args.admin_handler(args)
    except AdminError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return code


def add_admin_parser(commands: Any) -> None:
    admin = commands.add_parser("admin", help="manage organizations and API keys in the records database")
    actions = admin.add_subparsers(dest="action", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--database-url", help="records database (or WARREN_DATABASE_URL)")

    def action(name: str, handler: Callable[[argparse.Namespace], int], help_text: str) -> Any:
        parser = actions.add_parser(name, help=help_text, parents=[common])
        parser.set_defaults(admin_handler=handler)
        return parser

    action("migrate", admin_migrate, "bring the records schema up to date")

    boot = action(
        "bootstrap",
        admin_bootstrap,
        "migrate; on the first run make an organization, a user and an API key saved to a 0600 "
        "file (JSON on stdout says whether anything was made)",
    )
    boot.add_argument("--key-file", required=True, help="where the first API key is written (0600)")
    boot.add_argument("--org", default="default", help="the first organization's name")
    boot.add_argument("--user", default="admin", help="the first user's subject")
    boot.add_argument("--check", action="store_true", help="only say what it would do; change nothing")

    org = action("create-org", admin_create_org, "create an organization; prints its id")
    org.add_argument("name")
    # Unset quotas take admin.Quotas' defaults: 20 sandboxes, 16 cores, 32 GiB, 24 h idle, 7 d.
    org.add_argument("--quota-sandboxes", type=int, help="sandboxes at once")
    org.add_argument("--quota-cpu-millis", type=int, help="CPU in thousandths of a core, all sandboxes")
    org.add_argument("--quota-memory-mib", type=int, help="memory in MiB, all sandboxes")
    org.add_argument("--idle-timeout", type=int, help="the longest idle timeout a sandbox may have (s)")
    org.add_argument("--max-lifetime", type=int, help="the longest lifetime a sandbox may have (s)")
    org.add_argument("--may-persist", action="store_true", help="may create persistent sandboxes")

    share = action(
        "set-reservation", admin_set_reservation, "what an organization's sandboxes reserve on their nodes"
    )
    share.add_argument("org", help="organization id or name")
    for kind in ("cpu", "memory"):
        share.add_argument(
            f"--{kind}-percent",
            type=int,
            metavar="N",
            help=f"reserve N%% of each sandbox's {kind} (1 to 100; unset: the deployment's default)",
        )

    cap = action(
        "set-pool-cap", admin_set_pool_cap, "how many of an organization's sandboxes may come from warm pools"
    )
    cap.add_argument("org", help="organization id or name")
    cap.add_argument("most", type=_cap, help="a number (0: every create starts cold), or none for no cap")

    issue = action("issue-key", admin_issue_key, "issue an API key for a user; prints it, once")
    issue.add_argument("org", help="organization id or name")
    issue.add_argument("user", help="the user's subject (made a user of the organization if new)")
    issue.add_argument("--scope", action="append", help="a scope the key carries (repeatable)")
    issue.add_argument(
        "--e2b", action="store_true", help="in E2B's shape (e2b_<hex>), for programs that use the E2B SDK"
    )

    revoke = action("revoke-key", admin_revoke_key, "revoke an API key")
    revoke.add_argument("key", help="the key id, or the whole key")

    listing = action("list-keys", admin_list_keys, "list API keys (never their secrets)")
    listing.add_argument("--org", help="only this organization's (id or name)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")

    admin.set_defaults(handler=cmd_admin)


def _cap(text: str) -> str:
    if text != "none" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of sandboxes (0 or more) or none")
    return text
