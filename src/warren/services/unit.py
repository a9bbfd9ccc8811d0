"""The part of a systemd service unit Warren's roles write, read without systemd.

A role renders one unit file per service. On a host with systemd, systemd runs it; on a
host without an init system (a container, this kind of test machine), `warren service up`
reads the same file and runs its ExecStart under Warren's supervisor. Only what the roles
use is understood; anything else in [Service] that would change how the process runs is
refused by name, so the two runners cannot quietly disagree.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path

# Keys that only matter to systemd itself (ordering, restarts, installation, sandboxing
# systemd applies and the supervisor cannot): read and left to systemd.
SYSTEMD_ONLY = {
    "Type",
    "Restart",
    "RestartSec",
    "KillMode",
    "LimitNOFILE",
    "NoNewPrivileges",
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
}
UNDERSTOOD = {
    "ExecStart",
    "Environment",
    "EnvironmentFile",
    "WorkingDirectory",
    "User",
    "TimeoutStopSec",
    "KillSignal",
}
_DURATION = re.compile(r"^(\d+)\s*(s|sec|min|m)?$")


class UnitError(ValueError):
    """A unit file the supervisor cannot run as systemd would; the message says why."""


@dataclass(frozen=True)
class Unit:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    env_files: tuple[Path, ...] = ()
    cwd: Path | None = None
    user: str | None = None
    stop_timeout_s: float = 90.0  # systemd's default
    kill_signal: signal.Signals = signal.SIGTERM
    source: str = ""

    def environment(self) -> dict[str, str]:
        """Environment= values, then each EnvironmentFile (later wins, as in systemd)."""
        merged = dict(self.env)
        for path in self.env_files:
            optional = str(path).startswith("-")
            real = Path(str(path).lstrip("-"))
            if not real.is_file():
                if optional:
                    continue
                raise UnitError(f"{self.name}: EnvironmentFile {real} does not exist")
            merged.update(parse_env_file(real.read_text()))
        return merged

    def digest(self) -> str:
        """Changes with the unit and with its environment files' contents (a rotated
        credential restarts the service, as `systemctl restart` after a change would)."""
        h = hashlib.sha256(self.source.encode())
        for key, value in sorted(self.environment().items()):
            h.update(f"\0{key}={value}".encode())
        return h.hexdigest()[:16]


def parse_env_file(text: str) -> dict[str, str]:
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UnitError(f"environment file line {raw!r} is not KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":  # noqa: PLR2004
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _duration(text: str, name: str) -> float:
    match = _DURATION.match(text.strip())
    if not match:
        raise UnitError(f"{name}: TimeoutStopSec={text!r} is not seconds (like 90 or 3min)")
    number, unit = int(match.group(1)), match.group(2) or "s"
    return float(number * 60 if unit in {"min", "m"} else number)


def parse(text: str, name: str) -> Unit:
    section = ""
    service: dict[str, list[str]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise UnitError(f"{name}: line {number} is not KEY=VALUE: {raw!r}")
        if section == "Service":
            service.setdefault(key.strip(), []).append(value.strip())
    unknown = set(service) - UNDERSTOOD - SYSTEMD_ONLY - {k for k in service if k.startswith("X-")}
    if unknown:
        raise UnitError(f"{name}: [Service] {', '.join(sorted(unknown))} not supported without systemd")
    starts = service.get("ExecStart", [])
    if len(starts) != 1:
        raise UnitError(f"{name}: exactly one ExecStart= is needed, found {len(starts)}")
    argv = tuple(shlex.split(starts[0]))
    if not argv or not argv[0].startswith("/"):
        raise UnitError(f"{name}: ExecStart must start with an absolute path (as systemd requires)")
    env: dict[str, str] = {}
    for value in service.get("Environment", []):
        for assignment in shlex.split(value):
            key, sep, val = assignment.partition("=")
            if not sep:
                raise UnitError(f"{name}: Environment={value!r} is not KEY=VALUE")
            env[key] = val
    cwd = service.get("WorkingDirectory", [None])[-1]
    user = service.get("User", [None])[-1]
    timeout = service.get("TimeoutStopSec")
    kill = service.get("KillSignal", ["SIGTERM"])[-1]
    try:
        kill_signal = signal.Signals[kill if kill.startswith("SIG") else f"SIG{kill}"]
    except KeyError:
        raise UnitError(f"{name}: KillSignal={kill} is not a signal name (like SIGINT)") from None
    return Unit(
        name=name,
        argv=argv,
        env=env,
        env_files=tuple(Path(v) for v in service.get("EnvironmentFile", [])),
        cwd=Path(cwd) if cwd else None,
        user=user if user and user != "root" else None,
        stop_timeout_s=_duration(timeout[-1], name) if timeout else 90.0,
        kill_signal=kill_signal,
        source=text,
    )


def load(path: Path) -> Unit:
    name = path.name.removesuffix(".service")
    try:
        text = path.read_text()
    except OSError as exc:
        raise UnitError(f"cannot read unit {path}: {exc.strerror}") from None
    return parse(text, name)
