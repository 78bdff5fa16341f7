"""RTMDet-Ins (plugins/zoo_rtmdet/instance.py): LibreYOLO 1.6 parity of keys, outputs and postprocess (both ways),
mmdetection's layout, the published parameter counts, the dice mask loss, and export with the four mask outputs.

LibreYOLO 1.6 builds RTMDet-Ins (``LibreRTMDetModel(enable_mask_head=True)``) but cannot train it; zoo's loss
is checked here on hand-built batches, and learning on ``shapes`` by the segment task's learning test.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from zoo_core.building import count_parameters
from zoo_core.facade import LibreYOLO
from zoo_core.loading import load_weights_file
from zoo_core.ops.boxes import ImagePlacement
from zoo_core.plugin_manager import get_plugin_manager
from zoo_rtmdet.convert import convert_instance, from_libreyolo_instance, to_libreyolo_instance
from zoo_rtmdet.instance import DynamicKernelLayout, dynamic_mask_logits

from . import family_checks as checks

_one_thread = pytest.fixture(autouse=True)(checks.one_torch_thread)
pytestmark = pytest.mark.timeout(600)

SIZES = ["t", "s", "m", "l", "x"]
# LibreYOLO 1.6.0 LibreRTMDetModel(size, nc=80, enable_mask_head=True): sum of its parameters.
LIBREYOLO_PARAMS = {"t": 5_638_187, "s": 10_183_311, "m": 27_575_111, "l": 57_365_663, "x": 102_703_767}
# mmdetection configs/rtmdet/README.md, instance segmentation, Params(M).
README_PARAMS = {"t": 5.6e6, "s": 10.18e6, "m": 27.58e6, "l": 57.37e6, "x": 102.7e6}
BGR_MEAN = torch.tensor([103.53, 116.28, 123.675]).view(1, 3, 1, 1)
BGR_STD = torch.tensor([57.375, 57.12, 58.395]).view(1, 3, 1, 1)

randomise_batch_norms = partial(checks.randomise_batch_norms, "wide", seed=1)


def _build(size: str = "t", num_classes: int = 3) -> torch.nn.Module:
    return checks.build_family("rtmdet_ins", size, num_classes)


@pytest.mark.parametrize("size", SIZES)
def test_parameter_counts_are_libreyolos_and_the_published_ones(size: str):
    with torch.device("meta"):
        model = _build(size, 80)
    params = count_parameters(model)
    assert params == LIBREYOLO_PARAMS[size]
    assert abs(params - README_PARAMS[size]) / README_PARAMS[size] <= 0.007  # RTMDet-Ins-tiny's 5.6M is rounded


def _libreyolo_model(num_classes: int = 3, seed: int = 0, class_gain: float = 100.0):
    """LibreYOLO's RTMDet-Ins-t at random init, made to predict non-trivially (spread scores, boxes of some strides,
    masks with edges). A smaller ``class_gain`` keeps scores off 0 and 1, where ties would order NMS arbitrarily."""
    from libreyolo.models.rtmdet.nn import LibreRTMDetModel

    torch.manual_seed(seed)
    model = LibreRTMDetModel(size="t", nc=num_classes, enable_mask_head=True).eval()
    randomise_batch_norms(model)
    with torch.no_grad():
        for conv in model.head.rtm_reg:
            conv.weight.mul_(30)
        for conv in model.head.rtm_cls:
            conv.weight.mul_(class_gain)
            conv.bias.zero_()
        generator = torch.Generator().manual_seed(2)
        for conv in model.head.rtm_kernel:  # dynamic kernels whose masks cover part of the image, not none or all
            conv.weight.mul_(30)
            conv.bias.copy_(torch.randn(conv.bias.shape, generator=generator) * 0.5)
        model.head.mask_head.projection.weight.mul_(30)
    return model


def _flat(maps) -> torch.Tensor:
    return torch.cat([level.flatten(2) for level in maps], 2).transpose(1, 2)


def _libreyolo_raw(model, images: torch.Tensor):
    """LibreYOLO's four head outputs for RGB images in [0, 1] (its BGR normalisation)."""
    with torch.no_grad():
        return model(((images * 255).flip(1) - BGR_MEAN) / BGR_STD)


def _assert_same_tensors(outputs, raw) -> None:
    class_maps, distance_maps, kernel_maps, mask_features = raw
    torch.testing.assert_close(outputs["scores"], _flat(class_maps).sigmoid(), atol=1e-4, rtol=0)
    torch.testing.assert_close(outputs["box_distances"], _flat(distance_maps), atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(outputs["mask_coefficients"], _flat(kernel_maps), atol=1e-4, rtol=1e-6)
    torch.testing.assert_close(outputs["mask_features"], mask_features, atol=1e-4, rtol=0)


def test_libreyolo_weights_give_libreyolos_outputs_and_convert_back_bit_for_bit():
    reference = _libreyolo_model()
    model = _build().eval()
    model.load_state_dict(from_libreyolo_instance(reference.state_dict()), strict=True)
    checks.assert_state_dicts_equal(to_libreyolo_instance("t", model.state_dict()), reference.state_dict())
    images = torch.rand(2, 3, 96, 128, generator=torch.Generator().manual_seed(5))
    raw = _libreyolo_raw(reference, images)
    with torch.no_grad():
        outputs = model(images)
    assert _flat(raw[1]).max() > 30 and _flat(raw[0]).sigmoid().std() > 0.1 and raw[3].std() > 0.2  # not trivial
    _assert_same_tensors(outputs, raw)


def test_dynamic_kernels_give_libreyolos_mask_logits():
    from libreyolo.postprocess.rtmdet import _decode_masks

    generator = torch.Generator().manual_seed(3)
    layout = DynamicKernelLayout()
    assert layout.size == 169
    features = torch.randn(8, 12, 16, generator=generator)
    kernels = torch.randn(5, layout.size, generator=generator)
    points = torch.rand(5, 2, generator=generator) * 100
    strides = torch.tensor([8.0, 8.0, 16.0, 32.0, 16.0])
    expected = _decode_masks(features, kernels, torch.cat((points, strides[:, None].expand(-1, 2)), dim=1))
    ours = dynamic_mask_logits(features.expand(5, -1, -1, -1), kernels, points, strides, layout, 8.0)
    assert expected.std() > 0.5
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=1e-5)


def _match(expected: dict, ours: dict) -> list[tuple[int, int]]:
    """Pairs (LibreYOLO index, zoo index) of the same detection: same class, score within 1e-5, box within 1e-3 px.

    Candidates of one score (to float precision) can leave NMS in either order, so the lists are matched, not
    zipped; when the 100-instance cap was reached, the detections tied with the last kept score are not compared.
    """
    pairs, taken = [], set()
    scores = expected["scores"]
    cutoff = float(scores.min()) + 1e-5 if len(scores) == 100 else -1.0
    for index in range(len(expected["boxes"])):
        if float(scores[index]) <= cutoff:
            continue
        close = ((ours["labels"] == expected["classes"][index]) & ((ours["scores"] - expected["scores"][index]).abs() < 1e-5)
                 & ((ours["boxes"] - expected["boxes"][index]).abs().amax(dim=1) < 1e-3))
        candidates = [int(found) for found in close.nonzero().flatten() if int(found) not in taken]
        assert candidates, f"LibreYOLO's detection {index} has no counterpart in zoo's"
        taken.add(candidates[0])
        pairs.append((index, candidates[0]))
    return pairs


@pytest.mark.parametrize(("original", "conf"), [((150, 200), 0.5), ((300, 170), 0.3)], ids=["landscape", "portrait"])
def test_postprocess_is_libreyolos_boxes_scores_classes_and_masks(original, conf):
    from libreyolo.postprocess.rtmdet import postprocess as libreyolo_postprocess

    reference = _libreyolo_model(class_gain=20.0)
    model = _build().eval()
    model.load_state_dict(from_libreyolo_instance(reference.state_dict()), strict=True)
    side = 128
    images = torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(7))
    raw = _libreyolo_raw(reference, images)
    height, width = original
    ratio = min(side / width, side / height)
    with torch.no_grad():
        outputs = model(images)
    ours = model.postprocess(outputs, conf, 0.6, 300, placements=[ImagePlacement(((ratio, ratio), (0.0, 0.0)), original)] * 2)
    in_input = model.postprocess(outputs, conf, 0.6, 300)
    compared = 0
    for image in range(2):
        expected = libreyolo_postprocess(tuple(tuple(level[image : image + 1] for level in part) for part in raw[:3]) + (raw[3][image : image + 1],),
                                         conf_thres=conf, iou_thres=0.6, input_size=side, original_size=(width, height),
                                         ratio=ratio, max_det=300)
        assert expected["num_detections"] == len(ours[image]["boxes"]) > 5
        assert ours[image]["masks"].shape[1:] == original and in_input[image]["masks"].shape[1:] == (side, side)
        for libre, zoo in _match(expected, ours[image]):
            agreement = (expected["masks"][libre] == ours[image]["masks"][zoo]).float().mean()
            assert agreement >= 0.999, f"mask {libre}: {agreement:.4f} of the pixels agree"
            coverage = expected["masks"][libre].float().mean()
            compared += int(0.05 < coverage < 0.95)
    assert compared > 5  # masks with some foreground were compared


def test_libreyolo_loads_what_zoo_writes_and_zoo_reads_what_libreyolo_writes(tmp_path):
    from libreyolo.models.rtmdet.model import LibreRTMDet

    torch.manual_seed(1)
    model = _build().eval()
    randomise_batch_norms(model)
    path = checks.write_libreyolo_checkpoint(tmp_path / "LibreRTMDett-seg.pt", "rtmdet", "t",
                                             to_libreyolo_instance("t", model.state_dict()), task="segment")
    loaded = LibreRTMDet(str(path), size="t", nb_classes=3, device="cpu", task="segment")
    images = torch.rand(1, 3, 64, 96)
    with torch.no_grad():
        outputs = model(images)
    _assert_same_tensors(outputs, _libreyolo_raw(loaded.model.eval(), images))
    # LibreYOLO's own file of the model it loaded: zoo finds rtmdet_ins (LibreYOLO says rtmdet, task segment)
    loaded.save(str(tmp_path / "saved.pt"))
    found = load_weights_file(tmp_path / "saved.pt", get_plugin_manager())
    assert (found.family, found.size, found.num_classes) == ("rtmdet_ins", "t", 3)
    checks.assert_holds_the_weights_of(found.state_dict, model)
    # and a detector's file is still the detector's
    detector = checks.write_libreyolo_checkpoint(tmp_path / "LibreRTMDett.pt", "rtmdet", "t", {"head.rtm_cls.0.bias": torch.zeros(3)})
    assert _family_of(detector) == "rtmdet"


def _family_of(path) -> str:
    from zoo_core.loading import zoo_family_of_libreyolo
    from zoo_core.weight_formats import recognise

    found = recognise(path)
    return zoo_family_of_libreyolo(found.family, found.task, get_plugin_manager())


def test_mmdetection_layout_and_refused_layouts():
    reference = _libreyolo_model()
    state = reference.state_dict()
    upstream = {("bbox_head." + key[5:] if key.startswith("head.") else key): value for key, value in state.items()}
    upstream["data_preprocessor.mean"] = BGR_MEAN.flatten()
    checks.assert_state_dicts_equal(convert_instance("t", upstream, "upstream", "zoo"), from_libreyolo_instance(state))
    assert convert_instance("t", state, "upstream", "zoo") is None  # LibreYOLO's keys are no mmdetection layout
    assert convert_instance("t", state, "elsewhere", "zoo") is None
    detector_keys = {key: value for key, value in state.items() if "rtm_kernel" not in key and "mask_head" not in key}
    with pytest.raises(ValueError, match="load it as rtmdet"):
        from_libreyolo_instance(detector_keys)
    broken = dict(state)
    broken["head.reg_convs.1.0.bn.weight"] = broken["head.reg_convs.1.0.bn.weight"] + 1
    with pytest.raises(ValueError, match="cls_convs twin"):
        from_libreyolo_instance(broken)


def _instance_batch(side: int = 64) -> dict[str, torch.Tensor]:
    """``synthetic_batch`` with each rectangle's mask: an ellipse inside its box (so a mask is not just its box)."""
    batch = checks.synthetic_batch(side)
    ys, xs = torch.meshgrid(torch.arange(side) + 0.5, torch.arange(side) + 0.5, indexing="ij")
    masks = []
    for _, _, x1, y1, x2, y2 in batch["targets"].tolist():
        centre_x, centre_y, radius_x, radius_y = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
        masks.append((((xs - centre_x) / radius_x) ** 2 + ((ys - centre_y) / radius_y) ** 2 <= 1).to(torch.uint8))
    return {**batch, "masks": torch.stack(masks)}


def test_loss_has_three_terms_is_normalised_by_the_positives_and_reaches_every_parameter():
    torch.manual_seed(0)
    model = _build().train()
    batch = _instance_batch()
    loss, items = model.loss(model(batch["images"]), batch)
    assert set(items) == {"cls", "box", "mask"} and all(not value.requires_grad for value in items.values())
    assert loss.item() == pytest.approx(sum(value.item() for value in items.values()), rel=1e-6)
    assert 0.1 < items["mask"].item() <= 2.0  # dice of weight 2 lies in [0, 2]
    doubled = {
        "images": torch.cat((batch["images"], batch["images"])),
        "targets": torch.cat((batch["targets"], batch["targets"] + torch.tensor([2.0, 0, 0, 0, 0, 0]))),
        "masks": torch.cat((batch["masks"], batch["masks"])),
    }
    doubled_loss, doubled_items = model.loss(model(doubled["images"]), doubled)
    assert doubled_items["mask"].item() == pytest.approx(items["mask"].item(), rel=1e-4)
    assert doubled_loss.item() == pytest.approx(loss.item(), rel=1e-4)
    # target rows in another order (masks with them): the same loss
    order = torch.tensor([2, 0, 1])
    shuffled = {"images": batch["images"], "targets": batch["targets"][order], "masks": batch["masks"][order]}
    assert model.loss(model(shuffled["images"]), shuffled)[0].item() == pytest.approx(loss.item(), rel=1e-5)
    # a batch without instances still back-propagates into every parameter (DDP needs every gradient)
    empty = {"images": batch["images"], "targets": torch.zeros(0, 6), "masks": torch.zeros(0, 64, 64, dtype=torch.uint8)}
    for rows in (batch, empty):
        model.zero_grad(set_to_none=True)
        value, terms = model.loss(model(rows["images"]), rows)
        value.backward()
        assert torch.isfinite(value)
        assert [name for name, parameter in model.named_parameters() if parameter.grad is None] == []
    assert terms["mask"].item() == 0.0
    with pytest.raises(ValueError, match="needs 'masks'"):
        model.loss(model(batch["images"]), {"images": batch["images"], "targets": batch["targets"]})


def test_the_mask_loss_falls_as_the_masks_are_learnt():
    torch.manual_seed(0)
    model = _build().train()
    batch = _instance_batch()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    history = []
    for _ in range(12):
        loss, items = model.loss(model(batch["images"]), batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append((loss.item(), items["mask"].item()))
    assert all(math.isfinite(total) for total, _ in history)
    assert history[-1][0] < 0.8 * history[0][0] and history[-1][1] < history[0][1]


def test_postprocess_contract_and_bad_arguments():
    torch.manual_seed(0)
    model = _build().eval()
    with torch.no_grad():
        outputs = model(torch.rand(2, 3, 64, 96))
    assert outputs["mask_coefficients"].shape == (2, 8 * 12 + 4 * 6 + 2 * 3, 169)
    assert outputs["mask_features"].shape == (2, 8, 8, 12)
    results = model.postprocess(outputs, conf=0.0, iou=0.6, max_det=7)
    for result in results:
        assert len(result["boxes"]) == len(result["scores"]) == len(result["labels"]) == len(result["masks"]) == 7
        assert result["masks"].dtype == torch.bool and result["masks"].shape[1:] == (64, 96)
        assert result["labels"].dtype == torch.int64 and bool((result["scores"][:-1] >= result["scores"][1:]).all())
    # exported graphs carry no anchors: rebuilt from the mask features' size, the same detections
    exported = {key: outputs[key] for key in ("boxes", "scores", "mask_coefficients", "mask_features")}
    again = model.postprocess(exported, conf=0.0, iou=0.6, max_det=7)
    assert all(torch.equal(a["masks"], b["masks"]) for a, b in zip(results, again))
    assert all(len(result["boxes"]) == 0 for result in model.postprocess(outputs, conf=1.0, iou=0.6, max_det=7))
    with pytest.raises(ValueError, match="one per image"):
        model.postprocess(outputs, 0.1, 0.6, 7, placements=[ImagePlacement(((1.0, 1.0), (0.0, 0.0)), (64, 96))])
    with pytest.raises(ValueError, match="multiples of 32"):
        model(torch.rand(1, 3, 60, 64))


# torch.jit is deprecated upstream in favour of torch.export; it still ships, and users run it.
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_exports_the_four_mask_outputs_and_onnxruntime_agrees(tmp_path):
    import onnxruntime

    from zoo_core.export import export_graph, inference_form

    names = ("boxes", "scores", "mask_coefficients", "mask_features")
    torch.manual_seed(0)
    model = _build().eval()
    randomise_batch_norms(model)
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = inference_form(model)(images)
    expected = [reference[name].numpy() for name in names]
    onnx_path = export_graph(model, "onnx", tmp_path / "model.onnx", name="rtmdet_ins-t", task="segment", outputs=names,
                             input_size=64)
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    assert [output.name for output in session.get_outputs()] == list(names)
    for got, want in zip(session.run(None, {"images": images.numpy()}), expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    script_path = export_graph(model, "torchscript", tmp_path / "model.torchscript", name="rtmdet_ins-t", task="segment",
                               outputs=names, input_size=64)
    extra = {"zoo.json": ""}
    loaded = torch.jit.load(str(script_path), _extra_files=extra)
    assert json.loads(extra["zoo.json"])["task"] == "segment"
    with torch.no_grad():
        traced = loaded(images)
    assert len(traced) == 4
    for got, want in zip(traced, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)


def test_rtmdet_ins_t_overfits_a_fixed_sample_to_a_mask_map(tmp_path, learning):
    """RTMDet-Ins-t on 8 shapes scenes of 96 px through ``LibreYOLO.train`` (60 full-batch AdamW steps, no warm-up,
    no mosaic), validated on the same scenes with box and mask mAP; then it predicts masks at the image's size.

    Thresholds at most 80 % of the worst of seeds 0-2 on one and on two threads (docs/performance.md): the mask
    mAP50 ranged 0.571-0.929 over those six runs, so its claim is 0.45 (an untrained model scores about 0)."""
    model, metrics, images = checks.overfit_fixed_sample(
        tmp_path, "rtmdet_ins-t", "segment", images=8, size=96, batch=8, val_options={"plots": False},
        epochs=60, nbs=8, optimizer="AdamW", lr0=0.003, warmup_iters=0, mosaic=0.0, close_mosaic=0, seed=learning.seed)
    (result,) = model.predict(str(sorted(images.iterdir())[0]), conf=0.5)
    learning.expect(metrics, {"mask_mAP50": 0.45, "mAP50": 0.6},
                    checks={"masks": result.masks is not None and result.masks.data.shape[1:] == (96, 96)})


def test_rtmdet_ins_t_trains_on_two_spawned_cpu_ranks_and_its_sharded_metrics_are_one_process_s():
    """One epoch on two spawned CPU ranks (each validating its shard, the masks' RLE states gathered), then one
    process validates the weights the caller got back: the same box and mask mAP."""
    from zoo_core.data.shapes import shapes

    model, result = checks.train_on_two_spawned_cpu_ranks("rtmdet_ins-t", num_train=4, num_val=6, metric="mask_mAP50-95",
                                                           epochs=2, lr0=0.01, warmup_iters=0)
    checks.assert_caller_holds_rank_zeros_best(model, result)
    single = model.val(data=shapes(num_train=4, num_val=6, image_size=64, seed=1), batch=4, imgsz=64, workers=0, plots=False)
    print(f"two ranks: {result.metrics}\none process: {single}")
    for name in ("mAP50-95", "mAP50", "mask_mAP50-95", "mask_mAP50", "fitness"):
        assert single[name] == pytest.approx(result.metrics[name], abs=1e-6), name


def _validate_shard(weights: str, data: str, rank: int, world_size: int) -> dict[str, float]:
    from torch.utils.data import DataLoader

    from zoo_core.data.sampling import InferenceShardSampler
    from zoo_core.facade import LibreYOLO
    from zoo_core.tasks import get_task

    model = LibreYOLO(weights)
    task = get_task("segment")
    spec = task.prepare(data)
    dataset = task.dataset(spec, "val", 96, None)
    loader = DataLoader(dataset, batch_size=2, sampler=InferenceShardSampler(len(dataset), rank, world_size), collate_fn=task.collate)
    return task.validate(model.model.eval(), loader, torch.device("cpu"), spec.names)


def _validation_rank(rank: int, world_size: int, port: int, output: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        setting = json.loads((Path(output) / "setting.json").read_text())
        metrics = _validate_shard(setting["weights"], setting["data"], rank, world_size)
        (Path(output) / f"rank{rank}.json").write_text(json.dumps(metrics))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # about 45 s of CPU: the masks need a short training run to score above 0
def test_sharded_validation_on_two_processes_equals_one_process_with_masks(tmp_path):
    """RTMDet-Ins-t trained briefly on 5 scenes of 96 px (so that masks score above 0), validated on them by one
    process and by two (an odd count: unequal shards); box and mask mAP equal."""
    data = checks.sample_on_itself(tmp_path, "segment", images=5, size=96)
    model = LibreYOLO("rtmdet_ins-t", seed=0)
    model.train(data=str(data), epochs=40, batch=5, imgsz=96, nbs=5, optimizer="AdamW", lr0=0.003, warmup_iters=0, mosaic=0.0,
                close_mosaic=0, seed=0, **checks.OVERFIT)
    weights = model.save(tmp_path / "trained.safetensors")
    single = _validate_shard(str(weights), str(data), 0, 1)
    print(f"one process: {single}")
    assert single["mask_mAP50"] > 0.05 and single["mAP50"] > 0.05
    (tmp_path / "setting.json").write_text(json.dumps({"weights": str(weights), "data": str(data)}))
    checks.run_on_two_processes(_validation_rank, tmp_path, deadline_s=240, what="validation")
    checks.assert_every_rank_wrote(tmp_path, single)


def test_dice_loss_mask_centres_target_rows_and_the_assigners_centre_prior():
    from zoo_core.assigners.dynamic_soft_label import DynamicSoftLabelAssigner
    from zoo_core.losses.detection import pad_targets_per_image, target_rows_per_image
    from zoo_core.losses.dice import dice_loss
    from zoo_rtmdet.loss import mask_centres_of_mass

    target = torch.zeros(2, 8, 8)
    target[:, 2:6, 1:4] = 1
    assert dice_loss((target * 2 - 1) * 50, target).max() < 1e-4  # confident and right
    assert dice_loss((1 - target * 2) * 50, target).min() > 0.999  # confident and wrong
    logits = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(0))
    probabilities = logits.sigmoid().flatten(1)
    expected = 1 - 2 * (probabilities * target.flatten(1)).sum(1) / (probabilities.square().sum(1) + target.flatten(1).sum(1) + 2e-3)
    torch.testing.assert_close(dice_loss(logits, target), expected)

    masks = torch.zeros(2, 10, 12, dtype=torch.uint8)
    masks[0, 2:6, 4:10] = 1  # pixels 4..9 and 2..5: centre (6.5, 3.5)
    centres = mask_centres_of_mass(masks, torch.tensor([[4.0, 2.0, 10.0, 6.0], [0.0, 0.0, 4.0, 2.0]]))
    torch.testing.assert_close(centres, torch.tensor([[6.5, 3.5], [2.0, 1.0]]))  # the empty mask takes its box's centre

    targets = torch.tensor([[1, 0, 0, 0, 4, 4], [0, 1, 0, 0, 4, 4], [1, 2, 0, 0, 4, 4], [0, 0, 0, 0, 4, 4]], dtype=torch.float32)
    _, _, present = pad_targets_per_image(targets, 3)
    assert target_rows_per_image(targets, 3, present.shape[1]).tolist() == [[1, 3], [0, 2], [-1, -1]]

    generator = torch.Generator().manual_seed(4)
    points = torch.stack(torch.meshgrid(torch.arange(8.0) * 8, torch.arange(8.0) * 8, indexing="xy"), -1).reshape(-1, 2)
    strides = torch.full((64, 1), 8.0)
    logits = torch.randn(1, 64, 2, generator=generator)
    predicted = torch.cat((points - 12, points + 12), -1)[None]
    boxes = torch.tensor([[[4.0, 4.0, 60.0, 60.0]]])
    assigner = DynamicSoftLabelAssigner(2)
    default = assigner(logits, predicted, points, strides, torch.zeros(1, 1), boxes, torch.ones(1, 1, dtype=torch.bool))
    same = assigner(logits, predicted, points, strides, torch.zeros(1, 1), boxes, torch.ones(1, 1, dtype=torch.bool),
                    torch.tensor([[[32.0, 32.0]]]))
    corner = assigner(logits, predicted, points, strides, torch.zeros(1, 1), boxes, torch.ones(1, 1, dtype=torch.bool),
                      torch.tensor([[[8.0, 8.0]]]))
    assert torch.equal(default.foreground, same.foreground)
    chosen = points[corner.foreground[0]]
    assert chosen.mean(0).sum() < points[default.foreground[0]].mean(0).sum()  # the prior pulls towards the given centre
