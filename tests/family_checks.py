"""Checks that the family test files share: each family file calls them with its own parameters.

- ``randomise_batch_norms`` and ``synthetic_batch``: non-trivial inputs for the LibreYOLO-oracle checks;
- ``build_family``: one size of a family through the plugin manager;
- ``write_libreyolo_checkpoint`` and ``assert_holds_the_weights_of``: converted checkpoints as LibreYOLO's files;
- ``assert_state_dicts_equal``, ``assert_same_boxes_and_scores``, ``assert_loss_reaches_every_parameter`` and
  ``outputs_before_and_after_fuse``: LibreYOLO-oracle, loss and fusion checks;
- ``overfit_fixed_sample`` (on ``repeated_sample`` for fewer epochs) with ``detector_draws_its_predictions`` and
  ``assert_segmenter_draws_its_masks``: a family learns a fixed ``shapes`` sample through
  ``LibreYOLO.train`` (seeded by the test's ``learning.seed``, tests/learning.py), is scored on the same
  images by ``LibreYOLO.val`` and draws its predictions;
- ``train_on_two_spawned_cpu_ranks`` and ``assert_caller_holds_rank_zeros_best``: a short run on two
  spawned CPU ranks;
- ``run_on_two_processes`` and ``assert_every_rank_wrote``: a ``(rank, world_size, port, output)``
  function on two spawned processes, whose results each rank writes as ``rank{N}.json``;
- ``one_torch_thread``: an autouse fixture body for files that run on a shared 2-core machine.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as torch_multiprocessing
import yaml
from PIL import Image

from zoo_core.data.shapes import shapes
from zoo_core.engine.distributed import find_free_port
from zoo_core.engine.train_result import TrainResult
from zoo_core.facade import LibreYOLO
from zoo_core.plugin_manager import get_plugin_manager

from .test_family_learning import OVERFIT, sample_on_itself

# ------------------------------------------------------------------------------ oracle inputs
_Draw = Callable[[torch.Generator, int], torch.Tensor]
# per style: the running mean, running variance, weight and bias of a BatchNorm of ``count`` features
BATCH_NORM_STYLES: dict[str, tuple[_Draw, _Draw, _Draw, _Draw]] = {
    "narrow": (  # YOLOX, YOLOv7
        lambda generator, count: torch.randn(count, generator=generator) * 0.1,
        lambda generator, count: torch.rand(count, generator=generator) * 0.5 + 0.5,
        lambda generator, count: torch.rand(count, generator=generator) * 0.5 + 0.75,
        lambda generator, count: torch.randn(count, generator=generator) * 0.1,
    ),
    "wide": (  # RTMDet, YOLOv9-E2E
        lambda generator, count: torch.randn(count, generator=generator) * 0.1,
        lambda generator, count: torch.rand(count, generator=generator) + 0.5,
        lambda generator, count: torch.rand(count, generator=generator) + 0.5,
        lambda generator, count: torch.randn(count, generator=generator) * 0.1,
    ),
    "uniform": (  # PicoDet, YOLO-NAS, FOMO
        lambda generator, count: torch.rand(count, generator=generator) - 0.5,
        lambda generator, count: torch.rand(count, generator=generator) + 0.5,
        lambda generator, count: torch.rand(count, generator=generator) + 0.5,
        lambda generator, count: (torch.rand(count, generator=generator) - 0.5) * 0.4,
    ),
}


@torch.no_grad()
def randomise_batch_norms(style: str, model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-trivial BatchNorm statistics and affine terms drawn as ``style`` says, so parity checks see them."""
    generator = torch.Generator().manual_seed(seed)
    draw_mean, draw_var, draw_weight, draw_bias = BATCH_NORM_STYLES[style]
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            count = module.num_features
            module.running_mean.copy_(draw_mean(generator, count))
            module.running_var.copy_(draw_var(generator, count))
            module.weight.copy_(draw_weight(generator, count))
            module.bias.copy_(draw_bias(generator, count))
    return model


COLOURS = {0: (0.9, 0.1, 0.1), 1: (0.1, 0.8, 0.1), 2: (0.1, 0.2, 0.9)}
LAYOUTS = [  # per image: (class, x1, y1, x2, y2) in pixels of a 64×64 image
    [(0, 4, 6, 30, 28), (1, 34, 30, 60, 60)],
    [(2, 10, 8, 54, 40)],
]


def synthetic_batch(side: int = 64) -> dict[str, torch.Tensor]:
    """Two images of coloured rectangles on grey, and their M×6 pixel targets."""
    images = torch.full((len(LAYOUTS), 3, side, side), 0.5)
    targets = []
    for index, layout in enumerate(LAYOUTS):
        for label, x1, y1, x2, y2 in layout:
            images[index, :, y1:y2, x1:x2] = torch.tensor(COLOURS[label])[:, None, None]
            targets.append([index, label, x1, y1, x2, y2])
    return {"images": images, "targets": torch.tensor(targets, dtype=torch.float32)}


def build_family(family: str, size: str, num_classes: int, **options: Any) -> torch.nn.Module:
    """One size of ``family`` with ``num_classes`` classes and build ``options``, from the plugin manager."""
    return get_plugin_manager().build_model(family, size, num_classes, options)


def write_libreyolo_checkpoint(path: Path, family: str, size: str, state_dict: Mapping[str, torch.Tensor],
                               num_classes: int = 3, task: str = "detect") -> Path:
    """A LibreYOLO 1.6 checkpoint file of ``size`` of ``family`` holding ``state_dict`` (LibreYOLO's keys), as
    LibreYOLO writes it: its metadata (``task`` in LibreYOLO's words), classes named ``a``, ``b``, ... and input size 640."""
    checkpoint = {
        "model": state_dict,
        "schema_version": "1.0",
        "libreyolo_version": "1.6.0",
        "model_family": family,
        "size": size,
        "task": task,
        "nc": num_classes,
        "names": {index: chr(ord("a") + index) for index in range(num_classes)},
        "imgsz": 640,
    }
    torch.save(checkpoint, path)
    return path


def assert_holds_the_weights_of(state_dict: Mapping[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Every tensor of ``model``'s state dict equals the one of the same key in ``state_dict``."""
    assert all(torch.equal(state_dict[key], value) for key, value in model.state_dict().items())


def assert_state_dicts_equal(state_dict: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> None:
    """The same keys in the same order and, key for key, the same tensors bit for bit."""
    assert state_dict.keys() == expected.keys()
    assert all(torch.equal(state_dict[key], expected[key]) for key in expected)


def assert_same_boxes_and_scores(outputs: Mapping[str, torch.Tensor], boxes: torch.Tensor, scores: torch.Tensor, *,
                                 least_box: float) -> float:
    """zoo's decoded ``outputs`` equal an oracle's ``boxes`` and ``scores`` to 1e-4; the comparison is not trivial (a
    box coordinate beyond ``least_box``, scores that spread). Returns the largest box difference."""
    assert boxes.abs().max() > least_box and scores.std() > 0.1
    torch.testing.assert_close(outputs["scores"], scores, atol=1e-4, rtol=0)
    torch.testing.assert_close(outputs["boxes"], boxes, atol=1e-4, rtol=0)
    return (outputs["boxes"] - boxes).abs().max().item()


def assert_loss_reaches_every_parameter(model: torch.nn.Module, images: torch.Tensor, targets: Iterable[torch.Tensor],
                                        terms: set[str]) -> None:
    """For each M×6 ``targets`` (an empty one too): a finite loss of the named ``terms`` whose gradient reaches
    every parameter."""
    for rows in targets:
        model.zero_grad(set_to_none=True)
        loss, items = model.loss(model(images), {"images": images, "targets": rows})
        assert torch.isfinite(loss) and set(items) == terms
        loss.backward()
        assert [name for name, parameter in model.named_parameters() if parameter.grad is None] == []


def outputs_before_and_after_fuse(model: torch.nn.Module, images: torch.Tensor) -> tuple[Any, Any]:
    """``model``'s outputs on ``images`` before and after ``model.fuse()``; asserts the fused model has no BatchNorm."""
    with torch.no_grad():
        before = model(images)
        model.fuse()
        after = model(images)
    assert not any(isinstance(module, torch.nn.BatchNorm2d) for module in model.modules())
    return before, after


def one_torch_thread() -> Iterator[None]:
    """Two OpenMP threads on a shared 2-core machine spin-wait for each other: one is faster and steadier.

    The body of an autouse fixture: ``_one_thread = pytest.fixture(autouse=True)(one_torch_thread)``.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


# ------------------------------------------------------------------------------ it learns a fixed sample
def overfit_fixed_sample(
    tmp_path: Path,
    name: str,
    task: str,
    *,
    images: int,
    size: int,
    batch: int,
    val_batch: int | None = None,
    val_options: Mapping[str, Any] | None = None,
    num_classes: int | None = None,
    options: Mapping[str, Any] | None = None,
    prepare: Callable[[LibreYOLO], None] | None = None,
    repeats: int = 1,
    seed: int = 0,
    **train: Any,
) -> tuple[LibreYOLO, dict[str, float], Path]:
    """Trains ``name`` through ``LibreYOLO.train`` on ``images`` shapes scenes of ``size`` px and validates
    on the same scenes; returns the model, its metrics and the folder of the training images.

    The model is built with ``LibreYOLO(name, seed=seed)`` (with ``num_classes`` and build ``options``), then
    ``prepare`` may change it before training; the run trains with ``seed=seed`` (sampler, augmentation, a
    re-drawn class head); ``train`` holds the run's own settings (epochs, optimizer, ...), to which the shared
    ``OVERFIT`` settings are added. ``repeats``: each epoch shows every scene that
    many times (``repeated_sample``), for fewer epochs and so fewer checkpoint writes.
    """
    data = sample_on_itself(tmp_path, task, images=images, size=size)
    train_data = repeated_sample(data, repeats, tmp_path / "repeated") if repeats > 1 else data
    model = LibreYOLO(name, num_classes=num_classes, options=options, seed=seed)
    if prepare is not None:
        prepare(model)
    model.train(data=str(train_data), batch=batch, imgsz=size, seed=seed, **train, **OVERFIT)
    metrics = model.val(data=str(data), batch=batch if val_batch is None else val_batch, imgsz=size, workers=0,
                        **(val_options or {}))
    print(f"{name} on its {images} training scenes: {metrics}")
    return model, metrics, Path(yaml.safe_load(data.read_text())["path"]) / "images" / "train"


def repeated_sample(data: Path, times: int, folder: Path) -> Path:
    """A dataset YAML whose training split holds each image of ``data``'s ``times`` times (linked, renamed),
    with its label file (detection) or mask (semantic segmentation).

    Several optimizer steps per epoch instead of one: the engine writes a checkpoint every epoch,
    which would otherwise cost more than the steps of a tiny model.
    """
    import shutil
    from pathlib import Path

    import yaml

    content = yaml.safe_load(Path(data).read_text())
    source = Path(content["path"])
    companions = [kind for kind in ("labels", "masks") if (source / kind / "train").is_dir()]
    for kind in ("images", *companions):
        (folder / kind / "train").mkdir(parents=True, exist_ok=True)
    for image in sorted((source / "images/train").iterdir()):
        for copy in range(times):
            (folder / "images/train" / f"{copy}_{image.name}").symlink_to(image)
            for kind in companions:
                (companion,) = (source / kind / "train").glob(f"{image.stem}.*")
                shutil.copyfile(companion, folder / kind / "train" / f"{copy}_{companion.name}")
    path = folder / "repeated.yaml"
    path.write_text(yaml.safe_dump({**content, "path": str(folder)}))
    return path


def true_classes(image: Path) -> set[int]:
    """The classes of the boxes in a shapes image's label file."""
    labels = Path(str(image).replace("images", "labels")).with_suffix(".txt")
    return {int(line.split()[0]) for line in labels.read_text().splitlines()}


def detector_draws_its_predictions(model: LibreYOLO, images: Path, *, conf: float, size: int,
                                   all_true: bool = True) -> bool:
    """Whether ``predict(save=True)`` on the first training image finds its classes and saves a ``size``² drawing.

    ``all_true``: there are predictions and every predicted class is in the image; otherwise at least one is.
    """
    first = images / "000000.png"
    (result,) = model.predict(str(first), save=True, conf=conf)
    truth, found = true_classes(first), set(result.labels.tolist())
    print(f"drawn at conf {conf}: classes {sorted(found)} (scores {[round(v, 2) for v in result.scores.tolist()]}), "
          f"true classes {sorted(truth)}")
    classes_hold = (len(found) > 0 and found <= truth) if all_true else bool(found & truth)
    return classes_hold and Image.open(result.save_path).size == (size, size)


def assert_segmenter_draws_its_masks(model: LibreYOLO, image: Path, size: int) -> None:
    """``predict(save=True)`` gives a ``size``² mask and saves an RGB drawing of the image with its class overlay."""
    import numpy as np

    (result,) = model.predict(str(image), save=True)
    assert result.mask.shape == (size, size)
    with Image.open(result.save_path) as drawn, Image.open(image) as original:
        assert drawn.size == (size, size) and drawn.mode == "RGB"
        assert (np.asarray(drawn) != np.asarray(original.convert("RGB"))).any()  # the class overlay is drawn


# ------------------------------------------------------------------------------ it trains on two spawned ranks
def train_on_two_spawned_cpu_ranks(name: str, *, num_train: int, num_val: int, metric: str, epochs: int = 1,
                                   imgsz: int | tuple[int, int] = 64, **train: Any) -> tuple[LibreYOLO, TrainResult]:
    """``epochs`` epochs of ``name`` at batch 4 on two spawned CPU ranks over a 64 px shapes set; asserts the run
    used both ranks, completed every epoch and returned a finite ``metric``."""
    model = LibreYOLO(name)
    result = model.train(data=shapes(num_train=num_train, num_val=num_val, image_size=64, seed=1), device="cpu,cpu",
                         epochs=epochs, batch=4, imgsz=imgsz, workers=0, plots=False, verbose=False, **train)
    assert result.world_size == 2 and result.epochs_completed == epochs
    assert math.isfinite(result.metrics[metric])
    return model, result


def assert_caller_holds_rank_zeros_best(model: LibreYOLO, result: TrainResult) -> None:
    """After a multi-rank run the caller's model holds the weights of rank 0's best checkpoint: in full precision,
    which the final best.pt holds rounded to float16."""
    best = torch.load(result.best, map_location="cpu", weights_only=True)["model"]
    assert all(torch.equal(value.to(best[key].dtype), best[key]) for key, value in model.model.state_dict().items())


# ------------------------------------------------------------------------------ it runs on two processes
def run_on_two_processes(rank_main: Callable[[int, int, int, str], None], output: Path, *, deadline_s: int,
                         what: str) -> None:
    """Runs ``rank_main(rank, 2, port, output)`` on two spawned processes; fails the test past ``deadline_s``."""
    context = torch_multiprocessing.start_processes(
        rank_main, args=(2, find_free_port(), str(output)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + deadline_s
    try:
        while not context.join(timeout=5):
            if time.monotonic() > deadline:
                pytest.fail(f"the two {what} processes did not finish in {deadline_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=10)


def assert_every_rank_wrote(output: Path, expected: Any) -> None:
    """Each of the two ranks wrote ``expected`` to ``output / rank{N}.json``."""
    for rank in range(2):
        assert json.loads((output / f"rank{rank}.json").read_text()) == expected, f"rank {rank}"
