"""Words for a client: the cluster's names for a sandbox taken out of a message.

Kept apart from the controller's modules so that the SDK's shapes (api/shapes.py) can use it
without importing the controller.
"""

from __future__ import annotations

import re

from warren_control.podspec import CONTAINER, POOL_POD_PREFIX

# Names the cluster uses that must never reach a client: pods (sbx-<uid>, and a pool's
# pool-<pool>-<10 hex>), Sandbox objects (sandbox-<random>), uids and container ids.
# "pod <name>" reads "the pod", as for the names scrub is given.
_PODS = r'(?:\bpods?\s+"?)?'
_POD_NAME = re.compile(_PODS + r"\bsbx-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_POOL_POD_NAME = re.compile(_PODS + rf"\b{POOL_POD_PREFIX}[a-z0-9-]{{1,40}}-[0-9a-f]{{10}}\b")
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
    text = _POOL_POD_NAME.sub("the pod", text)
    text = _OBJECT_NAME.sub("the sandbox", text)
    text = re.sub(rf"\bcontainer\s+\"?{re.escape(CONTAINER)}\"?", "the container", text)
    text = _CONTAINER_ID.sub("<id>", text)
    return _UID.sub("<id>", text)
