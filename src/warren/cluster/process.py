"""Processes the local cluster owns: started detached, recorded, stopped by their own pid.

There is no init system to lean on, so each process gets a record under run/ holding its
pid, the kernel's start time for that pid and a hash of its command line. The start time
tells our process from an unrelated one that later reused the pid: `stop` never signals
a process it did not start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path | None = None

    @property
    def digest(self) -> str:
        """Changes whenever the command line or environment does, so `up` restarts it."""
        payload = json.dumps([self.argv, sorted(self.env.items())])
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Record:
    pid: int
    start_time: int
    digest: str


def proc_start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat: when the process started, in clock ticks since boot."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":  # a zombie has exited; it only waits to be reaped
        return None
    return int(fields[19])


class Supervisor:
    def __init__(self, state_dir: Path) -> None:
        self.run_dir = state_dir / "run"
        self.log_dir = state_dir / "logs"

    def record_path(self, name: str) -> Path:
        return self.run_dir / f"{name}.json"

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def record(self, name: str) -> Record | None:
        try:
            data = json.loads(self.record_path(name).read_text())
            return Record(pid=int(data["pid"]), start_time=int(data["start_time"]), digest=data["digest"])
        except (OSError, ValueError, KeyError):
            return None

    def running(self, name: str) -> Record | None:
        """The record of our process if it is still alive (and still ours)."""
        record = self.record(name)
        if record is None or proc_start_time(record.pid) != record.start_time:
            return None
        return record

    def start(self, spec: ProcessSpec) -> Record:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path(spec.name).open("ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {spec.name}\n".encode())
            log.flush()
            child = subprocess.Popen(
                spec.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=spec.cwd,
                env={**os.environ, **spec.env},
                start_new_session=True,  # outlives the CLI; not hit by the terminal's ^C
            )
        start = proc_start_time(child.pid)
        if start is None:
            raise RuntimeError(f"{spec.name} exited at once; see {self.log_path(spec.name)}")
        record = Record(pid=child.pid, start_time=start, digest=spec.digest)
        tmp = self.record_path(spec.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(record.__dict__))
        tmp.replace(self.record_path(spec.name))
        return record

    def stop(self, name: str, timeout: float = 20.0, first: signal.Signals = signal.SIGTERM) -> bool:
        """Stop our process by name: `first` (SIGTERM), then SIGKILL. True if one was running."""
        record = self.running(name)
        was_running = record is not None
        if record is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(record.pid, first)
            deadline = time.monotonic() + timeout
            while proc_start_time(record.pid) == record.start_time:
                if time.monotonic() > deadline:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(record.pid, signal.SIGKILL)
                time.sleep(0.1)
                _reap(record.pid)
            _reap(record.pid)  # it may have become a zombie after the last look: collect it
        self.record_path(name).unlink(missing_ok=True)
        return was_running


def _reap(pid: int) -> None:
    """Collect the exit status if the process was our own child (same CLI invocation)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
