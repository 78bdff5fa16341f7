"""LibreYOLO 1.6 is the output oracle: its checkpoints load into zoo with its outputs, and back.

For the smallest size of every family in the registry: LibreYOLO builds the model at random
initialisation and saves its own checkpoint; ``zoo_core.LibreYOLO(path)`` loads it through the
family's converter and must give the same eval outputs (<= 1e-4); zoo then writes a LibreYOLO
checkpoint (``save(format="libreyolo")``) that LibreYOLO loads with zoo's outputs.
``benchmarks/libreyolo_oracle.py`` does the same for every size and prints the table.
"""

from __future__ import annotations

import pytest

from zoo_core.registry import load_registry

from .oracle_cases import ORACLE_CASES, TOLERANCE, WITHOUT_LIBREYOLO_COUNTERPART, compare_on_random_weights

libreyolo = pytest.importorskip("libreyolo", reason="LibreYOLO 1.6 is in the test extra: pip install -e '.[test]'")

SMALLEST = [(family, next(iter(declaration.sizes))) for family, declaration in load_registry().items()
            if family not in WITHOUT_LIBREYOLO_COUNTERPART]


def test_every_family_has_an_oracle_case():
    missing = [family for family, _ in SMALLEST if family not in ORACLE_CASES]
    assert not missing, f"families without a LibreYOLO oracle case in tests/oracle_cases.py: {missing}"


@pytest.mark.parametrize(("family", "size"), SMALLEST, ids=[f"{family}-{size}" for family, size in SMALLEST])
def test_the_smallest_size_reproduces_libreyolo_both_ways(family, size, tmp_path):
    outcome = compare_on_random_weights(family, size, tmp_path)
    print(outcome)
    assert outcome["zoo_params"] == outcome["libreyolo_params"]
    assert outcome["loaded_difference"] <= TOLERANCE, outcome
    assert outcome["written_difference"] <= TOLERANCE, outcome
