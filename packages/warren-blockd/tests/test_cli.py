"""The CLI's own behaviour: the dedup report as JSON, sizes, and clear errors without a daemon."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from warren_blockd.cli import main, size


@pytest.mark.skipif(not shutil.which("mkfs.ext4"), reason="mkfs.ext4 (e2fsprogs) is needed")
def test_dedup_prints_both_ratios_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    for i in range(6):
        (tree / f"f{i}").write_bytes(bytes([i + 1]) * (300_000 + i * 4096))
    images = []
    for name in ("a", "b"):
        image = tmp_path / f"{name}.img"
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-b", "4096", "-d", str(tree), str(image), "32M"], check=True
        )
        images.append(str(image))
        (tree / "f0").write_bytes(b"changed" * 70_000)  # B differs from A in one file
    assert main(["dedup", *images, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chunk_size"] == 256 * 1024
    assert 0 < doc["shared_ratio_fixed"] <= doc["shared_ratio_file_aligned"] < 1


def test_sizes_and_a_missing_daemon_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert size("8G") == 8 << 30 and size("512M") == 512 << 20 and size("4096") == 4096
    with pytest.raises(Exception, match="is not a size"):
        size("lots")
    assert main(["--socket", str(tmp_path / "none.sock"), "stats"]) == 1
    assert "is `warren-blockd serve` running?" in capsys.readouterr().err
