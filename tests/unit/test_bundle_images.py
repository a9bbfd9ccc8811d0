"""Warren's service images in an extracted bundle: which a configuration's workloads run, the
workloads pinned by the manifest's digests, and every mismatch (tag, missing image, altered
manifest, an archive that is not what the manifest pins, a configuration pinning other
digests) refused with what to do, before anything reaches a node or a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from warren.bundle import MANIFEST, BundleError
from warren.bundle.images import WORKLOAD_IMAGES, service_images, workload_images
from warren.bundle.manifest import Manifest, entries
from warren.bundle.workloads import for_bundle
from warren.cli import main
from warren.config import SERVICE_IMAGES, SYSTEM_NAMESPACE, parse_config
from warren.images import ImageSpec, build_archive
from warren.render import render

REPO = Path(__file__).resolve().parents[2]
TAG = "0.1.0"
DIGESTS = {name: "sha256:" + f"{i + 1:02x}" * 32 for i, name in enumerate(SERVICE_IMAGES)}


def extracted_bundle(root: Path, tag: str = TAG, digests: dict[str, str] | None = None) -> Path:
    """An extracted bundle whose manifest pins the service images (their archives are
    placeholders: nothing here reads them)."""
    sources = {}
    for name in SERVICE_IMAGES:
        path = root / "images" / f"{name}.tar"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(name.encode() * 100)
        sources[f"images/{name}.tar"] = path
    pinned = {f"warren.dev/{name}:{tag}": digest for name, digest in (digests or DIGESTS).items()}
    pinned["warren.dev/pause:1"] = "sha256:" + "ee" * 32
    manifest = Manifest(built="2026-12-01T00:00:00Z", files=entries(sources), pins={"images": pinned})
    (root / MANIFEST).write_bytes(manifest.to_json())
    return root


def container_images(objects: list[dict[str, object]]) -> set[str]:
    """Every image the workloads in warren-system run, or deliver into sandboxes (the images
    their arguments name: the agent's, the templates')."""
    found = set()
    for obj in objects:
        meta = obj["metadata"]
        assert isinstance(meta, dict)
        spec = obj.get("spec")
        if meta.get("namespace") != SYSTEM_NAMESPACE or not isinstance(spec, dict) or "template" not in spec:
            continue
        pod = spec["template"]["spec"]
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            found.add(container["image"])
            for arg in container.get("args", []):
                if arg.startswith("--agent-image="):
                    found.add(arg.split("=", 1)[1])
                elif arg.startswith("--template="):
                    found.add(arg.split("=", 2)[2])
    return found


def test_the_stores_name_exactly_the_images_their_workloads_run() -> None:
    assert set(WORKLOAD_IMAGES["embedded"]) == set(SERVICE_IMAGES)
    for stores, images in WORKLOAD_IMAGES.items():
        extra = {"object_store_endpoint": "http://10.0.20.5:19003"} if stores == "external" else {}
        config = parse_config({"services": {"stores": stores, **extra}})
        used = {image.rsplit("/", 1)[1].split(":")[0] for image in container_images(render(config))}
        assert used == set(images), stores


def test_the_external_stores_workloads_need_only_warren_s_own_images(tmp_path: Path) -> None:
    found = workload_images(extracted_bundle(tmp_path), TAG, "external")
    assert [image.service for image in found] == ["warren-control", "warren-blockd", "agent", "base"]
    control = found[0]
    assert control.name == "warren.dev/warren-control:0.1.0"
    assert control.digest == DIGESTS["warren-control"]
    assert control.archive == tmp_path / "images" / "warren-control.tar"
    assert len(workload_images(tmp_path, TAG, "embedded")) == len(SERVICE_IMAGES)


def test_a_bundle_of_another_version_is_refused_naming_both(tmp_path: Path) -> None:
    with pytest.raises(
        BundleError, match=r"carries warren-control:0\.1\.0, not warren-control:0\.2\.0"
    ) as refused:
        workload_images(extracted_bundle(tmp_path), "0.2.0", "external")
    assert "services.image_tag" in str(refused.value)


def test_a_bundle_without_an_image_is_refused_naming_the_build(tmp_path: Path) -> None:
    extracted_bundle(tmp_path, digests={k: v for k, v in DIGESTS.items() if k != "warren-blockd"})
    with pytest.raises(BundleError, match="carries no image of warren-blockd") as refused:
        service_images(tmp_path, TAG, ["warren-control", "warren-blockd"])
    assert "warren bundle build" in str(refused.value)


def test_an_altered_manifest_is_refused(tmp_path: Path) -> None:
    extracted_bundle(tmp_path)
    document = json.loads((tmp_path / MANIFEST).read_text())
    document["pins"]["images"]["warren.dev/warren-control:0.1.0"] = "sha256:" + "00" * 32
    (tmp_path / MANIFEST).write_text(json.dumps(document))
    with pytest.raises(BundleError, match="altered after the bundle was built"):
        workload_images(tmp_path, TAG, "external")
    with pytest.raises(BundleError, match="extract the bundle there first"):
        workload_images(tmp_path / "nowhere", TAG, "external")


def test_the_workloads_are_pinned_by_the_bundles_digests(tmp_path: Path) -> None:
    config = parse_config(
        {"services": {"stores": "external", "object_store_endpoint": "http://10.0.20.5:19003"}}
    )
    pinned = for_bundle(config, extracted_bundle(tmp_path))
    assert pinned.services.image_digests == {k: DIGESTS[k] for k in WORKLOAD_IMAGES["external"]}
    assert container_images(render(pinned)) == {
        f"warren.dev/{name}:0.1.0@{DIGESTS[name]}" for name in WORKLOAD_IMAGES["external"]
    }
    # The same digests under an operator's registry (a push keeps them).
    registry = config.model_copy(
        update={
            "services": config.services.model_copy(update={"image_registry": "registry.example:5000/warren"})
        }
    )
    assert (
        f"registry.example:5000/warren/warren-control:0.1.0@{DIGESTS['warren-control']}"
        in container_images(render(for_bundle(registry, tmp_path)))
    )


def test_digests_the_configuration_pins_must_be_the_bundles(tmp_path: Path) -> None:
    extracted_bundle(tmp_path)
    same = parse_config({"services": {"image_digests": {"postgres": DIGESTS["postgres"]}}})
    assert for_bundle(same, tmp_path).services.image_digests == DIGESTS
    other = "sha256:" + "ab" * 32
    config = parse_config({"services": {"image_digests": {"warren-control": other}}})
    with pytest.raises(BundleError, match=f"pins warren-control at {other}") as refused:
        for_bundle(config, tmp_path)
    assert DIGESTS["warren-control"] in str(refused.value)
    assert "remove image_digests" in str(refused.value)


def test_without_services_the_bundle_changes_nothing(tmp_path: Path) -> None:
    config = parse_config({"services": {"enabled": False}})
    assert for_bundle(config, tmp_path / "not-even-there") == config


def test_render_and_apply_take_the_bundle_and_refuse_it_with_the_local_node(tmp_path: Path) -> None:
    bundle = extracted_bundle(tmp_path / "bundle")
    out = tmp_path / "out"
    rendered = CliRunner().invoke(main, ["render", "--bundle", str(bundle), "--out", str(out)])
    assert rendered.exit_code == 0, rendered.output
    assert f"@{DIGESTS['warren-blockd']}" in (out / "warren-system.yaml").read_text()
    both = CliRunner().invoke(main, ["apply", "--bundle", str(bundle), "--local-node"])
    assert both.exit_code == 2
    assert "exclude each other" in both.output
    # A bundle that does not suit the configuration stops `apply` before any cluster is asked.
    config = tmp_path / "warren.yaml"
    config.write_text("services:\n  image_tag: 9.9.9\n")
    refused = CliRunner().invoke(
        main,
        ["apply", "--config", str(config), "--bundle", str(bundle), "--kubeconfig", str(tmp_path / "none")],
    )
    assert refused.exit_code == 1
    assert "not warren-control:9.9.9" in refused.output


def test_images_runs_with_the_standard_library_alone(tmp_path: Path) -> None:
    """Preflight runs `python3 -S -m warren.bundle images` before anything is installed."""
    extracted_bundle(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-S", "-m", "warren.bundle", "images", str(tmp_path), "--stores", "external"]
    ok = subprocess.run([*command, "--tag", TAG], env=env, capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["warren-blockd"] == {
        "name": "warren.dev/warren-blockd:0.1.0",
        "digest": DIGESTS["warren-blockd"],
        "archive": str(tmp_path / "images" / "warren-blockd.tar"),
    }
    bad = subprocess.run([*command, "--tag", "0.2.0"], env=env, capture_output=True, text=True, check=False)
    assert bad.returncode == 1
    assert "services.image_tag" in bad.stderr


def test_import_refuses_an_archive_that_is_not_what_the_manifest_pins(tmp_path: Path) -> None:
    """Checked before any containerd is asked: the socket here does not even exist."""
    bundle = extracted_bundle(tmp_path / "bundle")
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (rootfs / "hello").write_text("hello\n")
    built = build_archive(
        ImageSpec(name="warren.dev/warren-control:0.1.0", rootfs=rootfs),
        bundle / "images" / "warren-control.tar",
    )
    result = CliRunner().invoke(
        main,
        [
            "image",
            "import",
            "--bundle",
            str(bundle),
            "--containerd",
            str(tmp_path / "none.sock"),
            "--bin-dir",
            "/",
        ],
    )
    assert result.exit_code == 1
    assert f"holds warren.dev/warren-control:0.1.0 at {built.manifest_digest}" in result.output
    assert "copy the bundle again" in result.output


def test_a_push_from_the_bundle_goes_to_the_configured_registry_only(tmp_path: Path) -> None:
    """Refused before skopeo is asked: the default name is served by no registry, and
    workloads pinned under the configured registry would not find images pushed elsewhere."""
    bundle = extracted_bundle(tmp_path / "bundle")
    default = CliRunner().invoke(main, ["image", "push", "--bundle", str(bundle)])
    assert default.exit_code == 2
    assert "no registry serves" in default.output
    config = tmp_path / "warren.yaml"
    config.write_text("services:\n  image_registry: registry.example:5000/warren\n")
    other = CliRunner().invoke(
        main,
        [
            "image",
            "push",
            "--bundle",
            str(bundle),
            "--config",
            str(config),
            "--registry",
            "elsewhere.example",
        ],
    )
    assert other.exit_code == 2
    assert "not the configuration's services.image_registry" in other.output
