"""The sandbox images' names and inputs (the images tier builds and runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from warren.cli import main
from warren.images import sandbox
from warren.images.rootfs import ImageError


def test_warren_image_build_knows_the_sandbox_images() -> None:
    result = CliRunner().invoke(main, ["image", "build", "agent", "nonsense"])
    assert result.exit_code != 0
    assert "unknown image nonsense" in result.output
    choices = result.output.split("choose from", 1)[1].strip().rstrip(".").split(", ")
    assert {"agent", "base"} <= set(choices)


def test_an_unknown_sandbox_image_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="unknown sandbox image busybox: choose from agent, base"):
        sandbox.build(tmp_path / "agent", "0.1.0", tmp_path / "cache", tmp_path / "out", only=["busybox"])
    assert list(tmp_path.iterdir()) == []


def test_the_agent_is_built_only_from_an_agent_directory(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match=r"holds no go\.mod"):
        sandbox.build_agent(tmp_path, tmp_path / "agent")
    assert not (tmp_path / "agent").exists()
