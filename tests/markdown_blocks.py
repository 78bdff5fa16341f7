"""Extract fenced code blocks from the docs, so the test suite runs every example it shows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<code>.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class CodeBlock:
    """One fenced block: its language, its ``title=`` (a file name) if any, and its text."""

    language: str
    title: str | None
    code: str


def code_blocks(path: Path) -> list[CodeBlock]:
    """Every fenced block of a markdown file, in order."""
    blocks = []
    for match in FENCE.finditer(path.read_text(encoding="utf-8")):
        words = match["info"].split()
        language = words[0] if words else ""
        title = next((word.split("=", 1)[1] for word in words[1:] if word.startswith("title=")), None)
        blocks.append(CodeBlock(language, title, match["code"]))
    return blocks
