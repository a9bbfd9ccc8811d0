"""The form of a workspace id, shared by the daemon and the CSI plugin (which checks it
before asking the daemon for anything)."""

from __future__ import annotations

import re

# Ids name object keys, node directories and metric labels: no '/', '.', or upper case.
# '_' is allowed: the control plane's workspace ids are `ws_<base32>`.
WORKSPACE_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
WORKSPACE_ID_RULE = "1-63 lowercase letters, digits, '-' and '_', starting with a letter or digit"


def valid_workspace_id(text: str) -> bool:
    return WORKSPACE_ID.match(text) is not None
