"""Each test double of ``tests/doubles.py`` fulfils its task's model contract (zoo_core/tasks/base.py).

The task tests rely on these stand-ins, so a broken double would make them test the double, not
the task.
"""

from __future__ import annotations

import pytest
import torch

from .doubles import GridDetector, LookupDetector, TinyClassifier, TinyRestorer, TinySegmenter, image_key


def test_tiny_classifier_returns_one_logit_per_class():
    assert TinyClassifier(4)(torch.rand(2, 3, 32, 32)).shape == (2, 4)


def test_tiny_segmenter_returns_logits_at_input_resolution():
    assert TinySegmenter(5)(torch.rand(2, 3, 32, 48)).shape == (2, 5, 32, 48)


def test_tiny_restorer_keeps_the_image_size():
    assert TinyRestorer()(torch.rand(1, 3, 20, 28)).shape == (1, 3, 20, 28)


def test_grid_detector_fulfils_the_postprocess_contract():
    torch.manual_seed(0)
    model = GridDetector(3).eval()
    (detections,) = model.postprocess(model(torch.rand(1, 3, 64, 64)), conf=0.0, iou=0.7, max_det=10)
    assert detections["boxes"].shape[1:] == (4,)
    assert len(detections["boxes"]) == len(detections["scores"]) == len(detections["labels"]) <= 10
    assert detections["labels"].dtype == torch.long


def test_lookup_detector_returns_what_its_table_holds_for_an_image():
    image = torch.rand(3, 16, 16)
    table = {image_key(image): {"boxes": torch.tensor([[1.0, 2.0, 5.0, 6.0]]), "scores": torch.tensor([0.8]), "labels": torch.tensor([2])}}
    found, missing = LookupDetector(table).postprocess(torch.stack([image, image * 0.5]), conf=0.1, iou=0.7, max_det=5)
    assert found["labels"].tolist() == [2] and found["boxes"].tolist() == [[1.0, 2.0, 5.0, 6.0]]
    assert len(missing["boxes"]) == 0


def test_lookup_instance_segmenter_fulfils_the_segment_contract():
    from zoo_core.ops.boxes import ImagePlacement

    from .doubles import LookupInstanceSegmenter

    image = torch.rand(3, 32, 32)
    mask = torch.zeros(1, 32, 32, dtype=torch.bool)
    mask[0, 4:12, 8:20] = True
    table = {image_key(image): {"boxes": torch.tensor([[8.0, 4.0, 20.0, 12.0]]), "scores": torch.tensor([0.8]),
                                "labels": torch.tensor([1]), "masks": mask}}
    model = LookupInstanceSegmenter(table, num_classes=3).eval()
    outputs = model(torch.stack([image, image * 0.5]))
    assert list(outputs) == ["boxes", "scores", "mask_coefficients", "mask_features"]
    assert outputs["scores"].shape[-1] == 3 and outputs["mask_coefficients"].shape[:2] == outputs["boxes"].shape[:2]
    found, missing = model.postprocess(outputs, conf=0.1, iou=0.7, max_det=5)
    assert found["labels"].tolist() == [1] and torch.equal(found["masks"], mask) and len(missing["masks"]) == 0
    # placements: a 64×64 original letterboxed at ratio 0.5 gets its mask back at its own size
    (mapped, _) = model.postprocess(outputs, conf=0.1, iou=0.7, max_det=5,
                                    placements=[ImagePlacement(((0.5, 0.5), (0.0, 0.0)), (64, 64))] * 2)
    assert mapped["masks"].shape == (1, 64, 64) and mapped["boxes"].tolist() == [[16.0, 8.0, 40.0, 24.0]]
    assert int(mapped["masks"].sum()) == pytest.approx(4 * int(mask.sum()), rel=0.1)
