"""Templates: names an operator gives to what a sandbox starts from (an image and a size), so
a client asks for `base` rather than an image reference. The E2B surface's `templateID` names
one; `serve --template NAME=IMAGE` configures them."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


@dataclass(frozen=True)
class Template:
    image: str
    cpu_millis: int = 1000
    memory_mib: int = 1024


def parse(text: str) -> tuple[str, Template]:
    """`NAME=IMAGE`, as `serve --template` takes it."""
    name, sep, image = text.partition("=")
    image = image.strip()
    if not sep or not _NAME.fullmatch(name) or not image or any(c.isspace() for c in image):
        raise ValueError(
            f"--template {text!r}: give NAME=IMAGE, the name in lower-case letters, digits, '.', '_' "
            "and '-' (at most 63), the image an OCI reference"
        )
    return name, Template(image=image)
