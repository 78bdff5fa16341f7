"""Rectangular input sizes (issue 16): ``imgsz=(height, width)`` through the registry, the arguments, training,
validation, prediction (whole and sliding-window), weights files and export, for semantic segmentation; a clear
error for the tasks that take squares. Sharded validation of the rectangular families equals one process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Subset

from zoo_core.cli import build_parser
from zoo_core.data.input_pipeline import fit_to_input, logits_to_original
from zoo_core.data.sampling import InferenceShardSampler
from zoo_core.engine.config import TrainConfig
from zoo_core.errors import RegistryError, TrainConfigError
from zoo_core.facade import LibreYOLO
from zoo_core.registry import image_size_hw, normalise_image_size, validate_declaration
from zoo_core.tasks import get_task
from zoo_core.tasks.runner import check_image_size, predict
from zoo_core.tasks.semantic import SemanticTask
from zoo_core.weights import ModelMeta, read_weights, save_safetensors

from .doubles import fake_libre
from . import family_checks as checks
from .segmentation_oracle import build, normalised, randomise_normalisation

pytestmark = pytest.mark.timeout(300)

DATA = "shapes:train=2,val=8,size=64,seed=1"


_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)


# ------------------------------------------------------------------------------ the size value
@pytest.mark.parametrize(("value", "expected"), [(512, 512), ([512, 1024], (512, 1024)), ((64, 64), 64), ((96, 32), (96, 32))])
def test_a_size_is_an_int_or_a_height_width_pair_and_a_square_pair_is_its_int(value, expected):
    assert normalise_image_size(value) == expected
    assert image_size_hw(normalise_image_size(value)) == ((expected, expected) if isinstance(expected, int) else expected)


@pytest.mark.parametrize("value", ["512", 512.0, [512], [1, 2, 3], [512, "1024"], True, [0, 64]])
def test_other_sizes_are_rejected(value):
    with pytest.raises(ValueError, match="input_size"):
        normalise_image_size(value)


def test_the_registry_takes_rectangles_for_semantic_families_only():
    entry = {"display": "X", "builder": "a:b", "published_num_classes": 3,
             "sizes": {"s": {"input_size": [64, 128], "params": 1, "params_source": "test"}}}
    assert validate_declaration({"name": "x", "task": "semantic", **entry}, "t").sizes["s"].input_size == (64, 128)
    for task in ("detect", "classify"):
        with pytest.raises(RegistryError, match="takes a square input_size"):
            validate_declaration({"name": "x", "task": task, **entry}, "t")


def test_imgsz_argument_takes_a_pair_and_survives_the_checkpoint():
    config = TrainConfig.build({"data": "shapes", "imgsz": [64, 128]})
    assert config.imgsz == (64, 128)
    assert TrainConfig.build(config.for_checkpoint()).imgsz == (64, 128)  # args.yaml / resume: a list again
    assert TrainConfig.build({"data": "shapes", "imgsz": (96, 96)}).imgsz == 96
    with pytest.raises(TrainConfigError, match="at least 16"):
        TrainConfig.build({"data": "shapes", "imgsz": (8, 64)})


def test_the_cli_reads_height_comma_width():
    parser = build_parser()
    for command in (["train", "m", "--data", "d"], ["val", "m", "--data", "d"], ["predict", "m", "image.png"]):
        assert parser.parse_args([*command, "--imgsz", "512,1024"]).imgsz == (512, 1024)
        assert parser.parse_args([*command, "--imgsz", "640"]).imgsz == 640
    with pytest.raises(SystemExit):
        parser.parse_args(["val", "m", "--data", "d", "--imgsz", "wide"])


def test_check_image_size_rounds_each_side_and_refuses_rectangles_for_square_tasks():
    assert check_image_size((512, 1024), 32, "semantic") == (512, 1024)
    with pytest.warns(UserWarning, match="not a multiple of 32"):
        assert check_image_size((500, 1000), 32, "semantic") == (512, 1024)
    with pytest.warns(UserWarning):
        assert check_image_size((60, 64), 32, "semantic") == 64  # rounded to a square: the int
    for task in ("detect", "classify", "restore"):
        with pytest.raises(ValueError, match="take a square input"):
            check_image_size((64, 128), 32, task)
        assert check_image_size((64, 64), 32, task) == 64


def test_metadata_keeps_a_rectangle_through_safetensors_and_checkpoints(tmp_path):
    meta = ModelMeta("ppliteseg", "t50", "semantic", 2, {0: "a", 1: "b"}, (512, 1024))
    assert json.loads(json.dumps(meta.to_dict()))["input_size"] == [512, 1024]
    assert ModelMeta.from_dict(json.loads(json.dumps(meta.to_dict())), "x").input_size == (512, 1024)
    _, read = read_weights(save_safetensors(tmp_path / "m.safetensors", {"w": torch.zeros(1)}, meta))
    assert read.input_size == (512, 1024)
    torch.save({"model": {"w": torch.zeros(1)}, "meta": meta.to_dict()}, tmp_path / "m.pt")
    assert read_weights(tmp_path / "m.pt")[1].input_size == (512, 1024)


# ------------------------------------------------------------------------------ the data pipeline
def test_a_letterbox_to_a_rectangle_fits_and_maps_back():
    torch.manual_seed(0)
    centred = SemanticTask.default_input_pipeline.merged({"placement": "centre"})
    image = torch.randint(0, 256, (3, 50, 50), dtype=torch.uint8)
    mask = torch.zeros(50, 50, dtype=torch.uint8)
    boxed, boxed_mask, ratio_pad = fit_to_input(image, (64, 128), centred, mask=mask, mask_fill=255)
    assert boxed.shape == (3, 64, 128) and ratio_pad == ((64 / 50, 64 / 50), (32.0, 0.0))
    assert (boxed_mask[:, :32] == 255).all() and (boxed_mask[:, 96:] == 255).all() and (boxed_mask[:, 32:96] == 0).all()
    restored = logits_to_original(boxed.float(), ratio_pad, (50, 50), centred)
    assert restored.shape == (3, 50, 50)


def test_the_semantic_dataset_and_example_batch_have_the_rectangle():
    task = get_task("semantic")
    spec = task.prepare(DATA)
    sample = task.dataset(spec, "train", (64, 96), None)[0]
    assert sample["image"].shape == (3, 64, 96) and sample["mask"].shape == (64, 96)
    assert (sample["mask"][:, 64:] == 255).all()  # 64x64 scenes at the top left of 64x96: 32 ignored columns
    batch = task.example_batch(2, (32, 64), 3)
    assert batch["images"].shape == (2, 3, 32, 64) and batch["masks"].shape == (2, 32, 64)


# ------------------------------------------------------------------------------ LibreYOLO: train, val, predict, save, export
def test_a_semantic_model_trains_validates_predicts_and_exports_at_a_rectangle(tmp_path):
    import libreyolo

    model = LibreYOLO("ppliteseg-t50")
    assert model.input_size == (512, 1024)  # the registry's
    result = model.train(data=DATA, epochs=1, batch=2, imgsz=(64, 96), device="cpu", workers=0, plots=False, verbose=False)
    assert model.input_size == (64, 96) and np.isfinite(result.metrics["mIoU"])
    assert read_weights(result.best)[1].input_size == (64, 96)
    assert LibreYOLO(result.best).input_size == (64, 96)

    seen: list[tuple[int, ...]] = []
    model.model.register_forward_pre_hook(lambda _, inputs: seen.append(tuple(inputs[0].shape[-2:])))
    metrics = model.val(data=DATA, batch=4, workers=0)  # at the model's input size
    assert seen and set(seen) == {(64, 96)} and 0 <= metrics["mIoU"] <= 1
    seen.clear()
    image = np.random.default_rng(0).integers(0, 256, (50, 120, 3), dtype=np.uint8)
    (whole,) = model.predict(image, save=True)
    assert seen == [(64, 96)] and whole.mask.shape == (50, 120) and whole.save_path.is_file()

    safetensors = model.save(tmp_path / "rect.safetensors")
    assert LibreYOLO(safetensors).input_size == (64, 96)
    exported = model.export(path=tmp_path / "rect.libreyolo.pt")
    checkpoint = torch.load(exported, map_location="cpu", weights_only=True)
    assert (checkpoint["imgsz"], checkpoint["imgsz_h"], checkpoint["imgsz_w"]) == (96, 64, 96)  # LibreYOLO's rectangle
    assert LibreYOLO(exported).input_size == (64, 96)  # and zoo reads the rectangle back
    reloaded = libreyolo.LibreYOLO(str(exported), device="cpu")  # LibreYOLO loads it and predicts the same
    images = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        torch.testing.assert_close(reloaded.model.eval()(images), model.model.eval()(normalised(images)), rtol=0, atol=1e-4)


def test_square_tasks_say_that_a_rectangle_is_for_semantic_models():
    model = LibreYOLO("yolo9-t")
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="'detect' models take a square input"):
        model.predict(image, imgsz=(64, 128))
    with pytest.raises(ValueError, match="'detect' models take a square input"):
        model.val(data="shapes:train=2,val=2,size=64,seed=1", imgsz=(64, 128), workers=0)
    with pytest.raises(ValueError, match="'detect' models take a square input"):
        model.train(data="shapes:train=2,val=2,size=64,seed=1", imgsz=(64, 128), epochs=1, batch=2, device="cpu", workers=0)
    with pytest.raises(ValueError, match="tile=True"):
        model.predict(image, tile=True)


# ------------------------------------------------------------------------------ sliding-window prediction
@pytest.mark.parametrize(("height", "width", "window"), [(70, 100, (32, 48)), (40, 150, (64, 64)), (96, 96, 32)])
def test_tiled_prediction_equals_whole_image_prediction_for_a_pointwise_model(height, width, window):
    torch.manual_seed(0)
    model = nn.Conv2d(3, 4, 1)  # each pixel's logits depend on that pixel only: windows cannot change them
    image = np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)
    names = {index: f"c{index}" for index in range(4)}
    (whole,) = predict(fake_libre(model, "semantic", names, 32), image, imgsz=(height, width))  # no resize: the image's own size
    (tiled,) = predict(fake_libre(model, "semantic", names, 32), image, imgsz=window, tile=True)
    assert tiled.mask.shape == (height, width) and torch.equal(tiled.mask, whole.mask)


def test_tiled_prediction_of_segformer_averages_overlapping_windows():
    torch.manual_seed(0)
    model = randomise_normalisation(build("segformer", "b0", 3)).eval()
    libre = fake_libre(model, "semantic", {0: "a", 1: "b", 2: "c"}, 64)
    image = np.random.default_rng(2).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    (whole,) = predict(libre, image, imgsz=64)
    (one_window,) = predict(libre, image, imgsz=64, tile=True)  # the window is the image: one pass
    assert torch.equal(one_window.mask, whole.mask)
    seen: list[tuple[int, ...]] = []
    model.register_forward_pre_hook(lambda _, inputs: seen.append(tuple(inputs[0].shape[-2:])))
    (tiled,) = predict(libre, np.zeros((100, 130, 3), dtype=np.uint8), imgsz=64, tile=True)
    assert tiled.mask.shape == (100, 130) and set(seen) == {(64, 64)} and len(seen) == 2 * 3  # stride 43: 2 rows, 3 columns


# ------------------------------------------------------------------------------ sharded validation of the two families
FAMILIES = {"segformer": "b0", "ppliteseg": "t50"}
SHARD_SIZE = (64, 96)


def _validate_shard(family: str, rank: int, world_size: int) -> dict[str, float]:
    task = get_task("semantic")
    spec = task.prepare(DATA)
    dataset = Subset(task.dataset(spec, "val", SHARD_SIZE, None), range(5))
    torch.manual_seed(3)
    model = randomise_normalisation(build(family, FAMILIES[family], len(spec.names)), seed=3).eval()
    loader = DataLoader(dataset, batch_size=2, sampler=InferenceShardSampler(len(dataset), rank, world_size), collate_fn=task.collate)
    return task.validate(model, loader, torch.device("cpu"), spec.names)


def _rank_main(rank: int, world_size: int, port: int, output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        results = {family: _validate_shard(family, rank, world_size) for family in FAMILIES}
        Path(output, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def test_sharded_validation_of_both_families_at_a_rectangle_on_two_processes_equals_one_process(tmp_path: Path):
    single = {family: _validate_shard(family, 0, 1) for family in FAMILIES}
    assert all(0 < metrics["mIoU"] < 1 for metrics in single.values()), single  # informative numbers
    checks.run_on_two_processes(_rank_main, tmp_path, deadline_s=240, what="validation")
    checks.assert_every_rank_wrote(tmp_path, single)
