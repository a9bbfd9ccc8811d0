import stat
from pathlib import Path

import pytest
from warren_common.files import write_private


def test_a_private_file_is_written_once_and_only_for_its_owner(tmp_path: Path) -> None:
    path = tmp_path / "key"
    assert write_private(path, "one\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.stat().st_mtime_ns
    assert not write_private(path, b"one\n")  # the same bytes: left alone
    assert path.stat().st_mtime_ns == before
    assert write_private(path, "two\n") and path.read_text() == "two\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]  # no temporary file left


def test_a_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A full disk cannot be made on demand here: fsync failing stands in for it.
    path = tmp_path / "key"
    write_private(path, "old\n")

    def no_space(_: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", no_space)
    with pytest.raises(OSError, match="No space"):
        write_private(path, "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]
