"""LibreYOLO 1.6's ``predict()`` is the oracle of zoo's: the same checkpoint file, the same image, the same results.

For the smallest size of every family in the registry (the first size it lists, as
tests/test_libreyolo_oracle.py picks): LibreYOLO builds the model at random initialisation, it is
perturbed so that its predictions mean something (tests/prediction_oracle.py: ``PERTURBATIONS``) and
saved by LibreYOLO; LibreYOLO and ``zoo_core.LibreYOLO`` then predict on two photo-like, non-square PNGs
(481×640 and 640×478) with the same ``imgsz``, ``conf``, ``iou`` and ``max_det``, and must agree: the
whole pipeline (reading, resizing, letterboxing, normalising, the network, thresholds, NMS, top-k,
mapping back to the original pixels), not only the network (which tests/test_libreyolo_oracle.py
compares). ``PredictionComparison.passes`` holds the criteria; the failure message prints every figure.
``benchmarks/libreyolo_oracle.py --predictions`` runs every size and prints a table.
"""

from __future__ import annotations

import pytest

from zoo_core.registry import load_registry

from . import family_checks as checks
from .oracle_cases import WITHOUT_LIBREYOLO_COUNTERPART
from .prediction_oracle import PERTURBATIONS, PREDICT_SETTINGS, compare_predictions

libreyolo = pytest.importorskip("libreyolo", reason="LibreYOLO 1.6 is in the test extra: pip install -e '.[test]'")

SMALLEST = [(family, next(iter(declaration.sizes))) for family, declaration in load_registry().items()
            if family not in WITHOUT_LIBREYOLO_COUNTERPART]

# one torch thread (a shared 2-core machine; the comparison is sized for one thread: a few seconds a family)
_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)


def test_every_family_has_predict_settings_and_a_perturbation():
    missing = [family for family, _ in SMALLEST if family not in PREDICT_SETTINGS or family not in PERTURBATIONS]
    assert not missing, f"families without predict settings and a perturbation in tests/prediction_oracle.py: {missing}"


@pytest.mark.parametrize(("family", "size"), SMALLEST, ids=[f"{family}-{size}" for family, size in SMALLEST])
def test_the_smallest_size_predicts_as_libreyolo(family, size, tmp_path):
    comparison = compare_predictions(family, size, tmp_path)
    print(comparison.describe())
    assert comparison.passes, comparison.describe()
