"""``track()`` and ``zoo track``: per-frame results with ``boxes.id``, IDs that persist or reset, masks that follow
their box, and annotated videos.

A lookup detector (``tests/doubles.py``) answers each frame of a generated ``shapes`` video with its ground-truth
boxes, so what is measured here is the glue between ``predict``, the tracker and the results; the trackers
themselves are measured in ``tests/test_tracking.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.doubles import LookupDetector, LookupInstanceSegmenter, fake_libre, image_key
from tests.support import varied_class_scores
from zoo_core import LibreYOLO
from zoo_core.cli import main
from zoo_core.data.shapes_video import shapes_video
from zoo_core.errors import ArgumentError, TrackerConfigError
from zoo_core.tracking.metrics import tracking_metrics
from zoo_core.tracking.video_tracking import track

SIDE = 96
NAMES = {0: "circle", 1: "square", 2: "triangle", 3: "cross"}


@pytest.fixture(scope="module")
def video():
    return shapes_video("crossing", frames=24, size=SIDE, seed=0)


def _key(frame: np.ndarray) -> int:
    # A frame of the input size is letterboxed unchanged, so the model sees it scaled to [0, 1].
    return image_key(torch.from_numpy(frame).permute(2, 0, 1).float() / 255)


def _frame_masks(boxes: np.ndarray) -> torch.Tensor:
    """One mask per object: its box filled, so a mask says which ground-truth object it belongs to."""
    masks = torch.zeros(len(boxes), SIDE, SIDE, dtype=torch.bool)
    for index, (x1, y1, x2, y2) in enumerate(boxes.astype(int)):
        masks[index, y1:y2, x1:x2] = True
    return masks


@pytest.fixture(scope="module")
def detector(video):
    table = {_key(frame): {"boxes": torch.as_tensor(boxes, dtype=torch.float32), "scores": torch.full((len(boxes),), 0.9),
                           "labels": torch.as_tensor(classes)}
             for frame, boxes, classes in zip(video.frames, video.boxes, video.classes)}
    return fake_libre(LookupDetector(table), "detect", NAMES, SIDE)


def _scores(results, video) -> dict[str, float]:
    ids = [result.boxes.id.numpy() for result in results]
    boxes = [result.boxes.xyxy.numpy().astype(np.float64) for result in results]
    return tracking_metrics(video.ids[:len(results)], video.boxes[:len(results)], ids, boxes)


def test_track_gives_every_frame_boxes_with_ids_that_hold_through_crossings(detector, video):
    results = track(detector, list(video.frames), verbose=False)
    assert len(results) == len(video)
    assert all(result.boxes.is_track and result.boxes.id.dtype == torch.long for result in results)
    assert all(len(result.boxes.id) == len(result.boxes) == len(result.trails) for result in results)
    metrics = _scores(results, video)
    assert metrics["IDF1"] >= 0.95 and metrics["MOTA"] >= 0.9, metrics
    last = results[-1]
    assert last.to_dict()["ids"] == last.boxes.id.tolist() and [row["id"] for row in last.rows()] == last.boxes.id.tolist()
    # A track's trail ends at its box's centre.
    centres = last.boxes.xywh[:, :2]
    assert torch.allclose(last.trails[:, -1], centres, atol=1e-3)


def test_persist_continues_the_ids_of_the_previous_call_and_its_absence_starts_again(detector, video):
    half = len(video) // 2
    frames = list(video.frames)
    first = track(detector, frames[:half], verbose=False)
    continued = first + track(detector, frames[half:], persist=True, verbose=False)
    assert _scores(continued, video)["IDF1"] >= 0.95
    # One frame per call, as a camera loop does it, tracks the same as the whole list at once.
    one_by_one = track(detector, frames[0], verbose=False) + [track(detector, frame, persist=True, verbose=False)[0]
                                                              for frame in frames[1:]]
    whole = track(detector, frames, verbose=False)
    assert [result.boxes.id.tolist() for result in one_by_one] == [result.boxes.id.tolist() for result in whole]

    # A continued track carries its trail over the call boundary; a new tracker's tracks start with their first centre.
    carried = continued[half]
    assert (~torch.isnan(carried.trails[:, :, 0])).sum(dim=1).min() > 1
    restarted = track(detector, frames[half:], verbose=False)
    assert restarted[0].trails.shape[1] == 1 and sorted(restarted[0].boxes.id.tolist()) == list(range(1, len(restarted[0].boxes) + 1))
    assert restarted[1].trails.shape[1] == 2


def test_another_tracker_setting_starts_a_new_tracker_even_with_persist(detector, video):
    frames = list(video.frames)
    track(detector, frames[:6], verbose=False)
    botsort = track(detector, frames[6:8], tracker="botsort", persist=True, verbose=False)
    assert min(botsort[0].boxes.id.tolist()) == 1


def test_masks_follow_their_box_id(video):
    table = {_key(frame): {"boxes": torch.as_tensor(boxes, dtype=torch.float32), "scores": torch.full((len(boxes),), 0.9),
                           "labels": torch.as_tensor(classes), "masks": _frame_masks(boxes)}
             for frame, boxes, classes in zip(video.frames, video.boxes, video.classes)}
    segmenter = fake_libre(LookupInstanceSegmenter(table, num_classes=4), "segment", NAMES, SIDE)
    results = track(segmenter, list(video.frames), verbose=False)
    identity: dict[int, int] = {}  # ground-truth ID -> track ID
    checked = 0
    for result, truth_ids, truth_boxes in zip(results, video.ids, video.boxes):
        truth_masks = _frame_masks(truth_boxes)
        for mask, track_id in zip(result.masks.data, result.boxes.id.tolist()):
            owner = [int(truth_ids[index]) for index in range(len(truth_ids)) if torch.equal(mask, truth_masks[index])]
            assert len(owner) == 1, "a tracked mask is none of the frame's objects"
            assert identity.setdefault(owner[0], track_id) == track_id, "a mask moved to another object's track"
            checked += 1
    assert checked > len(video) * 2


def test_save_writes_one_annotated_video_and_predict_does_too(tmp_path, video):
    clip = video.write(tmp_path / "clip.mp4")
    model = LibreYOLO("yolo9-t", num_classes=4)
    model.input_size = 64
    results = model.track(clip, save=True, project=tmp_path / "runs", verbose=False)
    written = tmp_path / "runs" / "detect" / "track" / "clip.mp4"
    assert results[-1].save_path == written and written.is_file()
    import av

    with av.open(str(written)) as container:
        assert sum(1 for _ in container.decode(video=0)) == len(video)
    predicted = model.predict(clip, save=True, project=tmp_path / "runs", verbose=False)
    assert predicted[0].save_path == tmp_path / "runs" / "detect" / "predict" / "clip.mp4" and predicted[0].boxes.id is None
    assert not list(tmp_path.rglob("*.partial.mp4"))


def test_a_stream_stopped_early_still_leaves_a_whole_video(tmp_path, video):
    clip = video.write(tmp_path / "clip.mp4")
    model = LibreYOLO("yolo9-t", num_classes=4)
    model.input_size = 64
    stream = model.track(clip, stream=True, save=True, project=tmp_path / "runs", verbose=False)
    next(stream), next(stream)
    stream.close()
    import av

    with av.open(str(tmp_path / "runs" / "detect" / "track" / "clip.mp4")) as container:
        assert sum(1 for _ in container.decode(video=0)) == 2


def test_the_cli_tracks_a_video_and_says_where_it_went(tmp_path, video, capsys, monkeypatch):
    clip = video.write(tmp_path / "clip.mp4")
    monkeypatch.chdir(tmp_path)
    assert main(["track", "yolo9-t", str(clip), "tracker=botsort", "save=true", "imgsz=64"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("clip_0000") == len(video) and "tracked results written to runs/detect/track/clip.mp4" in printed


def test_bad_tracker_arguments_and_untrackable_tasks_are_named(detector, video):
    model = LibreYOLO("yolo9-t", num_classes=4)
    with pytest.raises(ArgumentError, match="Did you mean 'tracker'"):
        model.track(video.frames[0], trackr="botsort")
    with pytest.raises(TrackerConfigError, match="tracker='nope': no such tracker"):
        model.track(video.frames[0], tracker="nope")
    with pytest.raises(ArgumentError, match="persist=1"):
        track(detector, video.frames[0], persist=1)
    classifier = fake_libre(torch.nn.Identity(), "classify", NAMES, SIDE)
    with pytest.raises(ArgumentError, match="'classify' models do not find boxes"):
        track(classifier, video.frames[0])


@pytest.mark.timeout(300)
def test_a_detector_trained_on_two_ranks_tracks_as_its_one_process_twin(tmp_path, video):
    settings = dict(data="shapes:train=8,val=4,size=96", epochs=1, batch=8, imgsz=96, workers=0, nbs=8, optimizer="SGD",
                    lr0=0.01, momentum=0.9, warmup_epochs=0, ema=False, augment=False, val=False, sync_bn=True,
                    verbose=False, plots=False, project=str(tmp_path / "runs"))
    torch.manual_seed(0)
    start = LibreYOLO("yolo9-t", num_classes=4)
    varied_class_scores(start.model)  # so the barely trained detector's boxes pass the tracker's thresholds
    initial = start.save(tmp_path / "initial.safetensors")
    one_process, two_ranks = LibreYOLO(initial), LibreYOLO(initial)
    one_process.train(device="cpu", name="single", **settings)
    two_ranks.train(device="cpu,cpu", name="ddp", **settings)
    frames = list(video.frames[:8])
    single = one_process.track(frames, max_det=20, verbose=False)
    ddp = two_ranks.track(frames, max_det=20, verbose=False)
    assert sum(len(result.boxes) for result in single) > 0, "no tracks: the comparison would be vacuous"
    for first, second in zip(single, ddp):
        assert first.boxes.id.tolist() == second.boxes.id.tolist()
        # Close, not equal: the detection loss divides by each rank's own sum of soft targets, one process by the batch's.
        assert torch.allclose(first.boxes.xyxy, second.boxes.xyxy, atol=0.05)
        assert torch.allclose(first.scores, second.scores, atol=5e-3)
