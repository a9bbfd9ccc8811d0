import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren.cluster.process import ProcessSpec, Supervisor, proc_start_time

SLEEP = (sys.executable, "-c", "import time; time.sleep(300)")


@pytest.fixture
def decoy() -> Iterator[subprocess.Popen[bytes]]:
    """A process the supervisor did not start."""
    proc = subprocess.Popen(SLEEP)
    yield proc
    proc.kill()
    proc.wait()


def test_start_records_and_stop_ends(tmp_path: Path) -> None:
    sup = Supervisor(tmp_path)
    record = sup.start(ProcessSpec("sleeper", SLEEP))
    assert sup.running("sleeper") == record
    assert sup.log_path("sleeper").exists()
    assert sup.stop("sleeper") is True
    assert proc_start_time(record.pid) is None
    assert sup.running("sleeper") is None
    assert sup.stop("sleeper") is False  # idempotent


def test_stop_never_signals_a_process_it_did_not_start(
    tmp_path: Path, decoy: subprocess.Popen[bytes]
) -> None:
    """A stale record whose pid now belongs to another process (pid reuse) is ignored."""
    sup = Supervisor(tmp_path)
    sup.run_dir.mkdir(parents=True)
    start = proc_start_time(decoy.pid)
    assert start is not None
    stale = {"pid": decoy.pid, "start_time": start - 1, "digest": "x"}
    sup.record_path("ghost").write_text(json.dumps(stale))
    assert sup.running("ghost") is None
    assert sup.stop("ghost") is False
    assert decoy.poll() is None, "the unrelated process was killed"
    assert not sup.record_path("ghost").exists()


def test_stop_escalates_to_sigkill(tmp_path: Path) -> None:
    stubborn = (
        sys.executable,
        "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(300)",
    )
    sup = Supervisor(tmp_path)
    record = sup.start(ProcessSpec("stubborn", stubborn))
    for _ in range(200):  # wait until the SIGTERM handler is installed
        if "ready" in sup.log_path("stubborn").read_text():
            break
        time.sleep(0.05)
    assert sup.stop("stubborn", timeout=0.5) is True
    assert proc_start_time(record.pid) is None


def test_digest_follows_command_line_and_env() -> None:
    a = ProcessSpec("x", ("bin", "--a"))
    assert a.digest == ProcessSpec("x", ("bin", "--a")).digest
    assert a.digest != ProcessSpec("x", ("bin", "--b")).digest
    assert a.digest != ProcessSpec("x", ("bin", "--a"), env={"K": "V"}).digest


def test_start_survives_parent_signal_group(tmp_path: Path) -> None:
    """Components run in their own session: a ^C to the CLI's group does not reach them."""
    sup = Supervisor(tmp_path)
    record = sup.start(ProcessSpec("detached", SLEEP))
    try:
        assert os.getpgid(record.pid) != os.getpgid(0)
    finally:
        sup.stop("detached")
    with pytest.raises(ProcessLookupError):
        os.kill(record.pid, 0)
