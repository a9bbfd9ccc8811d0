"""The node's configuration files: rendered from templates/, written only when changed."""

from __future__ import annotations

from pathlib import Path

import jinja2

TEMPLATES = Path(__file__).with_name("templates")


def render(template: str, **context: object) -> str:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # noqa: S701  # TOML, YAML and JSON, not HTML
    )
    return env.get_template(template).render(**context)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def write_keeping_block(path: Path, text: str, begin: str, end: str) -> None:
    """Write `text` but keep a block another tool manages (between its marker lines)."""
    current = path.read_text() if path.exists() else ""
    block = ""
    if begin in current and end in current:
        start = current.index(begin)
        stop = current.index(end, start) + len(end)
        block = current[start:stop]
        current = current[:start].rstrip("\n") + "\n" + current[stop:].lstrip("\n")
    if current.rstrip("\n") == text.rstrip("\n"):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text.rstrip("\n") + "\n" + (block + "\n" if block else ""))
