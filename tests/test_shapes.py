"""The built-in ``shapes`` dataset: spelling, determinism, exact labels, speed, and safe concurrent generation."""

from __future__ import annotations

import hashlib
import multiprocessing
import pickle
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from zoo_core.data.errors import DatasetError
from zoo_core.data.shapes import SHAPES_CLASSES, ShapesConfig, materialize_shapes, parse_shapes, render_scene, shapes
from zoo_core.tasks import get_task

SMALL = ShapesConfig(num_train=6, num_val=3, image_size=64, seed=0)


def digest_tree(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(root.rglob("*")) if path.is_file()}


def test_spellings_parse_to_configs():
    assert parse_shapes("shapes") == ShapesConfig()
    assert parse_shapes("shapes:train=10,val=4,size=96,seed=3") == ShapesConfig(10, 4, 96, 3)
    assert parse_shapes("shapes:seed=2") == ShapesConfig(seed=2)
    assert parse_shapes("data.yaml") is None and parse_shapes(Path("shapes")) is None  # a Path is always a path
    assert shapes(num_train=10, num_val=4, image_size=96, seed=3) == "shapes:train=10,val=4,size=96,seed=3"
    with pytest.raises(DatasetError, match="unknown item 'colour=red'"):
        parse_shapes("shapes:colour=red")
    with pytest.raises(DatasetError, match="must be an integer"):
        parse_shapes("shapes:train=many")
    with pytest.raises(DatasetError, match="image_size must be an integer >= 32"):
        shapes(image_size=8)


def test_same_seed_gives_identical_bytes_and_another_seed_differs(tmp_path: Path):
    first = materialize_shapes(SMALL, cache=tmp_path / "a")
    second = materialize_shapes(SMALL, cache=tmp_path / "b")
    assert digest_tree(first) == digest_tree(second)
    other = materialize_shapes(ShapesConfig(num_train=6, num_val=3, image_size=64, seed=1), cache=tmp_path / "c")
    first_images = {k: v for k, v in digest_tree(first).items() if k.startswith("images/")}
    other_images = {k: v for k, v in digest_tree(other).items() if k.startswith("images/")}
    assert first_images.keys() == other_images.keys()
    assert all(first_images[key] != other_images[key] for key in first_images)


def test_labels_masks_and_crops_are_exact(tmp_path: Path):
    root = materialize_shapes(SMALL, cache=tmp_path)
    for index in range(SMALL.num_train):
        mask = np.asarray(Image.open(root / "masks" / "train" / f"{index:06d}.png"))
        lines = (root / "labels" / "train" / f"{index:06d}.txt").read_text().splitlines()
        assert 1 <= len(lines) <= 4
        for line in lines:
            class_id, cx, cy, w, h = (float(value) for value in line.split())
            x1, y1 = round((cx - w / 2) * 64), round((cy - h / 2) * 64)
            x2, y2 = round((cx + w / 2) * 64), round((cy + h / 2) * 64)
            inside = mask[y1:y2, x1:x2] == class_id + 1
            # the box is tight around pixels of its class: every border row/column touches one
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
    crops = sorted((root / "classify" / "train").rglob("*.png"))
    assert {path.parent.name for path in crops} <= set(SHAPES_CLASSES)
    assert sorted(path.name for path in (root / "classify" / "val").iterdir()) == sorted(SHAPES_CLASSES)


def test_scenes_vary_in_count_class_and_texture():
    scenes = [render_scene(np.random.default_rng([0, 0, index]), 96) for index in range(40)]
    assert {len(scene.classes) for scene in scenes} >= {1, 2, 3}
    assert {class_id for scene in scenes for class_id in scene.classes} == set(range(len(SHAPES_CLASSES)))
    assert len({int(scene.image.std()) for scene in scenes}) > 10


def test_every_task_reads_shapes_through_its_ordinary_loader():
    data = "shapes:train=6,val=3,size=64,seed=0"
    for task_name in ("detect", "classify", "semantic", "restore"):
        spec = get_task(task_name).prepare(data)
        assert pickle.loads(pickle.dumps(spec)) == spec  # spawned DDP workers receive it
    detect = get_task("detect").prepare(data)
    assert detect.names == dict(enumerate(SHAPES_CLASSES)) and detect.extra["yaml"].endswith("detect.yaml")
    assert len(get_task("detect").dataset(detect, "train", 64, None)) == 6
    semantic = get_task("semantic").prepare(data)
    assert semantic.names[0] == "background" and len(semantic.names) == len(SHAPES_CLASSES) + 1
    assert len(get_task("semantic").dataset(semantic, "val", 64, None)) == 3
    classify = get_task("classify").prepare(data)
    assert sorted(classify.names.values()) == sorted(SHAPES_CLASSES)
    assert len(get_task("classify").dataset(classify, "train", 32, None)) >= 6
    restore = get_task("restore").prepare(data)
    assert len(get_task("restore").dataset(restore, "val", 32, None)) == 3


def test_the_default_generates_in_a_few_seconds(tmp_path: Path):
    started = time.perf_counter()
    root = materialize_shapes("shapes", cache=tmp_path)
    elapsed = time.perf_counter() - started
    assert len(list((root / "images" / "train").iterdir())) == ShapesConfig().num_train
    assert elapsed < 8.0, f"default shapes took {elapsed:.1f} s"
    started = time.perf_counter()
    assert materialize_shapes("shapes", cache=tmp_path) == root  # the second call reuses the cache
    assert time.perf_counter() - started < 0.1


def test_a_generation_that_loses_the_rename_race_uses_the_winners_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import zoo_core.data.shapes as shapes_module

    real_write = shapes_module.write_shapes

    def write_while_another_process_wins(config: ShapesConfig, staging: Path) -> None:
        winner = tmp_path / "datasets" / config.directory_name
        real_write(config, winner)  # the other process renames its copy into place first
        (winner / "winner.txt").write_text("first")
        real_write(config, staging)

    monkeypatch.setattr(shapes_module, "write_shapes", write_while_another_process_wins)
    root = materialize_shapes(SMALL, cache=tmp_path)
    assert (root / "winner.txt").read_text() == "first"
    assert [path.name for path in (tmp_path / "datasets").iterdir()] == [SMALL.directory_name]  # no staging left


def _generate_after_barrier(cache: str, barrier: "multiprocessing.synchronize.Barrier", results: "multiprocessing.Queue") -> None:
    barrier.wait(timeout=60)
    results.put(str(materialize_shapes(ShapesConfig(num_train=24, num_val=8, image_size=96, seed=5), cache=Path(cache))))


def test_two_processes_generating_at_once_end_with_one_complete_copy(tmp_path: Path):
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_generate_after_barrier, args=(str(tmp_path / "cache"), barrier, results)) for _ in range(2)]
    for worker in workers:
        worker.start()
    try:
        paths = [results.get(timeout=90) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.kill()
    assert all(worker.exitcode == 0 for worker in workers)
    assert paths[0] == paths[1]
    reference = materialize_shapes(ShapesConfig(num_train=24, num_val=8, image_size=96, seed=5), cache=tmp_path / "reference")
    assert digest_tree(Path(paths[0])) == digest_tree(reference)
    assert [path.name for path in (tmp_path / "cache" / "datasets").iterdir()] == [Path(paths[0]).name]


def test_segment_polygons_rasterise_to_the_true_visible_masks(tmp_path: Path):
    from zoo_core.data.instance_readers import index_instance_split

    config = ShapesConfig(num_train=24, num_val=3, image_size=96, seed=0)
    root = materialize_shapes(config, cache=tmp_path)
    spec = get_task("detect").prepare(str(root / "segment.yaml"))
    records = index_instance_split(spec.train, spec.names)
    assert [record.image.name for record in records] == [f"{index:06d}.png" for index in range(config.num_train)]
    ious, split_objects = [], 0
    for index, record in enumerate(records):
        scene = render_scene(np.random.default_rng([config.seed, 0, index]), config.image_size)
        assert record.labels[:, 0].astype(int).tolist() == scene.classes
        for object_index, shape in enumerate(record.shapes):
            truth = scene.instance_mask(object_index)
            drawn = shape.rasterise(config.image_size, config.image_size)
            ious.append((drawn & truth).sum() / (drawn | truth).sum())
            np.testing.assert_allclose(record.labels[object_index, 1:] * config.image_size, scene.boxes[object_index], atol=0.5)
            import cv2

            split_objects += cv2.connectedComponents(truth.astype(np.uint8))[0] > 2
    assert min(ious) >= 0.95, sorted(ious)[:5]
    # the detect labels stay box lines: segment labels live in their own folder
    assert len((root / "labels" / "train" / "000000.txt").read_text().splitlines()[0].split()) == 5
    assert (root / "segment" / "images" / "train" / "000000.png").read_bytes() == (root / "images" / "train" / "000000.png").read_bytes()


def test_coco_json_of_shapes_holds_the_exact_visible_masks(tmp_path: Path):
    import json

    from pycocotools import mask as mask_utils

    root = materialize_shapes(SMALL, cache=tmp_path)
    coco = json.loads((root / "coco" / "instances_val.json").read_text())
    assert [category["name"] for category in coco["categories"]] == list(SHAPES_CLASSES)
    assert [image["file_name"] for image in coco["images"]] == [f"{index:06d}.png" for index in range(SMALL.num_val)]
    for image in coco["images"]:
        scene = render_scene(np.random.default_rng([SMALL.seed, 1, image["id"] - 1]), SMALL.image_size)
        annotations = [annotation for annotation in coco["annotations"] if annotation["image_id"] == image["id"]]
        assert [annotation["category_id"] - 1 for annotation in annotations] == scene.classes
        for object_index, annotation in enumerate(annotations):
            decoded = mask_utils.decode(annotation["segmentation"]).astype(bool)
            np.testing.assert_array_equal(decoded, scene.instance_mask(object_index))
            x, y, width, height = annotation["bbox"]
            assert (x, y, x + width, y + height) == scene.boxes[object_index] and annotation["area"] == decoded.sum()
