"""The two install paths on a real API server: the Ansible `admission` role and a real
`pulumi up` of the `local` stack create the same Kubernetes objects: the isolation floor and
Warren's own services as workloads (warren-pulumi-test.yaml).

On a throw-away control plane (warren_common.kubecluster, its `workloads` preset: etcd,
kube-apiserver, the controllers that deletion and rollouts need, a scheduler and one fake kwok
node, from the pinned binaries; the workloads roll out there, pulumi-kubernetes waits for that,
and nothing runs):

1. ansible-playbook applies the `admission` role (`warren apply`, server-side apply); once the
   workloads have rolled out, a second run changes nothing. Every object warren's render()
   lists is read back from the API server.
2. Those objects are deleted, last first, and waited for until gone.
3. The Pulumi CLI, the Python language host and the Kubernetes provider that
   tools/build-pulumi.sh builds run `pulumi up` of the `local` stack with a file backend, the
   stack's kubeconfig set to the throw-away cluster's, its configuration to the same file and
   `warren:localNode` off (no local node here). The same objects are read back.
4. Each pair must be equal once the fields the API server assigns are dropped.
5. A preview with --expect-no-changes proves the stack converged; `pulumi destroy` must leave
   none of the objects behind; the stack is removed.

Nothing is mocked. The Pulumi program runs from a copy of infra/ and stacks/Pulumi.local.yaml
in the test's temporary directory: `pulumi stack init` writes an `encryptionsalt` into the stack
file and `pulumi config set` the kubeconfig path, and a test must not edit the repository's
files. The copy is the same program with the same stack settings; components/ is linked, not
copied, so the project's `virtualenv: ../components/.venv` still names the real environment.

`make pulumi-test` builds (or finds) both sets of binaries and runs this test; it prints how
long each step took (-rP).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kube_api import Api, Obj
from warren_common.kubecluster import KubeCluster, workloads

from warren.config import load_config
from warren.render import render

pytestmark = pytest.mark.pulumi

REPO = Path(__file__).resolve().parents[2]
MAIN_BIN = REPO / ".venv" / "bin"  # ansible-playbook and warren (`make venv`)
COMPONENTS_PYTHON = REPO / "components" / ".venv" / "bin" / "python"  # `make components/.venv/.installed`
PLAYBOOK = Path(__file__).with_name("admission.yml")
CONFIG = Path(__file__).with_name("warren-pulumi-test.yaml")
STACK = "local"
PASSPHRASE = "throw-away-test-stack"  # noqa: S105  # for a stack that lives for one test and holds no secret
# Within a Pulumi stack, the provider's field manager is `pulumi-kubernetes-<random>`.
PULUMI_MANAGER = re.compile(r"^pulumi-kubernetes-[0-9a-f]+$")
WARREN_MANAGER = "warren"
RECAP = re.compile(
    r"^localhost\s*:\s*ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)",
    re.MULTILINE,
)
COMMAND_TIMEOUT = 900.0
# A CRD goes only after the API server's own finalizer has removed its instances, which it
# retries with a growing backoff when a first attempt fails: on two busy cores (the other
# lanes' image builds) that once took over 120 s for a CRD that had no instances.
GONE_TIMEOUT = 300.0
ROLLOUT_TIMEOUT = 180.0

# What the API server assigns to every object whoever writes it: identity, version, time,
# and who wrote which field (`warren` on one side, `pulumi-kubernetes-<random>` on the other;
# checked separately). `status` is the server's (a CRD's conditions and accepted names, a
# namespace's phase) and carries timestamps of its own.
SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")
# Defaults the API server fills in (a namespace's `kubernetes.io/metadata.name` label and
# `spec.finalizers`, a CRD's `conversion: None`, a policy's `matchPolicy`, selectors...) are
# NOT dropped: both paths send the same object, so the server fills the same defaults, and a
# difference there would be a real difference in what was sent. Two things the server makes
# per object are set aside too: a Service's allocated cluster IPs, and the Job's own uid,
# which the server writes into the selector and pod labels it makes for the Job.
SERVICE_ALLOCATED = ("clusterIP", "clusterIPs")


def _env_var(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"{name} is not set: `make pulumi-test` sets it (or run the build script and export it)"
        )
    return Path(str(value))


def _without_uid(value: Any, uid: str) -> Any:
    if isinstance(value, dict):
        return {k: _without_uid(v, uid) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_uid(v, uid) for v in value]
    return "<own uid>" if value == uid else value


def comparable(obj: Obj) -> Obj:
    """`obj` without what the API server assigns (see SERVER_METADATA, SERVICE_ALLOCATED)."""
    result = copy.deepcopy(obj)
    result.pop("status", None)
    meta = result.get("metadata") or {}
    uid = meta.get("uid")
    for key in SERVER_METADATA:
        meta.pop(key, None)
    if result.get("kind") == "Service":
        for key in SERVICE_ALLOCATED:
            (result.get("spec") or {}).pop(key, None)
    return _without_uid(result, uid) if uid else result


def label(obj: Obj) -> str:
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{obj['kind']}/{namespace}/{meta['name']}" if namespace else f"{obj['kind']}/{meta['name']}"


def managers(obj: Obj) -> set[tuple[str, str]]:
    """(manager, operation) of every managedFields entry."""
    entries = obj["metadata"].get("managedFields") or []
    return {(entry.get("manager", ""), entry.get("operation", "")) for entry in entries}


@dataclass
class Timings:
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, step: str, seconds: float) -> None:
        self.seconds[step] = round(seconds, 1)

    def report(self) -> str:
        return "\n".join(f"  {step:<40} {value:7.1f} s" for step, value in self.seconds.items())


@dataclass(frozen=True)
class Result:
    argv: list[str]
    rc: int
    output: str
    seconds: float

    def describe(self) -> str:
        return f"$ {' '.join(self.argv)}\nrc={self.rc} after {self.seconds:.1f}s\n{self.output[-8000:]}"


def run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = COMMAND_TIMEOUT) -> Result:
    """Run a command in a process group of its own; on a timeout the whole group (the Pulumi
    CLI, its language host and provider plugins) is killed, not only the command."""
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
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            pytest.fail(f"{' '.join(argv)} did not finish in {timeout:.0f}s:\n{output[-8000:]}")
    return Result(argv, process.returncode, output, round(time.monotonic() - started, 1))


def checked(result: Result) -> Result:
    assert result.rc == 0, result.describe()
    return result


# --- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[KubeCluster]:
    bin_dir = _env_var("WARREN_BIN_DIR")
    with KubeCluster(bin_dir, workloads()) as plane:
        yield plane


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="warren-pulumi-test-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def rendered() -> list[Obj]:
    """What both paths apply: the floor and Warren's services as workloads."""
    objects = render(load_config(CONFIG))
    assert {"Deployment", "DaemonSet", "StatefulSet", "Job"} <= {o["kind"] for o in objects}
    return objects


def _base_env(workdir: Path, cluster: KubeCluster) -> dict[str, str]:
    """The caller's environment without anything that could aim a tool elsewhere: no PULUMI_*
    (backend, tokens, PULUMI_K8S_* provider switches) and no KUBECONFIG but the throw-away one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "KUBECONFIG", "ANSIBLE_"))}
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    env.update(
        {
            # A safety net: a tool that ignored its explicit kubeconfig would reach this cluster.
            "KUBECONFIG": str(cluster.admin_kubeconfig),
            "WARREN_HOME": str(workdir / "warren-home"),  # never the real local cluster's state
            # The Kubernetes client's discovery cache (`warren apply`) and Pulumi's scratch files.
            "TMPDIR": str(tmp),
        }
    )
    return env


# --- the Ansible path -------------------------------------------------------------------------


@dataclass(frozen=True)
class Play:
    result: Result
    changed: int
    failed: int


def ansible_play(workdir: Path, cluster: KubeCluster) -> Play:
    for tool in ("ansible-playbook", "warren"):
        if not (MAIN_BIN / tool).is_file():
            pytest.fail(f"{MAIN_BIN / tool} is missing: `make venv` installs it")
    variables = workdir / "ansible-vars.json"
    variables.write_text(
        json.dumps(
            {
                "ansible_python_interpreter": str(MAIN_BIN / "python"),
                "admission_warren": str(MAIN_BIN / "warren"),
                "admission_kubeconfig": str(cluster.admin_kubeconfig),
                "admission_config": str(CONFIG),
            }
        )
    )
    env = {
        **_base_env(workdir, cluster),
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(REPO / "roles"),
        "ANSIBLE_LOCAL_TEMP": str(workdir / "ansible-tmp"),
        "ANSIBLE_REMOTE_TEMP": str(workdir / "ansible-tmp"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{MAIN_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    result = run(
        [str(MAIN_BIN / "ansible-playbook"), "-i", "localhost,", str(PLAYBOOK), "-e", f"@{variables}"],
        cwd=REPO,
        env=env,
    )
    recap = RECAP.search(result.output)
    assert recap, f"no PLAY RECAP:\n{result.describe()}"
    return Play(result, changed=int(recap["changed"]), failed=int(recap["failed"]))


# --- the Pulumi path --------------------------------------------------------------------------


class PulumiProject:
    """The Pulumi program (infra/) and the local stack's settings, copied into `root`, with a
    file backend and a PULUMI_HOME of their own and the CLI and plugins of `bin_dir`."""

    def __init__(self, root: Path, bin_dir: Path, cluster: KubeCluster) -> None:
        self.root = root
        self.infra = root / "project" / "infra"
        shutil.copytree(REPO / "infra", self.infra, ignore=shutil.ignore_patterns("__pycache__"))
        (root / "project" / "stacks").mkdir()
        shutil.copy2(REPO / "stacks" / f"Pulumi.{STACK}.yaml", root / "project" / "stacks")
        (root / "project" / "components").symlink_to(REPO / "components")
        state = root / "pulumi-state"
        state.mkdir()
        self.env = {
            **_base_env(root, cluster),
            "PATH": f"{bin_dir}:{COMPONENTS_PYTHON.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
            # The language host built from sdk/v3 v3.68.0 ignores runtime.options.virtualenv.
            "PULUMI_PYTHON_CMD": str(COMPONENTS_PYTHON),
            "PULUMI_HOME": str(root / "pulumi-home"),
            "PULUMI_BACKEND_URL": state.as_uri(),
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
            "PULUMI_SKIP_UPDATE_CHECK": "true",
            "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        }
        self.pulumi = str(bin_dir / "pulumi")

    def __call__(self, *args: str) -> Result:
        return run([self.pulumi, *args, "--non-interactive", "--color=never"], cwd=self.infra, env=self.env)


# --- reading the cluster ----------------------------------------------------------------------


def dump(api: Api, objects: list[Obj]) -> dict[str, Obj]:
    """Each rendered object as the API server has it, keyed by kind, namespace and name."""
    found: dict[str, Obj] = {}
    missing = []
    for obj in objects:
        live = api.get(obj)
        if live is None:
            missing.append(label(obj))
        else:
            found[label(obj)] = live
    assert not missing, f"not on the API server: {missing}"
    return found


def rolled_out(live: Obj) -> bool:
    """Whether a workload's controller has done its work (kubectl rollout status's rules; a
    Job complete); other kinds are there once they exist."""
    kind, spec, status = live["kind"], live.get("spec") or {}, live.get("status") or {}
    if kind == "Job":
        return any(
            c.get("type") == "Complete" and c.get("status") == "True" for c in status.get("conditions") or []
        )
    if kind not in {"Deployment", "DaemonSet", "StatefulSet"}:
        return True
    if status.get("observedGeneration", 0) < live["metadata"].get("generation", 1):
        return False
    if kind == "DaemonSet":
        wanted = int(status.get("desiredNumberScheduled", 0))
        return wanted > 0 and status.get("numberReady") == status.get("updatedNumberScheduled") == wanted
    replicas = int(spec.get("replicas", 1))
    if kind == "StatefulSet":
        same_revision = bool(status.get("currentRevision") == status.get("updateRevision"))
        return status.get("readyReplicas") == replicas and same_revision
    return bool(status.get("updatedReplicas") == status.get("availableReplicas") == replicas)


def wait_rolled_out(api: Api, objects: list[Obj], timeout: float = ROLLOUT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while True:
        waiting = [
            label(obj) for obj in objects if not rolled_out(api.get(obj) or {"kind": "?", "metadata": {}})
        ]
        if not waiting:
            return
        assert time.monotonic() < deadline, f"not rolled out after {timeout:.0f}s: {waiting}"
        time.sleep(1)


def wait_all_gone(api: Api, objects: list[Obj], timeout: float = GONE_TIMEOUT) -> list[str]:
    """Labels of the objects still there after `timeout` (none: all gone)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [label(obj) for obj in objects if api.get(obj) is not None]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def conditions(api: Api, objects: list[Obj], labels: list[str]) -> dict[str, Any]:
    """What the objects still there say of themselves (a CRD's Terminating condition says
    what its deletion waits for)."""
    held = {label(obj): api.get(obj) for obj in objects if label(obj) in labels}
    return {name: ((obj or {}).get("status") or {}).get("conditions") for name, obj in held.items()}


def missing_fields(wanted: Any, live: Any, path: str = "") -> list[str]:
    """Paths of what `wanted` (a rendered object) has and `live` lacks or has otherwise. The
    server may add fields (defaults), so only what was rendered is looked for."""
    if isinstance(wanted, dict) and isinstance(live, dict):
        return [
            m for key, value in wanted.items() for m in missing_fields(value, live.get(key), f"{path}.{key}")
        ]
    if isinstance(wanted, list) and isinstance(live, list) and len(wanted) == len(live):
        return [
            m
            for i, (w, v) in enumerate(zip(wanted, live, strict=True))
            for m in missing_fields(w, v, f"{path}[{i}]")
        ]
    return (
        []
        if wanted == live
        else [f"{path}: rendered {json.dumps(wanted)[:200]}, live {json.dumps(live)[:200]}"]
    )


def differences(left: Any, right: Any, path: str = "") -> list[str]:
    """Readable paths where two JSON values differ."""
    if isinstance(left, dict) and isinstance(right, dict):
        out: list[str] = []
        for key in sorted(set(left) | set(right)):
            where = f"{path}.{key}"
            if key not in right:
                out.append(f"{where}: only on the Ansible side: {json.dumps(left[key])[:300]}")
            elif key not in left:
                out.append(f"{where}: only on the Pulumi side: {json.dumps(right[key])[:300]}")
            else:
                out.extend(differences(left[key], right[key], where))
        return out
    if isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
        return [
            d
            for i, (a, b) in enumerate(zip(left, right, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    if left != right:
        return [f"{path}: Ansible {json.dumps(left)[:300]} != Pulumi {json.dumps(right)[:300]}"]
    return []


# --- the test ---------------------------------------------------------------------------------


def pulumi_bin_dir() -> Path:
    bin_dir = _env_var("WARREN_PULUMI_BIN_DIR")
    for tool in (
        "pulumi",
        "pulumi-language-python",
        "pulumi-language-python-exec",
        "pulumi-resource-kubernetes",
    ):
        assert (bin_dir / tool).is_file(), f"{bin_dir / tool} is missing: run tools/build-pulumi.sh"
    assert COMPONENTS_PYTHON.is_file(), "components/.venv is missing: make components/.venv/.installed"
    return bin_dir


def ansible_path(
    cluster: KubeCluster, workdir: Path, rendered: list[Obj], timings: Timings
) -> dict[str, Obj]:
    """The admission role, twice (the second run must change nothing); the objects it made."""
    first = ansible_play(workdir, cluster)
    timings.add("ansible-playbook (first run)", first.result.seconds)
    assert first.result.rc == 0, first.result.describe()
    assert first.failed == 0, first.result.describe()
    assert first.changed == 1, (
        f"the first run changed nothing on an empty cluster:\n{first.result.describe()}"
    )
    # As Pulumi waits for it: the objects then carry what their controllers write (a
    # Deployment's revision), on both paths alike.
    started = time.monotonic()
    wait_rolled_out(Api(cluster.client), rendered)
    timings.add("the Ansible-made workloads roll out", time.monotonic() - started)
    second = ansible_play(workdir, cluster)
    timings.add("ansible-playbook (second run)", second.result.seconds)
    assert second.result.rc == 0, second.result.describe()
    assert second.changed == 0, f"a second run changed something:\n{second.result.describe()}"
    objects = dump(Api(cluster.client), rendered)
    for name, obj in objects.items():
        assert (WARREN_MANAGER, "Apply") in managers(obj), f"{name} was not server-side applied by warren"
    return objects


def assert_identical(rendered: list[Obj], by_ansible: dict[str, Obj], by_pulumi: dict[str, Obj]) -> None:
    """Identical once the server's own fields are gone. The Pulumi-made objects are new ones
    (not the Ansible-made ones surviving their deletion) and carry all that warren rendered."""
    for obj in rendered:
        name = label(obj)
        assert by_ansible[name]["metadata"]["uid"] != by_pulumi[name]["metadata"]["uid"], name
        lacking = missing_fields(obj, by_pulumi[name])
        assert not lacking, f"{name} as Pulumi made it lacks what warren rendered: {lacking}"
        pulumi_managers = {
            manager for manager, operation in managers(by_pulumi[name]) if operation == "Apply"
        }
        assert any(PULUMI_MANAGER.match(m) for m in pulumi_managers), (
            f"{name} was not server-side applied by pulumi-kubernetes: {managers(by_pulumi[name])}"
        )
        assert WARREN_MANAGER not in pulumi_managers, (
            f"{name} kept warren's fields: {managers(by_pulumi[name])}"
        )
    mismatched = {
        name: differences(comparable(by_ansible[name]), comparable(by_pulumi[name]))
        for name in by_ansible
        if comparable(by_ansible[name]) != comparable(by_pulumi[name])
    }
    assert not mismatched, "the two paths made different objects:\n" + json.dumps(mismatched, indent=2)


def test_pulumi_and_ansible_create_identical_objects(
    cluster: KubeCluster, workdir: Path, rendered: list[Obj]
) -> None:
    pulumi_bin = pulumi_bin_dir()
    api = Api(cluster.client)
    timings = Timings()
    assert rendered, "warren rendered nothing"
    assert len({label(obj) for obj in rendered}) == len(rendered), "render() repeats an object"

    # 1. The Ansible path.
    by_ansible = ansible_path(cluster, workdir, rendered, timings)

    # 2. Delete them all, last first (a binding before its policy, namespaces last).
    started = time.monotonic()
    for obj in reversed(rendered):
        api.delete(obj)
    left = wait_all_gone(api, rendered)
    timings.add("delete the Ansible-made objects", time.monotonic() - started)
    assert not left, (
        f"still there {GONE_TIMEOUT:.0f}s after deletion: {left}; {conditions(api, rendered, left)}"
    )

    # 3. The Pulumi path: the local stack, with the throw-away cluster's kubeconfig.
    pulumi = PulumiProject(workdir, pulumi_bin, cluster)
    checked(pulumi("version"))
    checked(pulumi("stack", "init", STACK))
    checked(pulumi("config", "set", "--stack", STACK, "warren:kubeconfig", str(cluster.admin_kubeconfig)))
    checked(pulumi("config", "set", "--stack", STACK, "warren:configFile", str(CONFIG)))
    checked(pulumi("config", "set", "--stack", STACK, "warren:localNode", "false"))
    # pulumi-kubernetes waits for every workload to roll out (and each Service's endpoints).
    timings.add("pulumi up", checked(pulumi("up", "--stack", STACK, "--yes", "--skip-preview")).seconds)
    outputs = json.loads(checked(pulumi("stack", "output", "--stack", STACK, "--json")).output)
    assert outputs.get("objects") == [label(obj) for obj in rendered], outputs
    assert all(rolled_out(api.get(obj) or {}) for obj in rendered), "pulumi up returned before the rollout"
    by_pulumi = dump(api, rendered)

    # 4. The comparison.
    assert_identical(rendered, by_ansible, by_pulumi)

    # 5. Converged, destroyed, removed.
    preview = checked(pulumi("preview", "--stack", STACK, "--expect-no-changes"))
    timings.add("pulumi preview --expect-no-changes", preview.seconds)
    timings.add(
        "pulumi destroy", checked(pulumi("destroy", "--stack", STACK, "--yes", "--skip-preview")).seconds
    )
    left = wait_all_gone(api, rendered, timeout=0)
    assert not left, f"pulumi destroy left these behind: {left}"
    checked(pulumi("stack", "rm", STACK, "--yes"))
    listed = checked(pulumi("stack", "ls", "--json"))
    assert json.loads(listed.output) == [], listed.describe()

    print(f"{len(rendered)} objects, identical on both paths; seconds per step:\n{timings.report()}")
