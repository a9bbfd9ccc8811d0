"""Run the shipped suite with pytest, as `warren conformance` does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SUITE = Path(__file__).parent


def run(kubeconfig: Path, junitxml: Path | None, config: Path | None, extra: list[str]) -> int:
    args = [
        str(SUITE),
        "-p",
        "warren.conformance.plugin",
        "-p",
        "no:cacheprovider",  # the suite may live in a read-only site-packages
        "--rootdir",
        str(SUITE),
        "-c",
        os.devnull,  # ignore whatever pytest configuration the current directory has
        f"--kubeconfig={kubeconfig}",
        "-ra",
    ]
    if junitxml:
        args.append(f"--junitxml={junitxml}")
    if config:
        args.append(f"--warren-config={config}")
    return int(pytest.main(args + extra))
