"""The pure parts of exec: output chunks as NDJSON events, and the exit status the API
server sends on the error channel (the shapes it sends are in the comments)."""

from __future__ import annotations

import base64
import json

from warren_control.api.sandbox_io import Utf8Lines
from warren_control.podexec import parse_status


def test_text_split_inside_a_character_is_held_until_it_completes() -> None:
    lines = Utf8Lines("stdout")
    data = "héllo €".encode()
    first, second = data[:2], data[2:]  # "h" and half of "é"
    assert lines.feed(first) == [{"stream": "stdout", "text": "h"}]
    assert lines.feed(second) == [{"stream": "stdout", "text": "éllo €"}]
    assert lines.feed(b"", final=True) == []


def test_bytes_that_are_not_utf8_travel_as_base64() -> None:
    lines = Utf8Lines("stderr")
    events = lines.feed(b"\xff\xfeok")
    assert events == [{"stream": "stderr", "base64": base64.b64encode(b"\xff\xfeok").decode()}]
    # A dangling half character at the very end is sent as it is.
    assert lines.feed(b"a\xc3") == [{"stream": "stderr", "text": "a"}]
    assert lines.feed(b"", final=True) == [{"stream": "stderr", "base64": base64.b64encode(b"\xc3").decode()}]


def test_exit_status_shapes() -> None:
    assert parse_status(b'{"metadata":{},"status":"Success"}').exit_code == 0
    non_zero = {
        "metadata": {},
        "status": "Failure",
        "message": "command terminated with non-zero exit code: exit status 3",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": "3"}]},
    }
    assert parse_status(json.dumps(non_zero).encode()).exit_code == 3
    not_run = {
        "metadata": {},
        "status": "Failure",
        "message": 'failed to exec in container: exec: "nope": executable file not found in $PATH',
        "reason": "InternalError",
    }
    status = parse_status(json.dumps(not_run).encode())
    assert status.exit_code is None
    assert status.error is not None
    assert "executable file not found" in status.error
    lost = parse_status(b"")
    assert (lost.exit_code, lost.error is not None) == (None, True)
