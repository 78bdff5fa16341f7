"""Instance segmentation (``segment``): masks stay on their objects through augmentation, the batch contract,
COCO box and mask mAP (crowd ignored, two ranks equal one process), results and prediction.

Records are built by hand here (``scene_records``): images of coloured objects with their polygons, so a
test can check that every mask of a sample covers pixels of its object's colour.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from zoo_core.data.augment import RandomWarp, boxes_from_masks, keep_visible_instances, make_boxes
from zoo_core.data.instances import InstanceRecord, InstanceShape
from zoo_core.data.sampling import InferenceShardSampler
from zoo_core.registry import builtin_tasks
from zoo_core.tasks import get_task
from zoo_core.tasks.base import AugmentSettings, ModelContractError
from zoo_core.tasks.metrics import OrderedMeanAveragePrecision
from zoo_core.tasks.predictions import InstanceSegmentationResult, Masks
from zoo_core.tasks.segment import InstanceSegmentationDataset, SegmentTask, segment_fitness

from . import family_checks as checks
from .doubles import LookupInstanceSegmenter, TinyInstanceSegmenter, fake_libre, image_key

NAMES = {0: "square", 1: "triangle"}
COLOURS = {0: (220, 40, 40), 1: (40, 220, 40)}
BACKGROUND = 30


# --------------------------------------------------------------------------- hand-built scenes
def scene_records(folder: Path, count: int, *, shape: tuple[int, int] = (64, 64), seed: int = 0,
                  crowd_in: tuple[int, ...] = ()) -> list[InstanceRecord]:
    """``count`` images, each with a red square (class 0) and a green triangle (class 1) at random places; the images
    listed in ``crowd_in`` also hold a grey crowd region of class 0 (``iscrowd``) in their bottom-right corner."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    height, width = shape
    records = []
    for index in range(count):
        pixels = np.full((height, width, 3), BACKGROUND, dtype=np.uint8)
        side = rng.uniform(0.25, 0.35)
        left, top = rng.uniform(0.05, 0.3), rng.uniform(0.05, max(0.05, 0.95 - side * width / height))
        square = np.array([[left, top], [left + side, top], [left + side, top + side * width / height], [left, top + side * width / height]])
        base_x, base_y = rng.uniform(0.55, 0.65), rng.uniform(0.5, 0.6)
        triangle = np.array([[base_x, base_y], [base_x + 0.3, base_y], [base_x + 0.15, base_y - 0.4]])
        polygons = [square.astype(np.float32), triangle.astype(np.float32)]
        classes = [0, 1]
        crowd = [False, False]
        if index in crowd_in:
            polygons.append(np.array([[0.8, 0.85], [0.98, 0.85], [0.98, 0.98], [0.8, 0.98]], dtype=np.float32))
            classes.append(0)
            crowd.append(True)
        shapes = [InstanceShape(polygons=(polygon,)) for polygon in polygons]
        for shape_, label, is_crowd in zip(shapes, classes, crowd):
            pixels[shape_.rasterise(height, width)] = (128, 128, 128) if is_crowd else COLOURS[label]
        path = folder / f"scene{index}.png"
        # written whole and renamed into place: the two ranks of a DDP test write the same scenes while reading them
        partial = folder / f".scene{index}.{os.getpid()}.png"
        Image.fromarray(pixels).save(partial)
        os.replace(partial, path)
        boxes = [np.concatenate([polygon.min(0), polygon.max(0)]) for polygon in polygons]
        labels = np.array([[label, *box] for label, box in zip(classes, boxes)], dtype=np.float32)
        records.append(InstanceRecord(image=path, height=height, width=width, labels=labels, shapes=shapes,
                                      crowd=np.array(crowd, dtype=bool)))
    return records


def assert_masks_cover_their_objects(sample: dict, *, share: float = 0.97) -> None:
    """The inside of every mask of ``sample`` (the mask less its border pixels, which resampling blends with the
    background) lies on pixels of its class's colour."""
    image = sample["image"].permute(1, 2, 0).int()
    assert sample["masks"].dtype == torch.uint8 and set(sample["masks"].unique().tolist()) <= {0, 1}
    assert len(sample["masks"]) == len(sample["boxes"]) == len(sample["classes"])
    inside = -torch.nn.functional.max_pool2d(-sample["masks"][:, None].float(), 3, stride=1, padding=1)[:, 0]
    for mask, label in zip(inside.bool(), sample["classes"].tolist()):
        assert mask.sum() >= 4, f"class {label}: a mask of no inside"
        colour = torch.tensor(COLOURS[label])
        close = (image[mask] - colour).abs().sum(-1) < 60
        assert close.float().mean() >= share, f"class {label}: only {close.float().mean():.2f} of its mask on its colour"


# --------------------------------------------------------------------------- the task and its declaration
def test_segment_is_a_declared_task_with_the_contracts_facts():
    assert builtin_tasks()["segment"].implementation == "zoo_core.tasks.segment:SegmentTask"
    task = get_task("segment", conf=0.01)
    assert isinstance(task, SegmentTask) and task.name == "segment" and task.fitness_metric == "fitness"
    assert task.shapes_yaml == "segment.yaml" and task.conf == 0.01
    assert task.export_outputs == ("boxes", "scores", "mask_coefficients", "mask_features")
    assert task.result_type == "zoo_core.tasks.predictions:InstanceSegmentationResult"
    assert task.predict_options == get_task("detect").predict_options
    with pytest.raises(ModelContractError, match="batch\\['masks'\\]"):
        task.loss(nn.Identity(), None, {})
    assert segment_fitness(1.0, 0.5, 0.8, 0.4) == pytest.approx(0.1 + 0.45 + 0.08 + 0.36)


# --------------------------------------------------------------------------- augmentation keeps masks aligned
def test_a_known_polygon_warped_by_a_fixed_affine_keeps_its_area_position_and_a_tight_box():
    # A diamond of half-diagonal 10 px around (32, 32): area 200. Rotated 45° and scaled 1.5 about the centre it is an
    # axis-aligned square of side 15·√2 (area 450) around the same centre. Its box, re-derived from the mask, is that
    # square's; warping the diamond's box instead would give the 42 px box of the rotated 20 px box.
    diamond = np.array([[22.0, 32.0], [32.0, 22.0], [42.0, 32.0], [32.0, 42.0]], dtype=np.float32) / 64
    mask = torch.from_numpy(InstanceShape(polygons=(diamond,)).rasterise(64, 64)).to(torch.uint8)[None]
    gain, angle = 1.5, math.radians(45)
    cosine, sine = gain * math.cos(angle), gain * math.sin(angle)
    matrix = np.array([[cosine, sine, 32 - cosine * 32 - sine * 32], [-sine, cosine, 32 + sine * 32 - cosine * 32]])
    warp = RandomWarp()
    params = {"matrix": matrix, "output_size": (64, 64)}
    from torchvision import tv_tensors

    box = make_boxes(torch.tensor([[22.0, 22.0, 42.0, 42.0]]), (64, 64))
    warped_box = warp.transform(box, params).as_subclass(torch.Tensor)
    warped = warp.transform(tv_tensors.Mask(mask), params).as_subclass(torch.Tensor)
    assert abs(int(warped.sum()) - 450) <= 30
    ys, xs = warped[0].nonzero(as_tuple=True)
    assert abs(float(xs.float().mean()) + 0.5 - 32) < 1 and abs(float(ys.float().mean()) + 0.5 - 32) < 1
    boxes, classes, masks = keep_visible_instances(warped_box, torch.tensor([3]), warped)
    side = 15 * math.sqrt(2)
    assert torch.allclose(boxes, torch.tensor([[32 - side / 2, 32 - side / 2, 32 + side / 2, 32 + side / 2]]), atol=1.5)
    assert float(warped_box[0, 2] - warped_box[0, 0]) == pytest.approx(30 * math.sqrt(2), abs=0.01)  # the loose box
    assert torch.equal(boxes, boxes_from_masks(masks)) and classes.tolist() == [3]


def test_a_mosaics_masks_warped_piece_by_piece_equal_the_warped_canvas():
    import random

    from torchvision import tv_tensors

    from zoo_core.data.augment import mosaic4

    generator = torch.Generator().manual_seed(4)
    random.seed(4)
    pieces, piece_masks = [], []
    for height, width in ((64, 48), (40, 64), (64, 64), (30, 50)):
        masks = (torch.rand(3, height, width, generator=generator) > 0.7).to(torch.uint8)
        pieces.append((torch.zeros(3, height, width, dtype=torch.uint8), make_boxes(torch.zeros(3, 4), (height, width)),
                       torch.zeros(3, dtype=torch.long)))
        piece_masks.append(masks)
    canvas, _, _, placed = mosaic4(pieces, 64, masks=piece_masks)
    dense = torch.zeros(12, 128, 128, dtype=torch.uint8)  # the canvas-sized masks the per-piece form avoids
    for number, (part, (left, top)) in enumerate(zip(placed.parts, placed.offsets)):
        dense[3 * number: 3 * number + 3, top: top + part.shape[1], left: left + part.shape[2]] = part
    torch.manual_seed(4)
    warp = RandomWarp(degrees=15.0, translate=0.1, scale=0.4, output_size=(64, 64), mask_fill=0)
    params = warp.make_params([tv_tensors.Image(canvas)])
    expected = warp.transform(tv_tensors.Mask(dense), params).as_subclass(torch.Tensor)
    assert expected.sum() > 1000
    assert (placed.warp(params["matrix"], (64, 64)) == expected).float().mean() > 0.999  # nearest ties may round apart
    assert torch.equal(placed.crop((64, 64)), dense[:, 32:96, 32:96])


def test_instances_whose_mask_vanished_are_dropped():
    masks = torch.zeros(3, 32, 32, dtype=torch.uint8)
    masks[0, 4:10, 4:12] = 1
    masks[2, 30:32, 30:32] = 1  # a 2×2 corner left of a 12×12 box: under a tenth of its area
    boxes = torch.tensor([[4.0, 4.0, 12.0, 10.0], [0.0, 0.0, 5.0, 5.0], [20.0, 20.0, 32.0, 32.0]])
    kept_boxes, classes, kept_masks = keep_visible_instances(boxes, torch.tensor([0, 1, 2]), masks)
    assert classes.tolist() == [0] and kept_boxes.tolist() == [[4.0, 4.0, 12.0, 10.0]] and len(kept_masks) == 1


def test_mosaic_affine_flip_and_hsv_keep_every_mask_on_its_object(tmp_path: Path):
    records = scene_records(tmp_path / "train", 6, shape=(64, 96))
    settings = AugmentSettings(mosaic=1.0, fliplr=0.5, degrees=10.0, translate=0.1, scale=0.3, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    dataset = InstanceSegmentationDataset(records, NAMES, 64, settings)
    torch.manual_seed(0)
    import random

    random.seed(0)
    objects = 0
    for index in range(12):
        sample = dataset[index % len(dataset)]
        assert sample["image"].shape == (3, 64, 64) and sample["masks"].shape[-2:] == (64, 64)
        assert "instance_truths" not in sample  # training samples carry only the batch contract
        assert_masks_cover_their_objects(sample, share=0.9)  # rotated edges resample differently in image and mask
        assert torch.equal(sample["boxes"], boxes_from_masks(sample["masks"]))
        objects += len(sample["classes"])
    assert objects >= 12


def test_flip_alone_mirrors_masks_with_their_pixels(tmp_path: Path):
    records = scene_records(tmp_path / "train", 2)
    settings = AugmentSettings(mosaic=0.0, fliplr=1.0, degrees=0.0, translate=0.0, scale=0.0, hsv_h=0.0, hsv_s=0.0, hsv_v=0.0)
    flipped = InstanceSegmentationDataset(records, NAMES, 64, settings)[0]
    plain = InstanceSegmentationDataset(records, NAMES, 64, None)[0]
    assert torch.equal(flipped["image"], plain["image"].flip(-1)) and torch.equal(flipped["masks"], plain["masks"].flip(-1))
    assert_masks_cover_their_objects(flipped)


def test_validation_samples_are_letterboxed_with_their_masks_and_crowd_regions_kept_apart(tmp_path: Path):
    records = scene_records(tmp_path / "val", 2, shape=(48, 80), crowd_in=(0,))
    task = get_task("segment")
    sample = InstanceSegmentationDataset(records, NAMES, 64, None, task.input_pipeline)[0]
    # 80×48 -> 64×38 at the top left: the crowd region is in neither the targets nor the masks
    assert sample["classes"].tolist() == [0, 1] and sample["masks"].shape == (2, 64, 64)
    assert not sample["masks"][:, 39:].any()  # the padding below the image holds no object
    assert_masks_cover_their_objects(sample)
    expected = torch.from_numpy(records[0].labels[:2, 1:]) * torch.tensor([80.0, 48.0, 80.0, 48.0]) * 0.8
    assert torch.allclose(sample["boxes"], expected, atol=1e-4)
    truths = sample["instance_truths"]
    assert truths["iscrowd"].tolist() == [0, 0, 1] and truths["shape"] == (48, 80) and len(truths["rles"]) == 3
    from pycocotools import mask as mask_utils

    assert np.array_equal(mask_utils.decode(truths["rles"][2]).astype(bool), records[0].shapes[2].rasterise(48, 80))


def test_collate_builds_the_segment_batch_contract(tmp_path: Path):
    records = scene_records(tmp_path / "val", 3, crowd_in=(1,))
    task = get_task("segment")
    dataset = InstanceSegmentationDataset(records, NAMES, 64, None, task.input_pipeline)
    batch = task.collate([dataset[index] for index in range(3)])
    assert batch["images"].shape == (3, 3, 64, 64) and batch["targets"].shape == (6, 6)
    assert batch["masks"].shape == (6, 64, 64) and batch["masks"].dtype == torch.uint8
    # row i of masks is the object of targets row i: its tight box is the target's box (to a pixel's rounding)
    assert torch.allclose(boxes_from_masks(batch["masks"]), batch["targets"][:, 2:6], atol=1.5)  # a thin apex may miss a row
    assert batch["indices"].tolist() == [0, 1, 2] and len(batch["instance_truths"]) == 3
    # the metric's truths travel as COCO RLEs (bytes), never as original-size dense masks
    assert all(isinstance(rle["counts"], (bytes, str)) for truth in batch["instance_truths"] for rle in truth["rles"])
    preprocessed = task.preprocess(batch, torch.device("cpu"))
    assert preprocessed["images"].dtype == torch.float32 and preprocessed["masks"].shape == (6, 64, 64)
    resized = task.resize_batch(preprocessed, (96, 96))
    assert resized["images"].shape[-2:] == (96, 96) and resized["masks"].shape == (6, 96, 96)
    assert torch.allclose(boxes_from_masks(resized["masks"]), boxes_from_masks(batch["masks"]) * 1.5, atol=1.01)
    assert torch.allclose(resized["targets"][:, 2:6], batch["targets"][:, 2:6] * 1.5)
    drawn = task.draw_batch(batch, NAMES)
    assert drawn.dtype == torch.uint8 and drawn.shape[0] == 3
    example = task.example_batch(2, 64, 2)
    assert example["masks"].shape == (len(example["targets"]), 64, 64)
    assert torch.allclose(boxes_from_masks(example["masks"]), example["targets"][:, 2:6], atol=1.01)


# --------------------------------------------------------------------------- the metric
def square_masks(boxes: list[list[int]], shape: tuple[int, int] = (32, 32)) -> torch.Tensor:
    masks = torch.zeros(len(boxes), *shape, dtype=torch.bool)
    for mask, (x1, y1, x2, y2) in zip(masks, boxes):
        mask[y1:y2, x1:x2] = True
    return masks


def box_and_mask_map(predictions: list[dict], truths: list[dict]) -> dict[str, float]:
    metric = OrderedMeanAveragePrecision(iou_type=("bbox", "segm"))
    metric.update(predictions, truths, list(range(len(truths))))
    values = metric.compute()
    return {key: float(values[key]) for key in ("bbox_map", "segm_map", "bbox_map_50", "segm_map_50")}


def test_perfect_predictions_score_one_and_a_shifted_mask_lowers_mask_map_only():
    truth = {"boxes": torch.tensor([[4.0, 4.0, 20.0, 20.0]]), "labels": torch.tensor([0]), "masks": square_masks([[4, 4, 20, 20]])}
    perfect = {**truth, "scores": torch.tensor([0.9])}
    assert box_and_mask_map([perfect], [truth]) == {"bbox_map": 1.0, "segm_map": 1.0, "bbox_map_50": 1.0, "segm_map_50": 1.0}
    shifted = {**perfect, "masks": square_masks([[9, 9, 25, 25]])}  # mask IoU 121/391: below every threshold
    scores = box_and_mask_map([shifted], [truth])
    assert scores["bbox_map"] == 1.0 and scores["segm_map"] == 0.0


def test_the_metric_holds_and_gathers_masks_as_rles_not_dense_tensors(monkeypatch):
    masks = square_masks([[4, 4, 20, 20]], shape=(480, 640))
    truth = {"boxes": torch.tensor([[4.0, 4.0, 20.0, 20.0]]), "labels": torch.tensor([0]), "masks": masks}
    metric = OrderedMeanAveragePrecision(iou_type=("bbox", "segm"))
    metric.update([{**truth, "scores": torch.tensor([0.9])}], [truth], [0])
    (held,) = metric.detection_mask[0]
    size, counts = held
    assert tuple(size) == (480, 640) and isinstance(counts, bytes) and len(counts) < 100  # a 307,200-pixel mask in bytes
    # what one rank sends the others: every per-image state, RLE tuples as they are
    sent = []

    def all_gather_object(gathered: list, local: dict, group=None) -> None:
        sent.append(local)
        gathered[:] = [local, {name: [] for name in local}]

    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    metric._sync_dist()
    assert sent[0]["detection_mask"] == [(held,)] and sent[0]["groundtruth_mask"] == metric.groundtruth_mask
    assert not any(isinstance(item, torch.Tensor) and item.numel() >= 480 * 640 for items in sent[0].values() for item in items)
    assert float(metric.compute()["segm_map"]) == 1.0


def test_detections_on_crowd_regions_are_ignored_as_coco_does():
    truth = {"boxes": torch.tensor([[2.0, 2.0, 12.0, 12.0], [16.0, 16.0, 30.0, 30.0]]), "labels": torch.tensor([0, 0]),
             "masks": square_masks([[2, 2, 12, 12], [16, 16, 30, 30]])}
    found = {"boxes": truth["boxes"].clone(), "labels": torch.tensor([0, 0]), "scores": torch.tensor([0.6, 0.9]),
             "masks": truth["masks"].clone()}
    crowd = box_and_mask_map([found], [{**truth, "iscrowd": torch.tensor([0, 1])}])
    assert crowd["bbox_map"] == 1.0 and crowd["segm_map"] == 1.0  # the higher-scored detection on the crowd costs nothing
    missed = box_and_mask_map([{key: value[:1] for key, value in found.items()}], [{**truth, "iscrowd": torch.tensor([0, 1])}])
    assert missed["segm_map"] == 1.0  # nor does leaving the crowd region unfound
    counted = box_and_mask_map([{key: value[:1] for key, value in found.items()}], [truth])
    assert counted["segm_map"] < 1.0  # the same miss of an ordinary object lowers recall


def lookup_model(task: SegmentTask, dataset: InstanceSegmentationDataset, *, noisy: bool,
                 num_classes: int = len(NAMES)) -> LookupInstanceSegmenter:
    """The true objects of every image as predictions (``noisy``: masks dilated or shifted, scores random, a false object)."""
    generator = torch.Generator().manual_seed(5)
    table = {}
    for index in range(len(dataset)):
        batch = task.preprocess(task.collate([dataset[index]]), torch.device("cpu"))
        masks = batch["masks"].bool()
        boxes, labels = batch["targets"][:, 2:6], batch["targets"][:, 1].long()
        scores = torch.ones(len(labels))
        if noisy:
            shifts = torch.randint(-6, 7, (len(masks), 2), generator=generator)
            masks = torch.stack([mask.roll((int(dy), int(dx)), dims=(0, 1)) for mask, (dy, dx) in zip(masks, shifts.tolist())])
            boxes = boxes + torch.randn(len(boxes), 4, generator=generator) * 2
            scores = torch.rand(len(labels), generator=generator) * 0.5 + 0.5
            false_mask = torch.zeros(1, 64, 64, dtype=torch.bool)
            false_mask[0, 50:60, 2:12] = True
            masks, boxes = torch.cat([masks, false_mask]), torch.cat([boxes, torch.tensor([[2.0, 50.0, 12.0, 60.0]])])
            scores, labels = torch.cat([scores, torch.tensor([0.7])]), torch.cat([labels, torch.tensor([1])])
        table[image_key(batch["images"][0])] = {"boxes": boxes, "scores": scores, "labels": labels, "masks": masks}
    return LookupInstanceSegmenter(table, num_classes).eval()


METRIC_KEYS = {"mAP50-95", "mAP50", "mAP75", "mAR100", "mask_mAP50-95", "mask_mAP50", "mask_mAP75", "fitness"}


def test_validation_scores_a_perfect_and_a_noisy_segmenter(tmp_path: Path):
    task = get_task("segment")
    dataset = InstanceSegmentationDataset(scene_records(tmp_path / "val", 4, shape=(48, 80), crowd_in=(2,)), NAMES, 64, None,
                                          task.input_pipeline)
    loader = DataLoader(dataset, batch_size=3, collate_fn=task.collate)
    perfect = task.validate(lookup_model(task, dataset, noisy=False), loader, torch.device("cpu"), NAMES)
    assert set(perfect) == METRIC_KEYS
    # boxes are exact; the masks went to the 64-pixel input and back (letterbox crop, bilinear resize), which costs
    # small objects the strictest IoU thresholds only
    assert perfect["mAP50-95"] == pytest.approx(1.0) and perfect["mask_mAP50"] == 1.0 and perfect["mask_mAP50-95"] > 0.6
    assert perfect["fitness"] == pytest.approx(segment_fitness(perfect["mAP50"], perfect["mAP50-95"], perfect["mask_mAP50"],
                                                               perfect["mask_mAP50-95"]))
    noisy = task.validate(lookup_model(task, dataset, noisy=True), loader, torch.device("cpu"), NAMES)
    assert 0 < noisy["mask_mAP50-95"] < perfect["mask_mAP50-95"] and 0 < noisy["mAP50-95"] < 1


def test_validation_with_a_report_draws_batches_with_masks(tmp_path: Path):
    from zoo_core.reports.validation_report import ValidationReport

    task = get_task("segment")
    dataset = InstanceSegmentationDataset(scene_records(tmp_path / "val", 2), NAMES, 64, None, task.input_pipeline)
    loader = DataLoader(dataset, batch_size=2, collate_fn=task.collate)
    report = ValidationReport(tmp_path / "report")
    task.validate(lookup_model(task, dataset, noisy=False), loader, torch.device("cpu"), NAMES, report=report)
    assert (tmp_path / "report" / "val_batch0_labels.jpg").is_file() and (tmp_path / "report" / "val_batch0_pred.jpg").is_file()


def validate_shard(folder: str, rank: int, world_size: int, samples: int) -> dict[str, float]:
    task = get_task("segment")
    dataset = InstanceSegmentationDataset(scene_records(Path(folder) / "val", samples, crowd_in=(1,), seed=3), NAMES, 64, None,
                                          task.input_pipeline)
    model = lookup_model(task, dataset, noisy=True)
    loader = DataLoader(dataset, batch_size=2, sampler=InferenceShardSampler(len(dataset), rank, world_size), collate_fn=task.collate)
    return task.validate(model, loader, torch.device("cpu"), NAMES)


def _rank_main(rank: int, world_size: int, port: int, output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results = {"5": validate_shard(output, rank, world_size, 5), "1": validate_shard(output, rank, world_size, 1)}
        Path(output, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_sharded_validation_on_two_processes_equals_one_process_masks_included(tmp_path: Path):
    torch.set_num_threads(1)
    single = {"5": validate_shard(str(tmp_path), 0, 1, 5), "1": validate_shard(str(tmp_path), 0, 1, 1)}
    assert 0 < single["5"]["mask_mAP50-95"] < 1
    checks.run_on_two_processes(_rank_main, tmp_path, deadline_s=180, what="validation")
    checks.assert_every_rank_wrote(tmp_path, single)


# --------------------------------------------------------------------------- results and prediction
def segmentation_result() -> InstanceSegmentationResult:
    masks = torch.zeros(2, 40, 60, dtype=torch.bool)
    masks[0, 5:25, 10:30] = True
    masks[1, 20:35, 40:55] = True
    masks[1, 2:4, 2:4] = True  # a stray speck: the polygon is the largest contour
    return InstanceSegmentationResult(
        orig_image=torch.full((3, 40, 60), 20, dtype=torch.uint8), path=None, name="scene", names=NAMES,
        boxes=torch.tensor([[10.0, 5.0, 30.0, 25.0], [40.0, 20.0, 55.0, 35.0]]), scores=torch.tensor([0.9, 0.6]),
        labels=torch.tensor([0, 1]), masks=masks)


def test_masks_offer_data_and_largest_contour_polygons_in_pixels_and_normalised():
    result = segmentation_result()
    assert isinstance(result.masks, Masks) and result.masks.data.shape == (2, 40, 60) and result.masks.data.dtype == torch.bool
    first, second = result.masks.xy
    assert first.dtype == np.float32 and first.shape[1] == 2
    assert first.min(0).tolist() == [10, 5] and first.max(0).tolist() == [29, 24]  # OpenCV's contour runs on the edge pixels
    assert second.min(0).tolist() == [40, 20]  # the 2×2 speck is not the polygon
    assert np.allclose(result.masks.xyn[0], first / np.array([60, 40]))
    assert repr(result) == "InstanceSegmentationResult(path='scene', image=3×40×60, boxes=2, masks=2)"


def test_mask_polygons_are_libreyolos():
    from libreyolo.utils.results import Masks as LibreMasks

    masks = segmentation_result().masks.data.clone()
    masks[0, 30:38, 2:40:2] = True  # a comb below the square: a second piece of many more points but less area
    masks[0, 38, 2:40] = True
    ours, oracle = Masks(masks), LibreMasks(masks.numpy(), (40, 60))
    assert len(ours.xy) == len(oracle.xy) == 2 and ours.xy[0].min(0).tolist() == [10, 5]  # the square, not the comb
    for mine, theirs in zip(ours.xy + ours.xyn, oracle.xy + oracle.xyn):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)


def test_save_txt_writes_yolo_segmentation_lines_that_read_back_as_the_masks(tmp_path: Path):
    result = segmentation_result()
    path = result.save_txt(tmp_path / "labels" / "scene.txt", save_conf=True)
    lines = path.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["0", "1"] and float(lines[0].split()[-1]) == pytest.approx(0.9)
    for line, mask in zip(lines, result.masks.data):
        values = [float(value) for value in line.split()[1:-1]]
        polygon = np.array(values, dtype=np.float32).reshape(-1, 2)
        redrawn = torch.from_numpy(InstanceShape(polygons=(polygon,)).rasterise(40, 60))
        overlap = float((redrawn & mask).sum()) / float((redrawn | mask).sum())
        assert overlap > 0.8
    assert len(result.yolo_lines()[0].split()) == len(lines[0].split()) - 1


def test_to_json_carries_polygons_and_keep_classes_keeps_masks_with_boxes():
    result = segmentation_result()
    data = json.loads(result.to_json())
    assert data["classes"] == ["square", "triangle"] and len(data["polygons"]) == 2 and len(data["polygons"][0][0]) == 2
    assert result.rows()[1]["polygon"] == result.masks.xy[1].tolist()
    kept = result.keep_classes([1])
    assert kept.labels.tolist() == [1] and torch.equal(kept.masks.data, result.masks.data[1:]) and len(kept.boxes) == 1
    with pytest.raises(ValueError, match="one mask of the image's size"):
        InstanceSegmentationResult(orig_image=torch.zeros(3, 8, 8, dtype=torch.uint8), path=None, name="x", names=NAMES,
                                   boxes=torch.zeros(1, 4), scores=torch.ones(1), labels=torch.zeros(1, dtype=torch.long),
                                   masks=torch.zeros(1, 4, 4, dtype=torch.bool))


def test_plot_fills_masks_translucently_and_outlines_them_under_the_boxes():
    result = segmentation_result()
    drawn = result.plot().astype(int)
    background = 20
    inside = drawn[22, 20]  # well inside the first mask, away from its box's lines and caption
    assert (np.abs(inside - background) > 20).any() and (inside < 250).all()  # tinted, not painted over
    assert (drawn[38, 5] == background).all()  # outside every object nothing changes
    from zoo_core.reports.drawing import class_colour

    outline = drawn[34, 47]  # the second mask's bottom edge, inside its box: the outline in the class colour
    assert np.abs(outline - np.array(class_colour(1))).sum() < 30


def test_predict_returns_masks_at_the_original_size_through_the_runner(tmp_path: Path):
    from zoo_core.data.input_pipeline import fit_to_input
    from zoo_core.tasks.runner import predict

    image = torch.full((3, 60, 120), BACKGROUND, dtype=torch.uint8)
    image[:, 20:40, 50:70] = 200
    letterboxed, _, _ = fit_to_input(image, 64, SegmentTask.default_input_pipeline)
    mask = torch.zeros(1, 64, 64, dtype=torch.bool)
    mask[0, 10:20, 25:35] = True  # 120×60 -> 64×32: input (25..35, 10..20) is original (~47..66, ~19..38)
    table = {image_key(letterboxed.float().div(255)): {
        "boxes": torch.tensor([[25.0, 10.0, 35.0, 20.0]]), "scores": torch.tensor([0.9]), "labels": torch.tensor([1]), "masks": mask}}
    libre = fake_libre(LookupInstanceSegmenter(table, len(NAMES)), "segment", NAMES, 64)
    (result,) = predict(libre, image.permute(1, 2, 0).numpy(), conf=0.5, save=True, save_txt=True, project=tmp_path)
    assert isinstance(result, InstanceSegmentationResult) and result.task == "segment"
    assert result.masks.data.shape == (1, 60, 120)
    ys, xs = result.masks.data[0].nonzero(as_tuple=True)
    assert abs(int(xs.min()) - 47) <= 1 and abs(int(xs.max()) - 65) <= 1 and abs(int(ys.min()) - 19) <= 1
    assert torch.allclose(result.boxes.xyxy, torch.tensor([[46.875, 18.75, 65.625, 37.5]]), atol=1e-3)
    assert Image.open(result.save_path).size == (120, 60)
    label_file = result.save_dir / "labels" / f"{Path(result.save_path).stem}.txt"
    assert label_file.read_text().split()[0] == "1" and len(label_file.read_text().split()) >= 7
    (kept,) = predict(libre, image.permute(1, 2, 0).numpy(), conf=0.5, classes=[0])
    assert len(kept.boxes) == 0 and kept.masks.data.shape == (0, 60, 120)


# --------------------------------------------------------------------------- end to end on the built-in shapes
SHAPES = "shapes:train=4,val=4,size=64,seed=2"


def test_prepare_reads_the_shapes_polygons_and_coco_rles_end_to_end(tmp_path: Path):
    from zoo_core.tasks.runner import validate

    task = get_task("segment")
    spec = task.prepare(SHAPES)
    assert spec.task == "segment" and Path(spec.extra["yaml"]).name == "segment.yaml"
    val = task.dataset(spec, "val", 64, None)
    batch = task.collate([val[index] for index in range(len(val))])
    assert len(batch["masks"]) == len(batch["targets"]) > 4
    assert torch.allclose(boxes_from_masks(batch["masks"]), batch["targets"][:, 2:6], atol=1.5)
    model = lookup_model(task, val, noisy=False, num_classes=len(spec.names))
    loader = DataLoader(val, batch_size=2, collate_fn=task.collate)
    perfect = task.validate(model, loader, torch.device("cpu"), spec.names)
    # 64-pixel images at a 64-pixel input: the masks make no round trip, so every threshold is met
    assert perfect["mAP50-95"] == pytest.approx(1.0) and perfect["mask_mAP50-95"] == pytest.approx(1.0)
    # the same objects read from the COCO JSON (exact RLE masks) are what the polygons are, to COCO's 0.5 IoU at least
    coco_spec = task.prepare(Path(spec.extra["yaml"]).with_name("coco.yaml"))
    coco_val = task.dataset(coco_spec, "val", 64, None)
    assert isinstance(coco_val.records[0].shapes[0].rle, dict)
    across = task.validate(model, DataLoader(coco_val, batch_size=2, collate_fn=task.collate), torch.device("cpu"), spec.names)
    assert across["mAP50"] == pytest.approx(1.0) and across["mask_mAP50"] == pytest.approx(1.0)
    train = task.dataset(spec, "train", 64, AugmentSettings())
    sample = train[0]
    assert sample["masks"].shape[-2:] == (64, 64) and torch.equal(sample["boxes"], boxes_from_masks(sample["masks"]))
    metrics = validate(fake_libre(model, "segment", spec.names, 64), SHAPES, batch=2, imgsz=64, device="cpu", workers=0).metrics
    assert set(metrics) == METRIC_KEYS and metrics["mask_mAP50-95"] == pytest.approx(1.0)


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_a_segment_model_exports_its_four_outputs_to_onnx_and_torchscript(tmp_path: Path):
    import onnxruntime

    from zoo_core.export import export_graph

    torch.manual_seed(0)
    model = TinyInstanceSegmenter(len(NAMES)).eval()
    outputs = get_task("segment").export_outputs
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = [model(images)[name].numpy() for name in outputs]
    onnx_path = export_graph(model, "onnx", tmp_path / "model.onnx", name="tiny-seg", task="segment", outputs=outputs, input_size=64)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert [item.name for item in session.get_outputs()] == list(outputs)
    for got, want in zip(session.run(None, {"images": images.numpy()}), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    script_path = export_graph(model, "torchscript", tmp_path / "model.torchscript", name="tiny-seg", task="segment",
                               outputs=outputs, input_size=64)
    with torch.no_grad():
        traced = torch.jit.load(str(script_path))(images)
    assert len(traced) == 4
    for got, want in zip(traced, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_an_untrained_prototype_model_validates_and_predicts_through_the_contract(tmp_path: Path):
    from zoo_core.tasks.runner import predict

    torch.manual_seed(0)
    task = get_task("segment")
    spec = task.prepare(SHAPES)
    model = TinyInstanceSegmenter(len(spec.names)).eval()
    val = task.dataset(spec, "val", 64, None)
    metrics = task.validate(model, DataLoader(val, batch_size=2, collate_fn=task.collate), torch.device("cpu"), spec.names)
    assert set(metrics) == METRIC_KEYS and all(0.0 <= value <= 2.0 for value in metrics.values())
    image = np.full((48, 80, 3), 90, dtype=np.uint8)
    (result,) = predict(fake_libre(model, "segment", spec.names, 64), image, conf=0.0, max_det=5)
    assert result.masks.data.shape == (len(result.boxes), 48, 80) and len(result.masks.xy) == len(result.boxes) <= 5


def test_a_training_set_of_box_lines_only_is_refused_with_the_reason(tmp_path: Path):
    from zoo_core.data.errors import DatasetError

    for folder in ("images/train", "labels/train", "images/val", "labels/val"):
        (tmp_path / folder).mkdir(parents=True)
    for split in ("train", "val"):
        Image.fromarray(np.full((32, 32, 3), 90, dtype=np.uint8)).save(tmp_path / "images" / split / "0001.png")
        (tmp_path / "labels" / split / "0001.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (tmp_path / "data.yaml").write_text(f"path: {tmp_path}\ntrain: images/train\nval: images/val\nnames: [car]\n")
    task = get_task("segment")
    spec = task.prepare(tmp_path / "data.yaml")
    with pytest.warns(Warning), pytest.raises(DatasetError, match=r"has an object outline \(1 label lines were skipped.*polygon"):
        task.dataset(spec, "train", 64, None)


def test_a_segment_family_trains_through_the_engine_and_its_weights_predict_masks(tmp_path: Path):
    from zoo_core import LibreYOLO
    from zoo_core.plugin_manager import register_plugin

    register_plugin("tests.segment_family")
    torch.manual_seed(0)
    result = LibreYOLO("tinyseg-s").train(data=SHAPES, epochs=2, batch=4, imgsz=64, workers=0, device="cpu", verbose=False,
                                          project=str(tmp_path))
    assert set(result.metrics) >= METRIC_KEYS
    first = result.history[0]
    assert {"train/mask", "val/mask", "metrics/mask_mAP50-95", "metrics/fitness"} <= set(first)
    assert first["fitness"] == pytest.approx(segment_fitness(first["metrics/mAP50"], first["metrics/mAP50-95"],
                                                              first["metrics/mask_mAP50"], first["metrics/mask_mAP50-95"]))
    written = {path.name for path in result.run_dir.iterdir()}
    assert {"train_batch0.jpg", "labels.jpg", "val_batch0_labels.jpg", "val_batch0_pred.jpg", "PR_curve.png"} <= written
    trained = LibreYOLO(result.best)
    assert trained.task == "segment"
    (found,) = trained.predict(np.full((48, 80, 3), 90, dtype=np.uint8), conf=0.0, max_det=3, device="cpu")
    assert isinstance(found, InstanceSegmentationResult) and found.masks.data.shape[1:] == (48, 80)


def test_a_coco_json_dataset_trains_segmentation_as_its_yolo_polygon_twin_does(tmp_path: Path):
    """shapes writes the same objects twice, as YOLO-seg polygons (segment.yaml) and as COCO JSON with exact RLE
    masks (coco.yaml); both rasterise to the same pixels, so one epoch from either gives the same losses."""
    from zoo_core import LibreYOLO
    from zoo_core.data.shapes import materialize_shapes
    from zoo_core.plugin_manager import register_plugin

    register_plugin("tests.segment_family")
    root = materialize_shapes(SHAPES)
    histories = {}
    for dataset in ("segment.yaml", "coco.yaml"):
        torch.manual_seed(0)
        result = LibreYOLO("tinyseg-s").train(data=str(root / dataset), epochs=1, batch=4, imgsz=64, workers=0, device="cpu",
                                              augment=False, plots=False, verbose=False, project=str(tmp_path / dataset))
        assert set(result.metrics) >= METRIC_KEYS
        histories[dataset] = result.history[0]
    polygons, coco = histories["segment.yaml"], histories["coco.yaml"]
    for key in ("train/loss", "train/mask", "val/mask", "metrics/mask_mAP50-95"):
        assert coco[key] == pytest.approx(polygons[key], rel=1e-4, abs=1e-6), key
