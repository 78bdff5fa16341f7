"""The yolo9 family: the published architectures (exact parameter counts and FLOPs of the inference
graphs, and of the PGI training graphs), the model contract, loss normalisation, and a small
learning run that must find the boxes it was shown."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from torchvision.ops import box_iou

from zoo_core.building import count_parameters
from zoo_core.losses.detection import YOLO_NOMINAL_BATCH_SIZE
from zoo_core.naming import resolve_model_name
from zoo_core.nn.gelan import RepConvN, fuse_for_inference
from zoo_core.plugin_manager import get_plugin_manager

# The official code keeps DFL's 16 fixed bin values as a (frozen) conv weight; zoo computes the
# expectation with an arange, so a zoo count is 16 lower per detection head.
DFL_FIXED_WEIGHTS = 16

# YOLOv9 README (MS COCO table): Param. and FLOPs of the converted (inference) models at 640.
# For S and C the official code's own summaries of the fused models are public and exact.
PUBLISHED_INFERENCE = {
    "t": {"params_millions": 2.0, "gflops": 7.7, "exact": None},
    "s": {"params_millions": 7.1, "gflops": 26.4, "exact": 7_105_888},  # "gelan-s summary: ... 7105888 parameters"
    "m": {"params_millions": 20.0, "gflops": 76.3, "exact": None},
    "c": {"params_millions": 25.3, "gflops": 102.1, "exact": 25_288_768},  # yolov9-c-converted.pt summary
}


def _build(size: str, num_classes: int = 3, **options: object) -> torch.nn.Module:
    return get_plugin_manager().build_model("yolo9", size, num_classes, options)


@pytest.mark.parametrize("size", ["t", "s", "m", "c"])
def test_fused_inference_graph_has_the_published_parameters_and_flops(size: str):
    published = PUBLISHED_INFERENCE[size]
    with torch.device("meta"):
        model = _build(size, 80).fuse()
        with FlopCounterMode(display=False) as counter:
            model(torch.empty(1, 3, 640, 640))
    params = count_parameters(model) + DFL_FIXED_WEIGHTS
    assert round(params / 1e6, 1) == published["params_millions"]
    if published["exact"] is not None:
        assert params == published["exact"]
    assert round(counter.get_total_flops() / 1e9, 1) == published["gflops"]
    assert not any(isinstance(module, torch.nn.BatchNorm2d) for module in model.modules())
    assert all(module.fused is not None for module in model.modules() if isinstance(module, RepConvN))


def test_pgi_training_graphs_match_the_official_dual_models():
    # Public training logs of the official code: "yolov9-c summary: 962 layers, 51004210 parameters"
    # (3 classes, unfused) and "yolov9-s summary: 658 layers, 9598022 parameters" (1 class, fused),
    # each with two DFL modules.
    with torch.device("meta"):
        yolov9_c = _build("c", 3, pgi=True)
        yolov9_s = fuse_for_inference(_build("s", 1, pgi=True))
    assert count_parameters(yolov9_c) + 2 * DFL_FIXED_WEIGHTS == 51_004_210
    assert count_parameters(yolov9_s) + 2 * DFL_FIXED_WEIGHTS == 9_598_022


@pytest.mark.parametrize("size", ["t", "m"])  # the auxiliary neck (T/S) and the reversible backbone (M/C)
def test_pgi_branch_trains_with_weight_one_quarter_and_drops_to_the_inference_model(size: str):
    torch.manual_seed(0)
    model = _build(size, pgi=True)
    images = torch.rand(2, 3, 64, 64)
    batch = {"images": images, "targets": torch.tensor([[0, 1, 8, 8, 40, 40], [1, 2, 4, 20, 60, 52.0]])}
    outputs = model(images)
    assert set(outputs["auxiliary"]) == {"box_logits", "class_logits", "anchor_points", "anchor_strides"}
    loss, items = model.loss(outputs, batch)
    main = model.criterion(outputs, batch["targets"], 2)
    auxiliary = model.criterion(outputs["auxiliary"], batch["targets"], 2)
    expected = (
        (main.box + 0.25 * auxiliary.box) * 7.5 + (main.cls + 0.25 * auxiliary.cls) * 0.5 + (main.dfl + 0.25 * auxiliary.dfl) * 1.5
    )
    assert loss.item() == pytest.approx(expected.item() * YOLO_NOMINAL_BATCH_SIZE, rel=1e-5)
    loss.backward()
    assert all(parameter.grad is not None for parameter in model.parameters())  # the auxiliary branch learns too
    model.eval()
    assert "auxiliary" not in model(images)  # inference never runs the auxiliary branch
    model.drop_auxiliary_branch()
    assert not model.has_auxiliary_branch
    assert model.state_dict().keys() == _build(size).state_dict().keys()


def test_fuse_computes_the_same_detections():
    torch.manual_seed(0)
    model = _build("t")
    for module in model.modules():  # non-trivial statistics, so folding BatchNorms is exercised
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
            torch.nn.init.uniform_(module.weight, 0.5, 1.5)
            torch.nn.init.uniform_(module.bias, -0.2, 0.2)
    images = torch.rand(2, 3, 64, 96)
    model.eval()
    with torch.no_grad():
        before = model(images)
        after = model.fuse()(images)
    assert torch.allclose(before["boxes"], after["boxes"], atol=1e-3)
    assert torch.allclose(before["scores"], after["scores"], atol=1e-5)


@pytest.mark.parametrize("spelling", ["yolo9-t", "YOLO9t", "LibreYOLO9t.pt", "yolov9-t"])
def test_names_resolve_to_yolo9_t(spelling: str):
    assert resolve_model_name(spelling, get_plugin_manager().families) == ("yolo9", "t")


def test_bad_options_inputs_and_configs_are_reported():
    with pytest.raises(ValueError, match="accepted options: pgi"):
        _build("t", pgi_weight=0.5)
    with pytest.raises(ValueError, match="pgi must be True or False"):
        _build("t", pgi="yes")
    with pytest.raises(ValueError, match="multiples of 32"):
        _build("t")(torch.rand(1, 3, 64, 80))
    from zoo_yolo9.model import GELANSpec

    config = dict(get_plugin_manager().family("yolo9").sizes["t"].config)
    with pytest.raises(ValueError, match="'downsample' must be one of aconv, adown"):
        GELANSpec.from_config({**config, "downsample": "maxpool"})
    with pytest.raises(ValueError, match="missing keys \\['spp'\\]"):
        GELANSpec.from_config({key: value for key, value in config.items() if key != "spp"})


def test_loss_does_not_scale_with_the_batch_and_reaches_every_parameter():
    torch.manual_seed(0)
    model = _build("t")
    images = torch.rand(2, 3, 64, 64)
    # Large boxes, which the fresh head's wide boxes overlap well: the batch's soft-target sum
    # (the normaliser) is then above 1, where YOLO's loss clamps it (loss_tal.py, kept as is).
    targets = torch.tensor([[0, 0, 0, 0, 64, 64], [1, 2, 0, 0, 64, 64], [0, 1, 0, 0, 32, 32], [1, 1, 32, 32, 64, 64.0]])
    loss, items = model.loss(model(images), {"images": images, "targets": targets})
    # the same two images twice: identical BatchNorm statistics, twice the positives and targets
    doubled_targets = torch.cat((targets, targets + torch.tensor([2.0, 0, 0, 0, 0, 0])))
    doubled_images = torch.cat((images, images))
    doubled, _ = model.loss(model(doubled_images), {"images": doubled_images, "targets": doubled_targets})
    assert doubled.item() == pytest.approx(loss.item(), rel=1e-4)
    assert loss.item() == pytest.approx(sum(value.item() for value in items.values()) * YOLO_NOMINAL_BATCH_SIZE, rel=1e-5)
    assert all(not value.requires_grad for value in items.values())
    # a batch without any box still back-propagates into every parameter (DDP needs every gradient)
    empty, empty_items = model.loss(model(images), {"images": images, "targets": torch.zeros(0, 6)})
    model.zero_grad()
    empty.backward()
    assert empty_items["box"].item() == 0.0 and empty.item() > 0
    assert all(parameter.grad is not None for parameter in model.parameters())


def test_builds_are_deterministic_under_a_seed_and_pickle():
    torch.manual_seed(3)
    first = _build("t")
    torch.manual_seed(3)
    second = _build("t")
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    restored = pickle.loads(pickle.dumps(first)).eval()
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        assert torch.equal(first.eval()(images)["scores"], restored(images)["scores"])


COLOURS = {0: (0.9, 0.1, 0.1), 1: (0.1, 0.8, 0.1), 2: (0.1, 0.2, 0.9)}
LAYOUTS = [  # per image: (class, x1, y1, x2, y2) in pixels of a 96×96 image
    [(0, 8, 8, 40, 36), (1, 48, 40, 88, 88)],
    [(2, 20, 10, 76, 50), (0, 4, 60, 30, 92)],
    [(1, 30, 30, 70, 70)],
    [(2, 6, 50, 46, 90), (1, 56, 6, 90, 40)],
]


def _synthetic_batch() -> dict[str, torch.Tensor]:
    images = torch.full((len(LAYOUTS), 3, 96, 96), 0.5)
    targets = []
    for index, layout in enumerate(LAYOUTS):
        for label, x1, y1, x2, y2 in layout:
            images[index, :, y1:y2, x1:x2] = torch.tensor(COLOURS[label])[:, None, None]
            targets.append([index, label, x1, y1, x2, y2])
    return {"images": images, "targets": torch.tensor(targets, dtype=torch.float32)}


def _set_batch_norm_statistics(model: torch.nn.Module, images: torch.Tensor) -> None:
    """Give every BatchNorm the exact (biased) statistics of ``images``, those training normalised with.

    80 steps are far too few for the running averages (momentum 0.03) to catch up with the
    weights, and a network overfit on 4 images of 96 px is sensitive enough that even PyTorch's
    unbiased running variance (36 values per channel at stride 32) changes its scores: with these
    statistics, eval mode computes exactly what train mode computed on the training images.
    """
    inputs: dict[torch.nn.Module, torch.Tensor] = {}
    hooks = [
        module.register_forward_hook(lambda module, args, output: inputs.__setitem__(module, args[0]))
        for module in model.modules()
        if isinstance(module, torch.nn.BatchNorm2d)
    ]
    with torch.no_grad():
        model(images)
        for module, features in inputs.items():
            module.running_mean.copy_(features.mean(dim=(0, 2, 3)))
            module.running_var.copy_(features.var(dim=(0, 2, 3), unbiased=False))
    for hook in hooks:
        hook.remove()


def test_yolo9_t_learns_and_finds_the_rectangles_it_was_shown(learning):
    torch.manual_seed(learning.seed)
    batch = _synthetic_batch()
    model = _build("t")
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.0)
    losses = []
    for _ in range(80):
        loss, _ = model.loss(model(batch["images"]), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    _set_batch_norm_statistics(model, batch["images"])
    model.eval()
    with torch.no_grad():
        detections = model.postprocess(model(batch["images"]), conf=0.25, iou=0.5, max_det=10)
    targets = batch["targets"]
    best_overlaps = []  # per true rectangle: the best IoU of a box of its class
    for index, found in enumerate(detections):
        truth = targets[targets[:, 0] == index]
        overlaps = box_iou(truth[:, 2:], found["boxes"])
        for row, label in enumerate(truth[:, 1].long()):
            same_class = found["labels"] == label
            best_overlaps.append(overlaps[row][same_class].max().item() if same_class.any() else 0.0)
    print(f"losses every 20 steps: {losses[::20]}; found {[len(found['boxes']) for found in detections]}")
    learning.expect({"loss_drop": losses[0] / losses[-1], "worst_overlap": min(best_overlaps)},
                    {"loss_drop": 1 / 0.15, "worst_overlap": 0.5})
