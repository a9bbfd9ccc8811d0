"""Warren's service images (warren image build): each service runs inside its own image,
the same inputs give the same digests, and a real registry serves exactly what was built.
The sandbox images too: the agent's image holds a static agent that runs with nothing
beside it and installs itself, and the base template's userland runs its tools and the
agent as its own user.

As root: mmdebstrap builds the Debian userland as root, and each image is unpacked into a
directory and entered with chroot to run its service's own command.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import shutil
import socket
import struct
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from warren.bundle import cache
from warren.images import Built, debian, sandbox, services
from warren.images.registry import push

pytestmark = pytest.mark.images

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def cache_root() -> Path:
    return cache.default_root().absolute()


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory, cache_root: Path) -> dict[str, Built]:
    if os.geteuid() != 0:
        pytest.fail("the images tier runs as root (mmdebstrap, chroot): run it through make images-test")
    out = tmp_path_factory.mktemp("images")
    images = services.build_from_checkout(REPO, out, cache_root, progress=print)
    return {Path(b.archive).stem: b for b in images}


def _read(tar: tarfile.TarFile, name: str) -> bytes:
    member = tar.extractfile(name)
    assert member is not None, name
    return member.read()


def _manifest(tar: tarfile.TarFile) -> dict[str, Any]:
    index = json.loads(_read(tar, "index.json"))
    digest = index["manifests"][0]["digest"].split(":")[1]
    return json.loads(_read(tar, f"blobs/sha256/{digest}"))  # type: ignore[no-any-return]


def _layers(archive: Path) -> list[bytes]:
    """The archive's layers, uncompressed, bottom first."""
    with tarfile.open(archive) as tar:
        return [
            gzip.decompress(_read(tar, f"blobs/sha256/{layer['digest'].split(':')[1]}"))
            for layer in _manifest(tar)["layers"]
        ]


def _unpack(built: dict[str, Built], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each image's layers unpacked in order into a directory of its own (as root: owners kept)."""
    roots = {}
    for name, image in built.items():
        root = tmp_path_factory.mktemp(f"root-{name}")
        for layer in _layers(image.archive):
            layer_file = root.parent / f"{name}-layer.tar"
            layer_file.write_bytes(layer)
            subprocess.run(["tar", "-xpf", str(layer_file), "-C", str(root), "--numeric-owner"], check=True)
            layer_file.unlink()
        roots[name] = root
    return roots


@pytest.fixture(scope="session")
def unpacked(built: dict[str, Built], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _unpack(built, tmp_path_factory)


def chroot(
    root: Path, *argv: str, user: str | None = None, home: str = "/tmp"
) -> subprocess.CompletedProcess[str]:
    prefix = ["chroot", *([f"--userspec={user}"] if user else []), str(root)]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C.UTF-8", "HOME": home}
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, env=env, check=False, timeout=120)


def test_every_service_has_an_image(built: dict[str, Built]) -> None:
    assert set(built) == {s.name for s in services.SERVICES}
    for name, image in built.items():
        assert image.name == services.image_name(name, services.project_version(REPO))


def test_control_plane_runs_in_its_image(unpacked: dict[str, Path]) -> None:
    root = unpacked["warren-control"]
    result = chroot(root, "/opt/warren/control/bin/warren-control", "--help", user="warren")
    assert result.returncode == 0, result.stderr
    assert "serve" in result.stdout
    # Its workspace tool reads the store: warren-blockd's CLI, from the image.
    tool = chroot(root, "/opt/warren/blockd/bin/warren-blockd", "replicated", "--help", user="warren")
    assert tool.returncode == 0, tool.stderr
    # Nothing installs into it after the build.
    assert not (root / "opt/warren/control/bin/pip").exists()


def test_blockd_runs_in_its_image_with_its_host_tools(unpacked: dict[str, Path]) -> None:
    root = unpacked["warren-blockd"]
    result = chroot(root, "/opt/warren/blockd/bin/warren-blockd", "--help")
    assert result.returncode == 0, result.stderr
    for tool in ("mkfs.ext4", "debugfs", "losetup", "fusermount3", "fsfreeze", "findmnt", "mount"):
        assert chroot(root, "sh", "-c", f"command -v {tool}").returncode == 0, f"{tool} is not in the image"
    # The CSI stubs are in the wheel the image installed.
    stub = chroot(root, "/opt/warren/blockd/bin/python", "-c", "import warren_blockd.csi._proto.csi_pb2")
    assert stub.returncode == 0, stub.stderr
    # The object store's binary lives in its own image only.
    assert not (root / "opt/warren/blockd/bin/weed").exists()


def test_seaweedfs_runs_in_its_image(unpacked: dict[str, Path]) -> None:
    result = chroot(unpacked["seaweedfs"], "/opt/warren/seaweedfs/bin/weed", "version", user="warren")
    assert result.returncode == 0, result.stderr
    assert "version" in result.stdout.lower()


def test_postgres_entrypoint_initialises_once_and_serves(unpacked: dict[str, Path]) -> None:
    """The entrypoint makes the data directory with the password from a file, then execs the
    server, which comes up; a second start finds the directory made and leaves it."""
    root = unpacked["postgres"]
    for mount in ("proc", "dev/shm"):
        (root / mount).mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "shm", str(root / "dev/shm")], check=True)
    try:
        data = root / "var/lib/warren-pg"
        data.mkdir(mode=0o700)
        (root / "run/postgresql").mkdir(parents=True, exist_ok=True)
        (root / "tmp/password").write_text("s3cret\n")
        owned = ("/var/lib/warren-pg", "/run/postgresql", "/tmp/password")
        subprocess.run(["chroot", str(root), "chown", "postgres:postgres", *owned], check=True)
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PGDATA": "/var/lib/warren-pg", "LC_ALL": "C.UTF-8"}
        env["POSTGRES_PASSWORD_FILE"] = "/tmp/password"  # noqa: S105  # a path, not a password
        for first in (True, False):
            argv = ["chroot", "--userspec=postgres", str(root), "/opt/warren/postgres/entrypoint.sh"]
            server = subprocess.Popen(
                [*argv, "-p", str(_free_port())], env=env, stderr=subprocess.PIPE, text=True
            )
            assert server.stderr is not None
            try:
                seen, deadline = "", time.monotonic() + 60
                while "ready to accept connections" not in seen:
                    assert server.poll() is None, f"postgres exited: {seen}{server.stderr.read()}"
                    assert time.monotonic() < deadline, seen
                    seen += server.stderr.readline()
                # initdb's report appears at the first start only.
                assert ("Success." in seen) == first, seen
            finally:
                server.terminate()
                server.wait(timeout=30)
        assert (data / "PG_VERSION").read_text().strip() == "15"
        assert "scram-sha-256" in (data / "pg_hba.conf").read_text()
    finally:
        subprocess.run(["umount", str(root / "dev/shm")], check=False)
        subprocess.run(["umount", str(root / "proc")], check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_same_inputs_give_the_same_digests(
    built: dict[str, Built],
    sandbox_built: dict[str, Built],
    cache_root: Path,
    tmp_path: Path,
) -> None:
    """Everything again from the same wheels with no image cached: the Debian userland by
    mmdebstrap, the layers, the archives. Every manifest digest and every archive's bytes
    are the same. The sandbox images are rebuilt beside them (two cores): their userland by
    mmdebstrap with nothing cached, the agent by Go (whose own build cache stays: Go's
    builds without paths and VCS state are reproducible by the toolchain's design)."""
    version = services.project_version(REPO)
    with ThreadPoolExecutor(1) as pool:
        sandbox_again = pool.submit(
            sandbox.build, REPO / "agent", version, tmp_path / "fresh-sandbox", tmp_path / "out-sandbox"
        )
        again = services.build_from_checkout(
            REPO, tmp_path / "out", cache_root, images_cache=tmp_path / "fresh", progress=print
        )
        again += sandbox_again.result()
    before = [*built.values(), *sandbox_built.values()]
    assert {b.name: b.manifest_digest for b in again} == {b.name: b.manifest_digest for b in before}
    assert {b.name: b.archive_sha256 for b in again} == {b.name: b.archive_sha256 for b in before}


def test_images_share_the_base_layer(built: dict[str, Built]) -> None:
    bases = set()
    for image in built.values():
        with tarfile.open(image.archive) as tar:
            bases.add(_manifest(tar)["layers"][0]["digest"])
    assert len(bases) == 1, bases


def test_the_users_the_workloads_run_as_are_the_images_own(unpacked: dict[str, Path]) -> None:
    """The rendered pods name numeric users (runAsNonRoot needs them): they must be the
    image's warren and postgres users."""
    for name, root in unpacked.items():
        users = {
            fields[0]: (int(fields[2]), int(fields[3]))
            for fields in (line.split(":") for line in (root / "etc/passwd").read_text().splitlines())
        }
        assert users["warren"] == (services.UID, services.UID), name
        assert users["postgres"] == (services.POSTGRES_UID, services.POSTGRES_GID), name


# -- the sandbox images: the agent alone, and the base template ----------------------------


@pytest.fixture(scope="session")
def sandbox_built(
    built: dict[str, Built], tmp_path_factory: pytest.TempPathFactory, cache_root: Path
) -> dict[str, Built]:
    """After the service images (`built` checks the tier runs as root)."""
    out = tmp_path_factory.mktemp("sandbox-images")
    images = sandbox.build_from_checkout(REPO, out, cache_root, progress=print)
    return {Path(b.archive).stem: b for b in images}


@pytest.fixture(scope="session")
def sandbox_unpacked(
    sandbox_built: dict[str, Built], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    return _unpack(sandbox_built, tmp_path_factory)


def _config(archive: Path) -> dict[str, Any]:
    with tarfile.open(archive) as tar:
        digest = _manifest(tar)["config"]["digest"].split(":")[1]
        return json.loads(_read(tar, f"blobs/sha256/{digest}"))["config"]  # type: ignore[no-any-return]


def _is_static_elf(path: Path) -> bool:
    """An ELF executable with no program interpreter (PT_INTERP): the kernel runs it as it
    is, with no dynamic loader and no libc from the image."""
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, f"{path} is not a 64-bit ELF file"
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    size, count = struct.unpack_from("<HH", data, 0x36)
    types = [struct.unpack_from("<I", data, phoff + i * size)[0] for i in range(count)]
    return 3 not in types  # PT_INTERP


@contextlib.contextmanager
def _proc(root: Path) -> Iterator[None]:
    """/proc mounted inside `root` (as a container has it) while in the block."""
    (root / "proc").mkdir(exist_ok=True)
    subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(root / "proc")], check=False)


def _health(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
        return int(response.status)


def _serving(argv: list[str], env: dict[str, str], port: int) -> subprocess.Popen[str]:
    """The agent started by `argv`, once it accepts connections on `port`."""
    agent = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return agent
        if agent.poll() is not None or time.monotonic() > deadline:
            agent.kill()
            pytest.fail(f"the agent did not listen on {port}: {agent.communicate()[1]}")
        time.sleep(0.1)


def test_the_agent_image_holds_the_static_agent_alone(
    sandbox_built: dict[str, Built], sandbox_unpacked: dict[str, Path]
) -> None:
    image = sandbox_built["agent"]
    assert image.name == sandbox.image_name("agent", services.project_version(REPO))
    assert _config(image.archive)["Entrypoint"] == [sandbox.AGENT_PATH]
    root = sandbox_unpacked["agent"]
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == ["warren", "warren/agent"]
    binary = root / sandbox.AGENT_PATH.lstrip("/")
    assert binary.stat().st_mode & 0o777 == 0o755
    assert _is_static_elf(binary)


def test_the_agent_runs_with_nothing_beside_it(sandbox_unpacked: dict[str, Path]) -> None:
    """Entered with chroot, the image holds no libc and no /etc/passwd: the agent serves."""
    root, port = sandbox_unpacked["agent"], _free_port()
    argv = ["chroot", str(root), sandbox.AGENT_PATH, "-listen", f"127.0.0.1:{port}"]
    agent = _serving(argv, {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/", "USER": "root"}, port)
    try:
        assert _health(port) == 204
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_the_agent_installs_itself_into_a_directory(sandbox_unpacked: dict[str, Path]) -> None:
    """What a sandbox pod's init container does: `agent -install DIR` with DIR a shared
    volume. The copy is the agent's own bytes, executable by any user."""
    root = sandbox_unpacked["agent"]
    (root / "shared").mkdir(exist_ok=True)
    with _proc(root):
        result = chroot(root, sandbox.AGENT_PATH, "-install", "/shared")
    assert result.returncode == 0, result.stderr
    installed = root / "shared/agent"
    assert installed.read_bytes() == (root / sandbox.AGENT_PATH.lstrip("/")).read_bytes()
    assert installed.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in (root / "shared").iterdir()] == ["agent"]
    # Nothing there to install into: it says so and fails.
    refused = chroot(root, sandbox.AGENT_PATH, "-install", "/missing")
    assert refused.returncode != 0
    assert "name an existing directory" in refused.stderr


def test_the_base_image_is_the_template_e2b_code_assumes(
    sandbox_built: dict[str, Built], sandbox_unpacked: dict[str, Path]
) -> None:
    config = _config(sandbox_built["base"].archive)
    assert config["User"] == f"{sandbox.UID}:{sandbox.UID}"
    assert config["WorkingDir"] == sandbox.HOME
    assert config["Cmd"] == list(sandbox.BASE_CMD)
    root = sandbox_unpacked["base"]
    ident = chroot(root, "id", "user")
    assert ident.stdout.strip() == "uid=1000(user) gid=1000(user) groups=1000(user)", ident.stderr
    entry = chroot(root, "getent", "passwd", "user").stdout.strip().split(":")
    assert (entry[5], entry[6]) == (sandbox.HOME, "/bin/bash")
    home = (root / sandbox.HOME.lstrip("/")).stat()
    assert (home.st_uid, home.st_gid) == (sandbox.UID, sandbox.UID)
    # The tools, as the image's user in its home.
    as_user = {"user": f"{sandbox.UID}:{sandbox.UID}", "home": sandbox.HOME}
    script = (
        "set -e; cd ~; git init -q repo; cd repo; echo hi > f; git add f; "
        "git -c user.name=u -c user.email=u@example.com commit -qm one; git log --format=%s; "
        "python3 -c \"import ssl; print(ssl.create_default_context().cert_store_stats()['x509_ca'])\"; "
        "curl --version | head -1; ps -o comm= -p $$; echo $BASH_VERSION"
    )
    with _proc(root):
        result = chroot(root, "bash", "-c", script, **as_user)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "one"
    assert int(lines[1]) > 100, "the image trusts too few certificate authorities"
    assert lines[2].startswith("curl ")
    assert lines[3] == "bash" and lines[4].startswith("5."), lines
    # The default command stays up with no terminal.
    argv = ["chroot", f"--userspec={as_user['user']}", str(root), *sandbox.BASE_CMD]
    sleeper = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    try:
        time.sleep(1)
        assert sleeper.poll() is None, "the default command exited"
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


def test_the_base_image_carries_the_agent_layer_and_the_agent_serves_as_its_user(
    sandbox_built: dict[str, Built], sandbox_unpacked: dict[str, Path]
) -> None:
    with tarfile.open(sandbox_built["agent"].archive) as tar:
        agent_layers = _manifest(tar)["layers"]
    with tarfile.open(sandbox_built["base"].archive) as tar:
        base_layers = _manifest(tar)["layers"]
    assert base_layers[-1] == agent_layers[0], "the base image's agent layer is not the agent image's"
    root, port = sandbox_unpacked["base"], _free_port()
    with _proc(root):
        argv = ["chroot", f"--userspec={sandbox.UID}:{sandbox.UID}", str(root), sandbox.AGENT_PATH]
        env = {"HOME": sandbox.HOME, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
        agent = _serving([*argv, "-listen", f"127.0.0.1:{port}"], env, port)
        try:
            assert _health(port) == 204
            # The image's own curl reaches it too.
            curl = chroot(
                root, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"http://127.0.0.1:{port}/health"
            )
            assert curl.stdout == "204", curl.stderr
        finally:
            agent.terminate()
            agent.wait(timeout=10)
        assert '"user":"user"' in (agent.stderr.read() if agent.stderr else ""), "the agent is not `user`"


# -- a real registry on loopback: Debian's docker-registry ------------------------------------


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.fail("docker-registry is missing: tools/check-host.sh installs Debian's docker-registry")
    port = _free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'data'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: warn\n"
    )
    server = subprocess.Popen(
        [binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline, "the registry did not listen"
            time.sleep(0.2)
        yield f"127.0.0.1:{port}/warren"
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_real_registry_serves_exactly_what_was_built(built: dict[str, Built], registry: str) -> None:
    for image in built.values():
        pushed = push(image.archive, registry, tls_verify=False)
        assert pushed.reference.startswith(registry + "/")
        raw = subprocess.run(
            ["skopeo", "inspect", "--raw", "--tls-verify=false", f"docker://{pushed.reference}"],
            capture_output=True,
            check=True,
        ).stdout
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == image.manifest_digest, image.name
    # Pulled back by digest, the control plane's image is whole (every blob verifies).
    control = built["warren-control"]
    reference = f"{registry}/warren-control@{control.manifest_digest}"
    subprocess.run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            f"docker://{reference}",
            f"dir:{control.archive.parent / 'pulled'}",
        ],
        check=True,
        capture_output=True,
    )


def test_a_push_changes_nothing_once_the_registry_serves_the_image(
    built: dict[str, Built], registry: str
) -> None:
    """What an installer that pushes on every run relies on (the service_images role)."""
    argv = [str(REPO / ".venv" / "bin" / "warren"), "image", "push", str(built["seaweedfs"].archive)]
    argv += ["--registry", registry, "--no-tls-verify", "--json"]

    def run(*extra: str) -> dict[str, Any]:
        done = subprocess.run([*argv, *extra], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    reference = f"{registry}/seaweedfs:{services.project_version(REPO)}"
    assert run("--dry-run") == {
        "changed": True,
        "pushed": [reference],
        "digests": {reference: built["seaweedfs"].manifest_digest},
    }
    assert run("--dry-run")["changed"], "a dry run pushed"
    assert run()["changed"]
    assert run() == {
        "changed": False,
        "pushed": [],
        "digests": {reference: built["seaweedfs"].manifest_digest},
    }
    assert not run("--dry-run")["changed"]


def test_push_refuses_a_bad_registry_name(built: dict[str, Built]) -> None:
    from warren.images.registry import RegistryError

    with pytest.raises(RegistryError, match="is not a registry"):
        push(built["seaweedfs"].archive, "HTTP://Registry Example/warren")


def test_the_key_follows_the_mirror_and_the_packages() -> None:
    one = debian.inputs_key(("python3",), ("true",))
    assert one == debian.inputs_key(("python3",), ("true",))
    assert one != debian.inputs_key(("python3", "curl"), ("true",))
    assert one != debian.inputs_key(("python3",), ("false",))
