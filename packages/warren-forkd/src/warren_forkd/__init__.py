"""Warren's microVM layer: templates, cold boot, snapshots and copy-on-write branches (QEMU)."""
