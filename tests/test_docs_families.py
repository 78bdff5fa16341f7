"""docs/families.md is the registry's own table: regenerating it changes nothing."""

from __future__ import annotations

import re
from pathlib import Path

from zoo_core.cli import families_markdown
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.registry import load_registry

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_families_page_is_what_the_registry_generates():
    manager = get_plugin_manager()
    registry_families = sorted(load_registry())
    expected = families_markdown(manager, [family for family in manager.families if family in registry_families])
    page = (DOCS / "families.md").read_text(encoding="utf-8")
    assert page == expected, "docs/families.md is stale: run `zoo list --markdown > docs/families.md`"


def test_no_page_states_a_family_count_the_registry_does_not_have():
    count = len(load_registry())
    for page in [*DOCS.glob("*.md"), DOCS.parent / "README.md"]:
        for stated in re.findall(r"(\d+) (?:built-in )?famil", page.read_text(encoding="utf-8")):
            assert int(stated) == count, f"{page.name} says {stated} families; the registry has {count}"
