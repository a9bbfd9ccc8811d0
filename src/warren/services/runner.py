"""Run a unit under Warren's supervisor: the same pid records and logs as the local
cluster's own processes, so `warren cluster down` stops these too when they share its
state directory."""

from __future__ import annotations

import pwd
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from warren.cluster.components import Component, Health
from warren.cluster.local import ensure_running, probe
from warren.cluster.process import ProcessSpec, Supervisor
from warren.services.unit import Unit, UnitError

Action = Literal["unchanged", "started", "restarted"]


@dataclass(frozen=True)
class Outcome:
    name: str
    action: Action
    pid: int | None

    @property
    def changed(self) -> bool:
        return self.action != "unchanged"


def spec_for(unit: Unit) -> ProcessSpec:
    argv = unit.argv
    if unit.user:
        try:
            account = pwd.getpwnam(unit.user)
        except KeyError:
            raise UnitError(f"{unit.name}: User={unit.user} does not exist on this host") from None
        setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        ids = [f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups"]
        argv = (setpriv, *ids, "--", *argv)
    return ProcessSpec(unit.name, argv, env=unit.environment(), cwd=unit.cwd)


def plan(supervisor: Supervisor, unit: Unit, health: Health | None, *, restart: bool = False) -> Action:
    """What `up` would do now (`restart`: a file the service reads changed)."""
    record = supervisor.running(unit.name)
    if record is None:
        return "started"
    if restart or record.digest != spec_for(unit).digest:
        return "restarted"
    if health is not None and not probe(health)[0]:
        return "restarted"
    return "unchanged"


def up(
    supervisor: Supervisor,
    unit: Unit,
    health: Health | None,
    *,
    timeout: int,
    progress: Callable[[str], None] = lambda _m: None,
    check: bool = False,
    restart: bool = False,
) -> Outcome:
    """Leave a running, current, healthy service alone; else (re)start it and wait until
    it is healthy. With `check`, only say what would happen."""
    action = plan(supervisor, unit, health, restart=restart)
    if check or action == "unchanged":
        record = supervisor.running(unit.name)
        return Outcome(unit.name, action, record.pid if record else None)
    if action == "restarted":
        supervisor.stop(unit.name, timeout=unit.stop_timeout_s, first=unit.kill_signal)
    # No health given: running is healthy enough.
    component = Component(spec_for(unit), health or Health(command=("true",)))
    ensure_running(supervisor, component, timeout, progress)
    record = supervisor.running(unit.name)
    return Outcome(unit.name, action, record.pid if record else None)


def down(supervisor: Supervisor, unit: Unit | None, name: str) -> bool:
    if unit is None:
        return supervisor.stop(name, timeout=90.0)
    return supervisor.stop(name, timeout=unit.stop_timeout_s, first=unit.kill_signal)
