"""The documentation's code, copied into the pages from the files the tests run.

A page shows its code itself, so that it reads the same on GitHub as on the site. Each
```python block copied from a tested file sits under a marker that names the file and
its section (the lines between ``--8<-- [start:NAME]`` and ``--8<-- [end:NAME]``)::

    <!-- tested: tests/docs_examples/tutorial_outbox.py:handler -->
    ```python
    ...the section's lines, dedented...
    ```

``tests/docs/test_docs_examples.py`` fails while a block differs from its section, and
``python tests/docs/sync.py`` rewrites every such block from its file (run it after
changing an example). A marker ending in ``(lines)`` names the files a block's lines
come from, for a block that writes around them (an ``INSTALLED_APPS`` list with
``...``): the test checks each of its lines, and this script leaves the block alone.
"""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TESTED = re.compile(r"^[ \t]*<!-- tested: (?P<refs>[^>]+?)(?P<lines> \(lines\))? -->$")
SECTION = re.compile(r"^[ \t]*#?[ \t]*--8<--[ \t]+\[(?P<edge>start|end):(?P<section>[\w-]+)\]")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")


def refs_of(text: str) -> list[tuple[str, str | None]]:
    """``path[:section], ...`` as (path, section) pairs."""
    pairs = []
    for ref in text.split(","):
        path, _, section = ref.strip().partition(":")
        pairs.append((path, section or None))
    return pairs


def section_text(path: str, section: str | None) -> list[str]:
    """The lines of *section* of *path* (the whole file without one), dedented, with the
    section markers left out."""
    lines = (ROOT / path).read_text().splitlines()
    if section is not None:
        edges = [(i, m) for i, line in enumerate(lines) if (m := SECTION.match(line))]
        starts = [i for i, m in edges if m["edge"] == "start" and m["section"] == section]
        ends = [i for i, m in edges if m["edge"] == "end" and m["section"] == section]
        if not (starts and ends):
            raise LookupError(f"{path} has no section {section!r}")
        lines = lines[starts[0] + 1 : ends[0]]
    kept = [line for line in lines if not SECTION.match(line)]
    return textwrap.dedent("\n".join(kept)).splitlines()


def copied_text(refs: list[tuple[str, str | None]]) -> list[str]:
    """What a block copied from *refs* holds: their sections, one after the other."""
    lines: list[str] = []
    for index, (path, section) in enumerate(refs):
        if index:
            lines.append("")
        lines.extend(section_text(path, section))
    while lines and not lines[-1].strip():
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    return lines


def synced(page: str) -> str:
    """*page* (its text) with every block under a ``tested:`` marker copied afresh."""
    lines = page.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        out.append(lines[i])
        marker = TESTED.match(lines[i])
        fence = FENCE.match(lines[i + 1]) if marker and i + 1 < len(lines) else None
        if marker is None or fence is None or marker["lines"]:
            i += 1
            continue
        end = i + 2
        while end < len(lines) and not lines[end].strip().startswith(fence["fence"]):
            end += 1
        indent = fence["indent"]
        out.append(lines[i + 1])
        out.extend(indent + line if line else "" for line in copied_text(refs_of(marker["refs"])))
        out.append(lines[end])
        i = end + 1
    return "\n".join(out) + ("\n" if page.endswith("\n") else "")


def main() -> int:
    changed = []
    for page in PAGES:
        text = page.read_text()
        new = synced(text)
        if new != text:
            page.write_text(new)
            changed.append(str(page.relative_to(ROOT)))
    print("\n".join(f"copied afresh: {name}" for name in changed) or "every copy is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
