"""The collection's modules (plugins/modules, warren.platform.*): the command line each builds
for a run and for check mode, the JSON it reads back, its diff, and each run end to end as
Ansible runs a module (its arguments in a file), against a stand-in warren command that
records what it was given. Where Ansible finds the collection: from the checkout (ansible.cfg's
collections_path) and from the wheel (pyproject.toml's force-include). The roles on a real
machine: the ansible, hosts and cluster tiers."""

from __future__ import annotations

import importlib
import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COLLECTIONS = ROOT / "collections"
PLATFORM = COLLECTIONS / "ansible_collections" / "warren" / "platform"
MODULES = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py"))

PASSWORD = "modules-test-password-never-shown"  # noqa: S105  # a test value


def _module(name: str) -> ModuleType:
    if str(COLLECTIONS) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS))
    return importlib.import_module(f"ansible_collections.warren.platform.plugins.modules.{name}")


def _cli() -> ModuleType:
    if str(COLLECTIONS) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS))
    return importlib.import_module("ansible_collections.warren.platform.plugins.module_utils.warren_cli")


def _params(name: str, **given: Any) -> dict[str, Any]:
    """The module's parameters as AnsibleModule hands them over: defaults filled in."""
    spec: dict[str, Any] = _module(name).ARGUMENT_SPEC
    return {key: given.get(key, option.get("default")) for key, option in spec.items()}


# -- the output the CLI prints -------------------------------------------------------------


def test_the_last_line_of_standard_output_is_the_document() -> None:
    cli = _cli()
    assert cli.last_json('built x\n{"changed": true}\n\n') == {"changed": True}


@pytest.mark.parametrize("stdout", ["", "\n \n", "applied 3 objects\n", "[1, 2]\n"])
def test_no_json_object_on_the_last_line_is_an_error(stdout: str) -> None:
    cli = _cli()
    with pytest.raises(cli.OutputError):
        cli.last_json(stdout)


# -- each module's command line and outcome ------------------------------------------------


def test_apply_applies_or_dry_runs() -> None:
    apply = _module("apply")
    params = _params("apply", warren="/w", kubeconfig="/k", config="/c.yaml", local_node=True, bundle="/b")
    run = [
        "/w",
        "apply",
        "--json",
        "--kubeconfig",
        "/k",
        "--config",
        "/c.yaml",
        "--local-node",
        "--bundle",
        "/b",
    ]
    assert apply.command(params, check_mode=False) == run
    assert apply.command(params, check_mode=True) == [*run, "--dry-run"]
    assert apply.command(_params("apply", kubeconfig="/k"), check_mode=False) == [
        "warren",
        "apply",
        "--json",
        "--kubeconfig",
        "/k",
    ]


def test_apply_shows_the_objects_that_change() -> None:
    apply = _module("apply")
    document = {"changed": True, "objects": 7, "changed_objects": ["Namespace/a", "Role/b -n a"]}
    assert apply.outcome(document, diff=True) == {
        "changed": True,
        "objects": 7,
        "changed_objects": ["Namespace/a", "Role/b -n a"],
        "diff": {"prepared": "~ Namespace/a\n~ Role/b -n a\n"},
    }
    unchanged = apply.outcome({"changed": False, "objects": 7, "changed_objects": []}, diff=True)
    assert unchanged == {"changed": False, "objects": 7, "changed_objects": []}


def test_image_import_from_a_bundle_or_a_build() -> None:
    image_import = _module("image_import")
    bundle = _params("image_import", bundle="/b", containerd="/s.sock", bin_dir="/bin", config="/c")
    run = ["warren", "image", "import", "--json", "--bundle", "/b", "--containerd", "/s.sock"]
    run += ["--bin-dir", "/bin", "--config", "/c"]
    assert image_import.command(bundle, check_mode=False) == run
    assert image_import.command(bundle, check_mode=True) == [*run, "--dry-run"]
    build = _params(
        "image_import", build=["agent", "base"], repo="/r", out_dir="/o", containerd="/s", bin_dir="/bin"
    )
    assert image_import.command(build, check_mode=False) == [
        "warren",
        "image",
        "build",
        "agent",
        "base",
        "--out",
        "/o",
        "--import",
        "/s",
        "--bin-dir",
        "/bin",
        "--registry",
        "warren.dev",
        "--json",
    ]
    joined = {**build, "also_containerd": ["/b.sock"]}
    assert image_import.command(joined, check_mode=False)[7:11] == ["--import", "/s", "--import", "/b.sock"]
    done = image_import.outcome(
        {"changed": True, "imported": ["warren.dev/agent:0.1.0"], "digests": {"a": "sha256:1"}}, diff=True
    )
    assert done["diff"] == {"prepared": "+ warren.dev/agent:0.1.0\n"}
    assert done["digests"] == {"a": "sha256:1"}


def test_image_push_dry_runs_in_check_mode() -> None:
    image_push = _module("image_push")
    params = _params("image_push", bundle="/b", tls_verify=False, authfile="/auth.json")
    run = [
        "warren",
        "image",
        "push",
        "--json",
        "--bundle",
        "/b",
        "--no-tls-verify",
        "--authfile",
        "/auth.json",
    ]
    assert image_push.command(params, check_mode=False) == run
    assert image_push.command(params, check_mode=True) == [*run, "--dry-run"]
    done = image_push.outcome({"changed": False, "pushed": [], "digests": {"r/x:1": "sha256:2"}}, diff=True)
    assert done == {"changed": False, "pushed": [], "digests": {"r/x:1": "sha256:2"}}


def test_service_plans_in_check_mode() -> None:
    service = _module("service")
    params = _params(
        "service", unit_file="/u/x.service", state_dir="/s", health_url="http://h/", restart=True, timeout=9
    )
    run = ["warren", "service", "up", "/u/x.service", "--state-dir", "/s", "--timeout", "9"]
    run += ["--health-url", "http://h/"]
    assert service.command(params, check_mode=False) == [*run, "--restart"]
    assert service.command(params, check_mode=True) == [*run, "--check", "--restart"]
    started = service.outcome({"name": "x", "action": "started", "changed": True, "pid": None}, diff=True)
    assert started["diff"]["before"] == "stopped\n" and started["diff"]["after"] == "running (started)\n"
    left = service.outcome({"name": "x", "action": "unchanged", "changed": False, "pid": 42}, diff=True)
    assert left == {"changed": False, "name": "x", "action": "unchanged", "pid": 42}


def test_store_secrets_hands_the_values_over_on_stdin_only() -> None:
    store_secrets = _module("store_secrets")
    url = f"postgresql+psycopg://warren:{PASSWORD}@10.0.10.5/warren"
    params = _params("store_secrets", kubeconfig="/k", database_url=url, object_store_credentials="A=1\n")
    argv = store_secrets.command(params, check_mode=True)
    assert argv == ["warren", "platform", "store-secrets", "--json", "--kubeconfig", "/k", "--dry-run"]
    assert json.loads(store_secrets.stdin(params)) == {
        "database_url": url,
        "object_store_credentials": "A=1\n",
    }
    no_store = _params("store_secrets", kubeconfig="/k", database_url=url)
    assert json.loads(store_secrets.stdin(no_store)) == {"database_url": url}
    done = store_secrets.outcome(
        {"changed": True, "secrets": {"warren-object-store": "unchanged", "warren-database": "updated"}},
        diff=True,
    )
    assert done["diff"] == {"prepared": "Secret warren-database: updated\n"}


def test_platform_ready_records_only_outside_check_mode() -> None:
    ready = _module("platform_ready")
    params = _params("platform_ready", kubeconfig="/k", record_dir="/r", timeout=60)
    run = ["warren", "platform", "ready", "--json", "--kubeconfig", "/k", "--timeout", "60"]
    assert ready.command(params, check_mode=True) == run
    assert ready.command(params, check_mode=False) == [*run, "--record", "/r"]
    done = ready.outcome({"changed": False, "url": "http://h:8080", "key_file": None})
    assert done == {"changed": False, "url": "http://h:8080", "key_file": None}


def test_service_stops_by_the_units_name() -> None:
    service = _module("service")
    params = _params("service", unit_file="/u/warren-x.service", state_dir="/s", state="stopped")
    run = ["warren", "service", "down", "warren-x", "--state-dir", "/s", "--unit-file", "/u/warren-x.service"]
    assert service.command(params, check_mode=False) == run
    assert service.command(params, check_mode=True) == [*run, "--check"]
    stopped = service.outcome({"name": "warren-x", "changed": True}, diff=True)
    assert stopped == {
        "changed": True,
        "name": "warren-x",
        "action": "stopped",
        "pid": None,
        "diff": {"before": "running\n", "after": "stopped\n"},
    }
    assert service.outcome({"name": "warren-x", "changed": False}, diff=True)["action"] == "unchanged"


def test_control_plane_kubeconfig_never_shows_the_token() -> None:
    kubeconfig = _module("control_plane_kubeconfig")
    params = _params("control_plane_kubeconfig", admin_kubeconfig="/admin", output="/o/c.kubeconfig")
    run = [
        "warren",
        "control-plane",
        "kubeconfig",
        "--admin-kubeconfig",
        "/admin",
        "--output",
        "/o/c.kubeconfig",
    ]
    assert kubeconfig.command(params, check_mode=False) == run
    assert kubeconfig.command(params, check_mode=True) == [*run, "--check"]
    done = kubeconfig.outcome({"changed": True, "path": "/o/c.kubeconfig"}, diff=True)
    assert done["changed"] is True and "token" in done["diff"]["after"]
    assert kubeconfig.outcome({"changed": False, "path": "/o/c.kubeconfig"}, diff=True) == {
        "changed": False,
        "path": "/o/c.kubeconfig",
    }


def test_control_plane_bootstrap_says_what_it_migrated_and_made() -> None:
    bootstrap = _module("control_plane_bootstrap")
    params = _params("control_plane_bootstrap", warren_control="/e/bin/warren-control", key_file="/k")
    run = ["/e/bin/warren-control", "admin", "bootstrap", "--key-file", "/k", "--org", "default"]
    run += ["--user", "admin"]
    assert bootstrap.command(params, check_mode=False) == run
    assert bootstrap.command(params, check_mode=True) == [*run, "--check"]
    first = bootstrap.outcome({"migrated": True, "created": True, "org": "default"}, diff=True)
    assert first["changed"] is True and first["diff"]["after"].count("\n") == 2
    again = bootstrap.outcome({"migrated": False, "created": False, "org": "default"}, diff=True)
    assert again == {"changed": False, "migrated": False, "created": False}


# -- each module run as Ansible runs it ----------------------------------------------------


def _stand_in(tmp_path: Path, stdout: str, rc: int = 0) -> Path:
    """A warren command that records its arguments and stdin, then prints `stdout`."""
    script = tmp_path / "warren"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"open({str(tmp_path / 'called.json')!r}, 'w').write(json.dumps("
        "{'argv': sys.argv[1:], 'stdin': sys.stdin.read()}))\n"
        "print('progress, on stderr', file=sys.stderr)\n"
        f"print({stdout!r})\n"
        f"sys.exit({rc})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def _run(tmp_path: Path, name: str, args: dict[str, Any], check: bool = False) -> dict[str, Any]:
    arguments = tmp_path / "args.json"
    internal = {"_ansible_check_mode": check, "_ansible_diff": True}
    arguments.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, **internal}}))
    done = subprocess.run(
        [sys.executable, str(ROOT / "plugins" / "modules" / f"{name}.py"), str(arguments)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(COLLECTIONS)},
        check=False,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _called(tmp_path: Path) -> dict[str, Any]:
    called: dict[str, Any] = json.loads((tmp_path / "called.json").read_text())
    return called


def test_apply_in_check_mode_asks_for_a_dry_run_and_reports_the_diff(tmp_path: Path) -> None:
    warren = _stand_in(
        tmp_path, json.dumps({"changed": True, "objects": 2, "changed_objects": ["Namespace/a"]})
    )
    result = _run(tmp_path, "apply", {"warren": str(warren), "kubeconfig": "/k"}, check=True)
    assert _called(tmp_path)["argv"] == ["apply", "--json", "--kubeconfig", "/k", "--dry-run"]
    assert result["changed"] is True and result["changed_objects"] == ["Namespace/a"]
    assert result["diff"] == {"prepared": "~ Namespace/a\n"}


def test_a_failing_command_fails_the_task_with_its_error(tmp_path: Path) -> None:
    warren = _stand_in(tmp_path, "", rc=1)
    result = _run(tmp_path, "service", {"warren": str(warren), "unit_file": "/u.service", "state_dir": "/s"})
    assert result["failed"] is True and result["rc"] == 1
    assert result["msg"] == "progress, on stderr"


def test_output_that_is_not_json_fails_the_task(tmp_path: Path) -> None:
    warren = _stand_in(tmp_path, "done")
    result = _run(tmp_path, "apply", {"warren": str(warren), "kubeconfig": "/k"})
    assert result["failed"] is True and "not JSON" in result["msg"]


def test_building_images_is_skipped_in_check_mode(tmp_path: Path) -> None:
    warren = _stand_in(tmp_path, json.dumps({"changed": True, "imported": [], "digests": {}}))
    args = {"warren": str(warren), "build": ["agent"], "repo": str(tmp_path), "out_dir": "/o"}
    result = _run(tmp_path, "image_import", {**args, "containerd": "/s", "bin_dir": "/b"}, check=True)
    assert result["changed"] is False and result["skipped"] is True
    assert not (tmp_path / "called.json").exists()


def test_check_mode_before_the_install_says_it_would_change(tmp_path: Path) -> None:
    # A first run in check mode: the package install was only planned, so the command is absent.
    missing = tmp_path / "env" / "bin" / "warren-control"
    args = {"warren_control": str(missing), "key_file": "/k"}
    result = _run(tmp_path, "control_plane_bootstrap", args, check=True)
    assert result["changed"] is True and "not installed yet" in result["msg"]
    assert _run(tmp_path, "control_plane_bootstrap", args)["failed"] is True


def test_store_secrets_never_returns_a_value(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://warren:{PASSWORD}@10.0.10.5/warren"
    secrets = {"warren-database": "created"}
    warren = _stand_in(tmp_path, json.dumps({"changed": True, "secrets": secrets}))
    result = _run(tmp_path, "store_secrets", {"warren": str(warren), "kubeconfig": "/k", "database_url": url})
    assert json.loads(_called(tmp_path)["stdin"]) == {"database_url": url}
    assert PASSWORD not in json.dumps(_called(tmp_path)["argv"])
    assert result["secrets"] == secrets
    assert PASSWORD not in json.dumps(result)


# -- where Ansible finds the collection ----------------------------------------------------


FRAGMENTS = {
    path.stem: yaml.safe_load(
        re.search(r'DOCUMENTATION = r"""(.*?)"""', path.read_text(), re.DOTALL).group(1)
    )
    for path in (ROOT / "plugins" / "doc_fragments").glob("*.py")
}


def test_every_module_is_documented_and_supports_check_mode() -> None:
    expected = {"apply", "image_import", "image_push", "platform_ready", "service", "store_secrets"}
    expected |= {"control_plane_bootstrap", "control_plane_kubeconfig"}
    assert expected <= set(MODULES)
    for name in MODULES:
        module = _module(name)
        documented = yaml.safe_load(module.DOCUMENTATION)
        assert documented["module"] == name
        options = set(documented["options"])
        for fragment in documented.get("extends_documentation_fragment", []):
            options |= set(FRAGMENTS[fragment.rsplit(".", 1)[-1]]["options"])
        assert options == set(module.ARGUMENT_SPEC), name
        assert yaml.safe_load(module.RETURN) is not None and yaml.safe_load(module.EXAMPLES)
        source = (ROOT / "plugins" / "modules" / f"{name}.py").read_text()
        # run_module (module_utils) makes the module with check mode supported.
        assert "supports_check_mode=True" in source or "run_module(ARGUMENT_SPEC" in source, name


def test_the_roles_use_only_modules_the_collection_has() -> None:
    used = set()
    for tasks in (ROOT / "roles").glob("*/tasks/*.yml"):
        used |= set(re.findall(r"^\s*-?\s*warren\.platform\.(\w+):", tasks.read_text(), re.MULTILINE))
    assert used and used <= set(MODULES), used - set(MODULES)


def test_ansible_finds_the_collection_from_the_checkout_and_the_wheel() -> None:
    # The checkout: ansible.cfg's collections_path, relative to the file, names collections/.
    config = (ROOT / "ansible.cfg").read_text()
    paths = re.search(r"^collections_path = (.+)$", config, re.MULTILINE)
    assert paths and paths.group(1).split(":")[0] == "collections"
    assert (PLATFORM / "plugins").resolve() == (ROOT / "plugins").resolve()
    assert (PLATFORM / "meta" / "runtime.yml").is_file()
    # The wheel: the same layout beside its ansible.cfg.
    included = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]
    force = included["wheel"]["force-include"]
    assert force["ansible.cfg"] == "warren/ansible/ansible.cfg"
    for part in ("plugins", "meta"):
        assert force[part] == f"warren/ansible/collections/ansible_collections/warren/platform/{part}"
    # The collection built by ansible-galaxy: plugins/ from the top, not again through the link.
    ignored = yaml.safe_load((ROOT / "galaxy.yml").read_text())["build_ignore"]
    assert "collections" in ignored and "plugins" not in ignored


def test_the_strategy_is_found_through_the_collections_path_in_checkout_and_wheel() -> None:
    config = (ROOT / "ansible.cfg").read_text()
    found = re.search(r"^strategy_plugins = (.+)$", config, re.MULTILINE)
    assert found and re.search(r"^strategy = mitogen_linear$", config, re.MULTILINE)
    # Relative to ansible.cfg, through collections/ (the wheel keeps plugins/ at that path too).
    assert found.group(1).startswith("collections/ansible_collections/warren/platform/plugins/")
    assert (ROOT / found.group(1) / "mitogen_linear.py").is_file()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to tell a pin from none")
def test_what_a_play_starts_may_run_on_every_cpu(tmp_path: Path) -> None:
    """Mitogen pins its processes to CPUs and a task's children inherit the pin: the node's
    daemons, started by plays, would share one CPU. The strategy switches the pinning off."""
    out = tmp_path / "cpus"
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible"),
            "localhost",
            "-c",
            "local",
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-m",
            "shell",
            "-a",
            f"grep Cpus_allowed_list /proc/self/status > {out}",
        ],
        check=False,
        cwd=ROOT,
        env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    allowed = out.read_text().split()[-1]
    cpus = sorted(os.sched_getaffinity(0))
    assert allowed == (f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])), allowed
