"""The policy pack enforced by the real Pulumi CLI: `pulumi preview --policy-pack policy/analyzer`.

The CLI, language host and Kubernetes provider are the ones tools/build-pulumi.sh builds; the
pack runs in components/.venv. Two programs, each with a file backend and PULUMI_HOME of its
own in a temporary directory:

1. A small program that creates the Kubernetes objects the test hands it, through a provider
   that only renders YAML (`renderYamlToDirectory`), so no cluster is needed. Compliant objects
   preview cleanly; each violating one is refused: a non-zero exit and the rule's name.
2. The real program (infra/) with the `local` stack: warren's defaults preview cleanly, and a
   warren configuration whose RuntimeClass names the `runc` handler is refused. Its kubeconfig
   names a port nothing listens on: a preview needs no cluster, and none is reached.

Nothing is mocked; the pack is the repository's. `make pulumi-test` runs this with the
local-stack test (-m pulumi).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.pulumi

REPO = Path(__file__).resolve().parents[2]
PACK = REPO / "policy" / "analyzer"
PACK_NAME = "warren-security@v0.1.0"
COMPONENTS_PYTHON = REPO / "components" / ".venv" / "bin" / "python"
PASSPHRASE = "throw-away-test-stack"  # noqa: S105  # for stacks that live for one test and hold no secret
TIMEOUT = 300.0

PROGRAM = '''\
"""Creates the objects of objects.json; the provider only renders YAML, so no cluster is needed."""

import json
from pathlib import Path

import pulumi_kubernetes as k8s

import pulumi

KINDS = {
    ("node.k8s.io/v1", "RuntimeClass"): k8s.node.v1.RuntimeClass,
    ("v1", "Namespace"): k8s.core.v1.Namespace,
    ("v1", "Pod"): k8s.core.v1.Pod,
    ("apps/v1", "Deployment"): k8s.apps.v1.Deployment,
}
provider = k8s.Provider("render", render_yaml_to_directory="rendered")
for obj in json.loads(Path("objects.json").read_text()):
    fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    KINDS[(obj["apiVersion"], obj["kind"])](
        f"{obj['kind'].lower()}-{obj['metadata']['name']}",
        metadata=obj["metadata"],
        opts=pulumi.ResourceOptions(provider=provider),
        **fields,
    )
'''

Obj = dict[str, Any]


def runtime_class(handler: str) -> Obj:
    return {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": "gvisor"},
        "handler": handler,
    }


def sandbox_namespace(enforce: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": "sandboxes",
            "labels": {
                "warren.dev/sandbox": "true",
                "pod-security.kubernetes.io/enforce": enforce,
                "pod-security.kubernetes.io/warn": "restricted",
                "pod-security.kubernetes.io/audit": "restricted",
            },
        },
    }


def pod_spec(**extra: Any) -> Obj:
    return {"containers": [{"name": "app", "image": "app:1"}], **extra}


def deployment(spec: Obj) -> Obj:
    labels = {"app": "web"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": spec},
        },
    }


def pod(spec: Obj) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": spec,
    }


COMPLIANT = [runtime_class("runsc"), sandbox_namespace("baseline"), deployment(pod_spec()), pod(pod_spec())]
# Each: the compliant objects with one replaced, and the rule that must refuse it.
VIOLATIONS: dict[str, tuple[int, Obj, str]] = {
    "runc-runtime-class": (0, runtime_class("runc"), "k8s-runtime-class-gvisor"),
    "privileged-sandbox-namespace": (
        1,
        sandbox_namespace("privileged"),
        "k8s-sandbox-namespace-pod-security",
    ),
    "privileged-container": (
        2,
        deployment(
            {"containers": [{"name": "app", "image": "app:1", "securityContext": {"privileged": True}}]}
        ),
        "k8s-no-privileged-containers",
    ),
    "host-network": (3, pod(pod_spec(hostNetwork=True)), "k8s-no-host-namespaces"),
    "host-path": (
        3,
        pod(pod_spec(volumes=[{"name": "root", "hostPath": {"path": "/"}}])),
        "k8s-no-host-path",
    ),
}


@dataclass(frozen=True)
class Result:
    argv: list[str]
    rc: int
    output: str
    seconds: float

    def describe(self) -> str:
        return f"$ {' '.join(self.argv)}\nrc={self.rc} after {self.seconds:.1f}s\n{self.output[-8000:]}"


def run(argv: list[str], *, cwd: Path, env: dict[str, str]) -> Result:
    """Run in a process group of its own, so a timeout also ends the CLI's plugins (and the pack)."""
    started = time.monotonic()
    with subprocess.Popen(  # our own commands
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            output, _ = process.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"{' '.join(argv)} did not finish in {TIMEOUT:.0f}s:\n{output[-8000:]}")
    return Result(argv, process.returncode, output, round(time.monotonic() - started, 1))


def checked(result: Result) -> Result:
    assert result.rc == 0, result.describe()
    return result


def mandatory_violations(output: str) -> set[str]:
    """The rules the CLI lists as violated (`- [mandatory]  <rule>  (<type>: <name>)`)."""
    return set(re.findall(r"\[mandatory\]\s+(\S+)", output))


def refused_by(result: Result, rule: str) -> None:
    """A mandatory violation of `rule`, and of no other rule, stopped the preview."""
    assert result.rc != 0, f"not refused:\n{result.describe()}"
    assert mandatory_violations(result.output) == {rule}, result.describe()


def passed(result: Result) -> None:
    checked(result)
    assert PACK_NAME in result.output, f"the pack did not run:\n{result.describe()}"
    assert mandatory_violations(result.output) == set(), result.describe()


class Pulumi:
    """The built CLI with a file backend and PULUMI_HOME under `root`, run in `program`."""

    def __init__(self, root: Path, program: Path, bin_dir: Path) -> None:
        self.program = program
        state = root / "pulumi-state"
        state.mkdir()
        # Nothing from the caller's PULUMI_* (backend, tokens, provider switches) or KUBECONFIG.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "KUBECONFIG"))}
        self.env = {
            **env,
            "PATH": f"{bin_dir}:{COMPONENTS_PYTHON.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            # The language host built from sdk/v3 v3.68.0 ignores runtime.options.virtualenv.
            "PULUMI_PYTHON_CMD": str(COMPONENTS_PYTHON),
            "PULUMI_HOME": str(root / "pulumi-home"),
            "PULUMI_BACKEND_URL": state.as_uri(),
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
            "TMPDIR": str(root),
        }
        self.pulumi = str(bin_dir / "pulumi")

    def __call__(self, *args: str) -> Result:
        return run([self.pulumi, *args, "--non-interactive", "--color=never"], cwd=self.program, env=self.env)

    def preview(self, stack: str) -> Result:
        return self("preview", "--stack", stack, "--policy-pack", str(PACK))


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    value = os.environ.get("WARREN_PULUMI_BIN_DIR")
    if not value:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "WARREN_PULUMI_BIN_DIR is not set: `make pulumi-test` sets it (tools/build-pulumi.sh prints it)"
        )
    path = Path(str(value))
    for tool in (
        "pulumi",
        "pulumi-language-python",
        "pulumi-language-python-exec",
        "pulumi-resource-kubernetes",
    ):
        assert (path / tool).is_file(), f"{path / tool} is missing: run tools/build-pulumi.sh"
    assert COMPONENTS_PYTHON.is_file(), "components/.venv is missing: make components/.venv/.installed"
    return path


@pytest.fixture(scope="module")
def objects_program(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pulumi]:
    root = tmp_path_factory.mktemp("policy-objects")
    program = root / "program"
    program.mkdir()
    (program / "Pulumi.yaml").write_text("name: policy-probe\nruntime: python\n")
    (program / "__main__.py").write_text(PROGRAM)
    pulumi = Pulumi(root, program, bin_dir)
    checked(pulumi("stack", "init", "probe"))
    yield pulumi
    shutil.rmtree(root, ignore_errors=True)


def preview_objects(pulumi: Pulumi, objects: list[Obj]) -> Result:
    (pulumi.program / "objects.json").write_text(json.dumps(objects))
    return pulumi.preview("probe")


def test_compliant_objects_pass(objects_program: Pulumi) -> None:
    result = preview_objects(objects_program, COMPLIANT)
    passed(result)
    for typ in ("RuntimeClass", "Namespace", "Deployment", "Pod"):
        assert typ in result.output, result.describe()  # all were previewed, so all were checked
    print(f"compliant objects: preview passed in {result.seconds}s")


@pytest.mark.parametrize("case", sorted(VIOLATIONS))
def test_violating_object_is_refused(objects_program: Pulumi, case: str) -> None:
    index, replacement, rule = VIOLATIONS[case]
    objects = [*COMPLIANT]
    objects[index] = replacement
    result = preview_objects(objects_program, objects)
    refused_by(result, rule)
    print(f"{case}: refused by {rule} in {result.seconds}s")


# --- the real program, the local stack ---------------------------------------------------------


def unreachable_kubeconfig(path: Path) -> Path:
    """A kubeconfig naming a loopback port nothing listens on (picked free, then left closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "none", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "users": [{"name": "none", "user": {"token": "none"}}],
        "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
        "current-context": "none",
    }
    path.write_text(json.dumps(kubeconfig))
    return path


@pytest.fixture(scope="module")
def local_stack(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pulumi]:
    """infra/ and stacks/Pulumi.local.yaml copied (stack init writes into the stack file);
    components/ linked, so the project's `virtualenv: ../components/.venv` still resolves."""
    root = tmp_path_factory.mktemp("policy-local")
    infra = root / "project" / "infra"
    shutil.copytree(REPO / "infra", infra, ignore=shutil.ignore_patterns("__pycache__"))
    (root / "project" / "stacks").mkdir()
    shutil.copy2(REPO / "stacks" / "Pulumi.local.yaml", root / "project" / "stacks")
    (root / "project" / "components").symlink_to(REPO / "components")
    pulumi = Pulumi(root, infra, bin_dir)
    checked(pulumi("stack", "init", "local"))
    kubeconfig = unreachable_kubeconfig(root / "kubeconfig")
    checked(pulumi("config", "set", "--stack", "local", "warren:kubeconfig", str(kubeconfig)))
    # Not this machine's local node: the configuration is rendered as it is.
    checked(pulumi("config", "set", "--stack", "local", "warren:localNode", "false"))
    yield pulumi
    shutil.rmtree(root, ignore_errors=True)


def test_local_stack_previews_clean_with_the_pack(local_stack: Pulumi) -> None:
    checked(local_stack("config", "set", "--stack", "local", "warren:configFile", ""))
    result = local_stack.preview("local")
    passed(result)
    assert "kubernetes:node.k8s.io/v1:RuntimeClass" in result.output, result.describe()
    print(f"local stack (warren's defaults): preview passed in {result.seconds}s")


def test_local_stack_with_a_runc_runtime_class_is_refused(local_stack: Pulumi) -> None:
    config = local_stack.program / "warren-runc.yaml"
    config.write_text("isolation:\n  runtime_handler: runc\n")
    checked(local_stack("config", "set", "--stack", "local", "warren:configFile", config.name))
    result = local_stack.preview("local")
    refused_by(result, "k8s-runtime-class-gvisor")
    print(f"local stack (runtime_handler runc): refused in {result.seconds}s")
