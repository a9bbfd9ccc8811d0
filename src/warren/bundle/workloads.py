"""Warren's services installed from an extracted bundle: every workload pinned by the digest
the bundle's manifest records for its image (`warren render|apply --bundle DIR`).

The same archives are imported into each node's containerd (`warren image import --bundle`)
or pushed to the operator's registry (`warren image push`, digests preserved), so a pinned
reference always names an image the node holds or the registry serves, and a rebuild under
the same tag rolls the workloads. Digests the configuration sets itself must agree with the
bundle's: a pin of an image the bundle does not carry would only fail later, on a node.
"""

from __future__ import annotations

from pathlib import Path

from warren.bundle import BundleError
from warren.bundle.images import workload_images
from warren.config import ServicesConfig, WarrenConfig


def for_bundle(config: WarrenConfig, bundle: Path) -> WarrenConfig:
    """`config` with services.image_digests filled in from the extracted `bundle`."""
    services = config.services
    if not services.enabled:
        return config
    images = workload_images(bundle, services.image_tag, services.stores)
    carried = {image.service: image.digest for image in images}
    conflicting = {
        service: digest
        for service, digest in services.image_digests.items()
        if service in carried and carried[service] != digest
    }
    if conflicting:
        raise BundleError(
            "services.image_digests pins "
            + ", ".join(f"{service} at {digest}" for service, digest in sorted(conflicting.items()))
            + f", but the bundle at {bundle} carries "
            + ", ".join(f"{service} at {carried[service]}" for service in sorted(conflicting))
            + ": remove image_digests from the configuration (the bundle's are used), or install "
            "from the bundle that carries those images"
        )
    merged = services.model_dump() | {"image_digests": carried | services.image_digests}
    return config.model_copy(update={"services": ServicesConfig.model_validate(merged)})
