"""The JSON formatter and `configure`: one object a line, fields at the top level."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from warren_common import logs


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("noisy.lib").setLevel(logging.NOTSET)


@pytest.mark.usefixtures("restore_root")
def test_lines_are_json_with_fields_and_quiet_loggers_warn_only(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("info", quiet=("noisy.lib",))
    logging.getLogger("warren.test").info("mounted %s", "ws-1", extra={"fields": {"workspace": "ws-1"}})
    logging.getLogger("warren.test").debug("not shown")
    logging.getLogger("noisy.lib").info("not shown either")
    logging.getLogger("noisy.lib").warning("shown")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("warren.test").exception("failed")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [line["event"] for line in lines] == ["mounted ws-1", "shown", "failed"]
    first = lines[0]
    assert (first["level"], first["logger"], first["workspace"]) == ("info", "warren.test", "ws-1")
    assert first["ts"].endswith("Z") and len(first["ts"]) == len("2026-01-01T00:00:00.000Z")
    assert "RuntimeError: boom" in lines[2]["exception"]
