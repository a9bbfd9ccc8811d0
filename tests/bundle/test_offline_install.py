"""Install from the built bundle with no network: every command runs in a network namespace
with only loopback up, so a download attempt anywhere would fail the test."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from warren.bundle.debs import KERNEL, SHIP_ONLY, parse_packages
from warren.bundle.manifest import Manifest
from warren.bundle.verify import beside, verify_tree

if TYPE_CHECKING:
    from conftest import Offline

pytestmark = pytest.mark.bundle

SYSTEM_PYTHON = "/usr/bin/python3"  # Debian's, as on the air-gapped host
# environment -> commands that must run from it
COMMANDS = {
    "warren": [["warren", "--help"], ["warren", "bundle", "verify", "--help"], ["pytest", "--version"]],
    "warren-control": [["warren-control", "--help"]],
    "warren-blockd": [["warren-blockd", "--help"], ["weed", "version"]],
    "warren-forkd": [["warren-forkd", "--help"]],
}


def _out(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"


def test_the_namespace_has_no_route_out(offline: Offline) -> None:
    links = offline.run(["ip", "-o", "link"]).stdout.splitlines()
    assert [line.split(":")[1].strip() for line in links] == ["lo"]
    for family in ("-4", "-6"):
        routes = offline.run(["ip", family, "route", "show", "table", "all"]).stdout
        assert all(" dev lo " in f" {line} " for line in routes.splitlines()), routes
        assert "default" not in routes


def test_the_guest_kernel_is_shipped_not_installed(extracted: Path) -> None:
    """warren-forkd unpacks the versioned kernel package from debs/; packages.txt leaves it out."""
    debs = extracted / "debs"
    kernels = [p.name for p in debs.glob("linux-image-*.deb") if KERNEL.match(p.name.split("_", 1)[0])]
    assert len(kernels) == 1, kernels
    assert not [p for p in (debs / "packages.txt").read_text().split() if p.startswith("linux-image")]


def test_the_extracted_bundle_matches_its_manifest(bundle_archive: Path, extracted: Path) -> None:
    report = verify_tree(extracted)
    assert report.ok, report.summary()
    side_manifest, _ = beside(bundle_archive)
    assert side_manifest.read_bytes() == (extracted / "manifest.json").read_bytes()
    # The same check with coreutils alone, as a host with nothing installed can make it.
    check = subprocess.run(
        ["sha256sum", "--check", "--strict", "--quiet", "SHA256SUMS"],
        cwd=extracted,
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_host_with_nothing_installed_can_verify_the_archive(
    offline: Offline, bundle_archive: Path, tmp_path: Path
) -> None:
    """Only tar and Debian's python3: the warren wheel, taken out of the archive, is the path."""
    subprocess.run(
        ["tar", "-xzf", bundle_archive, "-C", tmp_path, "--wildcards", "wheels/warren-[0-9]*.whl"], check=True
    )
    (wheel,) = (tmp_path / "wheels").glob("warren-*.whl")
    result = offline.run(
        [SYSTEM_PYTHON, "-S", "-m", "warren.bundle", "verify", bundle_archive], env={"PYTHONPATH": str(wheel)}
    )
    assert result.returncode == 0, _out(result)
    assert "match the manifest" in result.stdout


def _install(offline: Offline, wheels: Path, env: str, venv: Path) -> subprocess.CompletedProcess[str]:
    made = offline.run([SYSTEM_PYTHON, "-m", "venv", venv])
    assert made.returncode == 0, _out(made)
    return offline.run(
        [
            venv / "bin/pip", "install", "--no-index", "--find-links", wheels,
            "--requirement", wheels / f"requirements-{env}.txt",
        ]
    )  # fmt: skip


@pytest.mark.parametrize("env", sorted(COMMANDS))
def test_each_environment_installs_and_runs_offline(
    offline: Offline, extracted: Path, manifest: Manifest, env: str, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    installed = _install(offline, extracted / "wheels", env, venv)
    assert installed.returncode == 0, _out(installed)
    for command in COMMANDS[env]:
        ran = offline.run([venv / "bin" / command[0], *command[1:]])
        assert ran.returncode == 0, f"{' '.join(command)}: {_out(ran)}"
    listed = offline.run(
        [venv / "bin/pip", "list", "--format", "json", "--exclude", "pip", "--exclude", "setuptools"]
    )
    versions = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed.stdout)}
    pinned = {k.lower().replace("_", "-"): v for k, v in manifest.pins[f"environment:{env}"].items()}
    assert versions == pinned


def test_a_missing_wheel_fails_the_offline_install(offline: Offline, extracted: Path, tmp_path: Path) -> None:
    """The install test above would catch a wheel the bundle lacks."""
    requirements = (extracted / "wheels/requirements-warren.txt").read_text()
    assert re.search(r"^markupsafe==", requirements, re.MULTILINE | re.IGNORECASE)  # jinja2's dependency
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for path in (extracted / "wheels").iterdir():
        if not path.name.lower().startswith("markupsafe-"):
            os.link(path, wheels / path.name)
    result = _install(offline, wheels, "warren", tmp_path / "venv")
    assert result.returncode != 0
    assert "markupsafe" in result.stderr.lower(), _out(result)


def _apt(root: Path, repo: Path, status: Path) -> dict[str, str]:
    """An apt that knows the given repository only: no system sources, settings or lists."""
    for sub in ("parts", "sourceparts", "preferences.d", "lists/partial", "cache/archives/partial"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "sources.list").write_text(f"deb [trusted=yes] file:{repo} ./\n")
    settings = {
        "Dir::Etc::Parts": root / "parts",
        "Dir::Etc::main": os.devnull,
        "Dir::Etc::SourceList": root / "sources.list",
        "Dir::Etc::SourceParts": root / "sourceparts",
        "Dir::Etc::Preferences": os.devnull,
        "Dir::Etc::PreferencesParts": root / "preferences.d",
        "Dir::State::Lists": root / "lists",
        "Dir::State::status": status,
        "Dir::State::extended_states": root / "extended_states",
        "Dir::Cache": root / "cache",
        "Acquire::Languages": "none",
        "APT::Sandbox::User": "root",
        "APT::Architecture": "amd64",
    }
    config = root / "apt.conf"
    config.write_text("".join(f'{key} "{value}";\n' for key, value in settings.items()))
    return {"APT_CONFIG": str(config)}


def _requested(extracted: Path) -> list[str]:
    return (extracted / "debs/packages.txt").read_text().split()


@pytest.mark.parametrize("host", ["nothing installed", "this host's packages"])
def test_apt_finds_every_package_and_dependency_in_the_bundle(
    offline: Offline, extracted: Path, tmp_path: Path, host: str
) -> None:
    status = tmp_path / "status"
    if host == "nothing installed":
        status.write_text("")
    else:  # installed at whatever point release this machine has (older or newer than the bundle's)
        status.write_bytes(Path("/var/lib/dpkg/status").read_bytes())
    env = _apt(tmp_path / "apt", extracted / "debs", status)
    updated = offline.run(["apt-get", "update"], env=env)
    assert updated.returncode == 0, _out(updated)
    simulated = offline.run(
        ["apt-get", "install", "--simulate", "--no-install-recommends", *_requested(extracted)], env=env
    )
    assert simulated.returncode == 0, _out(simulated)
    would_install = set(re.findall(r"^Inst (\S+)", simulated.stdout, re.MULTILINE))
    in_repo = {s["Package"] for s in parse_packages((extracted / "debs/Packages").read_text())}
    assert would_install <= in_repo
    if host == "nothing installed":
        # The repository is the closure of what is installed plus the files shipped only
        # (SHIP_ONLY: the guest kernel), no more and no less.
        everything = offline.run(
            [
                "apt-get",
                "install",
                "--simulate",
                "--no-install-recommends",
                *_requested(extracted),
                *SHIP_ONLY,
            ],
            env=env,
        )
        assert everything.returncode == 0, _out(everything)
        assert set(re.findall(r"^Inst (\S+)", everything.stdout, re.MULTILINE)) == in_repo
    # Every file as the index records it (apt checks each one's size and sha256).
    fetched = offline.run(
        ["apt-get", "install", "--download-only", "--yes", "--no-install-recommends", *_requested(extracted)],
        env=env,
    )
    assert fetched.returncode == 0, _out(fetched)


def test_apt_fails_when_a_dependency_is_missing(offline: Offline, extracted: Path, tmp_path: Path) -> None:
    """The apt test above would catch a package the closure lacks."""
    repo = tmp_path / "repo"
    repo.mkdir()
    index = (extracted / "debs/Packages").read_text()
    kept = [block for block in index.split("\n\n") if not block.startswith("Package: libfuse3-3\n")]
    assert len(kept) == len(index.split("\n\n")) - 1
    (repo / "Packages").write_text("\n\n".join(kept))
    status = tmp_path / "status"
    status.write_text("")
    env = _apt(tmp_path / "apt", repo, status)
    assert offline.run(["apt-get", "update"], env=env).returncode == 0
    result = offline.run(["apt-get", "install", "--simulate", "--no-install-recommends", "fuse3"], env=env)
    assert result.returncode != 0
    assert "libfuse3-3" in result.stdout + result.stderr


# binary and its arguments -> the pin whose version it must print
VERSIONS = {
    ("kube-apiserver", "--version"): "kubernetes",
    ("kubelet", "--version"): "kubernetes",
    ("kubectl", "version", "--client"): "kubernetes",
    ("etcd", "--version"): "etcd",
    ("runsc", "--version"): "gvisor",
    ("containerd", "--version"): "containerd",
    ("crictl", "--version"): "cri-tools",
    ("coredns", "-version"): "coredns",
}


@pytest.mark.parametrize("command", sorted(VERSIONS), ids=lambda c: c[0])
def test_the_go_binaries_run_offline(
    offline: Offline, extracted: Path, manifest: Manifest, command: tuple[str, ...]
) -> None:
    pin = VERSIONS[command]
    result = offline.run([extracted / "bin/cluster" / command[0], *command[1:]])
    assert result.returncode == 0, _out(result)
    version = manifest.pins["cluster-binaries"][pin].removeprefix("v")
    assert version in result.stdout + result.stderr


def test_the_image_archives_are_valid_oci_layouts(extracted: Path, manifest: Manifest) -> None:
    images = sorted((extracted / "images").glob("*.tar"))
    services = {"warren-control", "warren-blockd", "seaweedfs", "postgres", "agent", "base"}
    assert {p.stem for p in images} == {"busybox", "coredns", "pause", *services}
    names = {}
    for path in images:
        with tarfile.open(path) as tar:
            files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
        assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
        for name, data in files.items():
            if name.startswith("blobs/sha256/"):
                assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1], f"{path.name}: {name}"
        index = json.loads(files["index.json"])
        for descriptor in index["manifests"]:
            blob = files[f"blobs/sha256/{descriptor['digest'].split(':')[1]}"]
            assert len(blob) == descriptor["size"]
            image_manifest = json.loads(blob)
            for part in (image_manifest["config"], *image_manifest["layers"]):
                assert len(files[f"blobs/sha256/{part['digest'].split(':')[1]}"]) == part["size"]
            names[descriptor["annotations"]["io.containerd.image.name"]] = descriptor["digest"]
    assert names == dict(manifest.pins["images"])


def test_the_pulumi_binaries_run_offline_or_their_absence_is_noted(
    offline: Offline, extracted: Path, manifest: Manifest
) -> None:
    pins = manifest.pins.get("pulumi-binaries")
    if pins is None:
        assert any(note.startswith("Pulumi binaries not included") for note in manifest.notes)
        assert not (extracted / "bin/pulumi").exists()
        return
    quiet = {"PULUMI_SKIP_UPDATE_CHECK": "true", "PULUMI_HOME": str(offline.home / ".pulumi")}
    result = offline.run([extracted / "bin/pulumi/pulumi", "version"], env=quiet)
    assert result.returncode == 0, _out(result)
    assert pins["pulumi"].removeprefix("v") in result.stdout
