"""warren.platform.image_import: Warren's images in a node's containerd."""

from __future__ import annotations

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.warren.platform.plugins.module_utils.warren_cli import (
    WARREN_OPTION,
    listing,
    run_json,
    with_config,
)

DOCUMENTATION = r"""
---
module: image_import
short_description: Import Warren's images into a node's containerd
description:
  - Imports OCI image archives into the containerd a node's kubelet uses (namespace
    C(k8s.io)), only those it does not hold with the same digest, each also named by its
    digest so that workloads pinned by digest find it without a registry.
  - With O(bundle), the service images the configuration's workloads run, from an extracted
    air-gapped bundle, checked against the digests its manifest pins
    (C(warren image import --bundle)).
  - With O(build), the images are first built from a checkout (C(warren image build --import));
    an unchanged checkout makes the same digests, so nothing is imported again.
  - Reports changed only when an image was imported.
version_added: "0.1.0"
author: Warren maintainers
extends_documentation_fragment:
  - warren.platform.warren
options:
  containerd:
    description: The node's containerd socket.
    type: path
    required: true
  also_containerd:
    description: Further nodes' containerd sockets the built images are imported into too
      (with O(build); the local cluster's joined nodes).
    type: list
    elements: path
    default: []
  bin_dir:
    description: The directory holding C(ctr).
    type: path
    required: true
  bundle:
    description: An extracted bundle whose service images are imported.
    type: path
  config:
    description: A Warren configuration file (which images and tag the workloads run); empty for the defaults.
    type: str
    default: ""
  build:
    description: Images to build from the checkout O(repo) and import instead of a bundle's.
    type: list
    elements: str
  repo:
    description: The checkout the images are built from (with O(build)).
    type: path
  out_dir:
    description: Where the built image archives are written (with O(build)).
    type: path
  registry:
    description: Name prefix of the built images (with O(build)).
    type: str
    default: warren.dev
notes:
  - Supports check mode and diff (the images that are imported). In check mode a bundle's
    images are compared with the node's and nothing is imported; with O(build) nothing is
    built and the task is skipped, since the digests are only known once built.
"""

EXAMPLES = r"""
- name: Import the bundle's images into the node's containerd
  warren.platform.image_import:
    warren: /opt/warren/platform/bin/warren
    bundle: /opt/warren/bundle
    config: /etc/warren/warren.yaml
    containerd: /run/containerd/containerd.sock
    bin_dir: /opt/warren/bundle/bin/cluster

- name: Build the service images from this checkout and import them
  warren.platform.image_import:
    build: [warren-control, warren-blockd, seaweedfs, postgres]
    repo: /src/warren
    out_dir: /var/lib/warren/cluster/service-images
    containerd: /var/lib/warren/cluster/node/containerd/containerd.sock
    bin_dir: /var/cache/warren/bin
"""

RETURN = r"""
imported:
  description: The images imported (would be imported, in check mode).
  returned: success
  type: list
  elements: str
  sample: ["warren.dev/warren-control:0.1.0"]
digests:
  description: Each image's manifest digest.
  returned: success
  type: dict
  sample: {"warren.dev/warren-control:0.1.0": "sha256:0123..."}
"""

ARGUMENT_SPEC: dict[str, Any] = {
    "warren": WARREN_OPTION,
    "containerd": {"type": "path", "required": True},
    "also_containerd": {"type": "list", "elements": "path", "default": []},
    "bin_dir": {"type": "path", "required": True},
    "bundle": {"type": "path"},
    "config": {"type": "str", "default": ""},
    "build": {"type": "list", "elements": "str"},
    "repo": {"type": "path"},
    "out_dir": {"type": "path"},
    "registry": {"type": "str", "default": "warren.dev"},
}


def command(params: dict[str, Any], check_mode: bool) -> list[str]:
    warren = params["warren"]
    sockets = [params["containerd"], *params["also_containerd"]]
    if params["build"]:
        return [
            warren,
            "image",
            "build",
            *params["build"],
            "--out",
            params["out_dir"],
            *(arg for socket in sockets for arg in ("--import", socket)),
            "--bin-dir",
            params["bin_dir"],
            "--registry",
            params["registry"],
            "--json",
        ]
    argv = [warren, "image", "import", "--json", "--bundle", params["bundle"]]
    argv += ["--containerd", params["containerd"], "--bin-dir", params["bin_dir"]]
    argv = with_config(argv, params["config"])
    return [*argv, "--dry-run"] if check_mode else argv


def outcome(document: dict[str, Any], diff: bool) -> dict[str, Any]:
    imported = [str(name) for name in document.get("imported", [])]
    result: dict[str, Any] = {
        "changed": bool(document["changed"]),
        "imported": imported,
        "digests": dict(document.get("digests", {})),
    }
    if diff and imported:
        result["diff"] = {"prepared": listing("+", imported)}
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        mutually_exclusive=[("bundle", "build")],
        required_one_of=[("bundle", "build")],
        required_by={"build": ("repo", "out_dir")},
        supports_check_mode=True,
    )
    if module.params["build"] and module.check_mode:
        module.exit_json(changed=False, skipped=True, msg="images are only built outside check mode")
    cwd = module.params["repo"] if module.params["build"] else None
    document = run_json(module, command(module.params, module.check_mode), cwd=cwd)
    module.exit_json(**outcome(document, module._diff))


if __name__ == "__main__":
    main()
