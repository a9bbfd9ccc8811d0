import json
import tarfile
from pathlib import Path

from warren.images import build_archive
from warren.images.rootfs import ImageSpec


def make_rootfs(root: Path) -> ImageSpec:
    (root / "bin").mkdir(parents=True)
    (root / "bin/tool").write_text("#!/bin/sh\necho hi\n")
    (root / "bin/tool").chmod(0o755)
    (root / "etc").mkdir()
    (root / "etc/motd").write_text("hello\n")
    (root / "bin/link").symlink_to("tool")
    return ImageSpec(name="warren.dev/test:1", rootfs=root, cmd=("/bin/tool",))


def test_archive_is_an_oci_layout_naming_the_image(tmp_path: Path) -> None:
    built = build_archive(make_rootfs(tmp_path / "root"), tmp_path / "out" / "test.tar")
    with tarfile.open(built.archive) as tar:
        names = set(tar.getnames())
        assert {"oci-layout", "index.json"} <= names
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        entry = index["manifests"][0]
        assert entry["annotations"]["io.containerd.image.name"] == "warren.dev/test:1"
        assert entry["digest"] == built.manifest_digest
        manifest = json.load(tar.extractfile(f"blobs/sha256/{entry['digest'].split(':')[1]}"))  # type: ignore[arg-type]
        config_digest = manifest["config"]["digest"].split(":")[1]
        config = json.load(tar.extractfile(f"blobs/sha256/{config_digest}"))  # type: ignore[arg-type]
        assert config["config"]["Cmd"] == ["/bin/tool"]
        assert len(manifest["layers"]) == 1


def test_same_inputs_same_digests(tmp_path: Path) -> None:
    first = build_archive(make_rootfs(tmp_path / "a"), tmp_path / "a.tar")
    second = build_archive(make_rootfs(tmp_path / "b"), tmp_path / "b.tar")
    assert first.manifest_digest == second.manifest_digest
    assert first.archive_sha256 == second.archive_sha256


def test_content_change_changes_digest(tmp_path: Path) -> None:
    first = build_archive(make_rootfs(tmp_path / "a"), tmp_path / "a.tar")
    spec = make_rootfs(tmp_path / "b")
    (spec.rootfs / "etc/motd").write_text("changed\n")
    assert build_archive(spec, tmp_path / "b.tar").manifest_digest != first.manifest_digest


def test_layer_keeps_modes_and_links_and_drops_owners(tmp_path: Path) -> None:
    from warren.images import layer_tar

    spec = make_rootfs(tmp_path / "root")
    import io

    with tarfile.open(fileobj=io.BytesIO(layer_tar(spec.rootfs))) as tar:
        tool = tar.getmember("bin/tool")
        assert tool.mode & 0o111 and tool.uid == 0 and tool.mtime == 0
        assert tar.getmember("bin/link").issym()
        assert tar.getnames().index("bin") < tar.getnames().index("bin/tool")
