"""Words for a client: the cluster's names for a sandbox taken out of a message.

Kept apart from the controller's modules so that the SDK's shapes (api/shapes.py) can use it
without importing the controller or kopf.
"""

from __future__ import annotations

import re

from warren_control.podspec import CONTAINER

# Names the cluster uses that must never reach a client: pods (sbx-<uid>), Sandbox objects
# (sandbox-<random>), uids and container ids.
_POD_NAME = re.compile(r"\bsbx-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_OBJECT_NAME = re.compile(r"\bsandbox-[a-z2-7]{26}\b")
_UID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_CONTAINER_ID = re.compile(r"\b[0-9a-f]{64}\b")


def scrub(text: str, *names: str) -> str:
    """`text` without the cluster's names for a sandbox: its object, pod, namespace,
    container and node names, uids and container ids."""
    for name in sorted((n for n in names if n), key=len, reverse=True):
        text = re.sub(rf"\bpods?\s+\"?{re.escape(name)}\"?", "the pod", text)
        text = text.replace(name, "the sandbox")
    text = _POD_NAME.sub("the pod", text)
    text = _OBJECT_NAME.sub("the sandbox", text)
    text = re.sub(rf"\bcontainer\s+\"?{re.escape(CONTAINER)}\"?", "the container", text)
    text = _CONTAINER_ID.sub("<id>", text)
    return _UID.sub("<id>", text)
