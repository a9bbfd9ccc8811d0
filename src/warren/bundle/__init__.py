"""The air-gapped bundle: one archive with every artifact an install without a network needs.

Layout inside the archive (and of a directory it is extracted to):

    manifest.json            every other file's path, size and sha256; the pins; its own checksum
    SHA256SUMS               the same checksums for `sha256sum -c` on a host with nothing installed
    wheels/                  Python wheels, and requirements-<environment>.txt (pinned, hashed)
    debs/                    Debian packages and their closure, a flat apt repository
    bin/cluster/             etcd, Kubernetes, containerd, gVisor, CoreDNS, crictl, kwok (+ SHA256SUMS, PINS)
    bin/pulumi/              the Pulumi CLI and plugins, when they could be built
    images/                  OCI image archives (pause, busybox, CoreDNS)

This package's `manifest`, `archive`, `verify` and `extract` modules use the standard library
only, so `python3 -m warren.bundle verify FILE` runs on a host where nothing is installed yet,
with the warren wheel (taken out of the archive) as its only path entry.
"""

from __future__ import annotations

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SUMS = "SHA256SUMS"


class BundleError(RuntimeError):
    """A bundle cannot be built, read or extracted; the message says why and what to do."""
