"""Boot, snapshot and branch with real QEMU: the mechanics the daemon is built on."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
from conftest import Forked
from warren_forkd import snapshot
from warren_forkd.errors import GenerationMismatchError

pytestmark = pytest.mark.integration


def test_eight_children_are_independent(forked: Forked) -> None:
    loop = forked.loop
    children = loop.run_until_complete(snapshot.branch(forked.snap, forked.root / "eight", 8))
    try:

        def run(i: int, command: str) -> str:
            result = loop.run_until_complete(children[i].agent.run(command))
            assert result.rc == 0, result.output
            return result.output.decode()

        # Every child runs a command, under the identity it was given after the restore.
        assert [run(i, "hostname").strip() for i in range(8)] == [f"child-{i}" for i in range(8)]
        assert len({run(i, "cat /etc/machine-id") for i in range(8)}) == 8
        # Each child's VM generation id is the one its QEMU vmgenid device was given.
        generations = [run(i, "cat /run/warren/vm-generation-id").strip() for i in range(8)]
        assert generations == [c.vm.cfg.vmgenid for c in children]
        assert len(set(generations)) == 8

        # Restored from the same RAM, the CRNGs would match without the reseed.
        randoms = [run(i, "head -c 32 /dev/urandom | od -An -tx1") for i in range(8)]
        assert len(set(randoms)) == 8

        # Disks: each child's writes land in its own overlay over the shared base.
        mount = "mount -t ext4 /dev/vda /mnt"
        run(0, f"{mount} && echo mine >/mnt/only-in-0 && sync")
        run(1, mount)
        assert run(1, "cat /mnt/hello.txt") == "from the template\n"
        assert run(1, "ls /mnt") == run(0, "ls /mnt").replace("only-in-0\n", "")
        assert "only-in-0" not in run(1, "ls /mnt")
        assert run(0, "cat /mnt/only-in-0") == "mine\n"

        # Memory: children map the parent's RAM file privately, so its pages are shared.
        child_pss = [c.vm.pss_kib() for c in children]
        assert max(child_pss) <= 0.3 * forked.parent_pss_kib, (child_pss, forked.parent_pss_kib)
    finally:
        loop.run_until_complete(snapshot.stop_all(children))


def test_restore_over_another_disk_generation_is_refused(forked: Forked) -> None:
    other = forked.root / "other-base.ext4"
    shutil.copy(forked.snap.template.disk, other)
    with other.open("r+b") as f:  # one changed byte is another generation
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 0xFF]))
    moved = dataclasses.replace(forked.snap.template, disk=other)
    snap = dataclasses.replace(forked.snap, template=moved)
    with pytest.raises(GenerationMismatchError, match="refusing to restore") as refused:
        forked.loop.run_until_complete(snapshot.restore(snap, forked.root / "refused", "refused"))
    assert refused.value.recorded == forked.snap.disk_generation
    assert not (forked.root / "refused").exists()  # refused before anything started
