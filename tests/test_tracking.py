"""Tracking: ByteTrack and BoT-SORT on generated ``shapes`` videos, the MOT metrics, tracker YAMLs and video files.

The trackers run on ground-truth boxes here (the facade and the command line are tested in
``tests/test_track_facade.py``); HOTA, MOTA and IDF1 are checked against ``trackeval`` 1.3.0.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from zoo_core.data.shapes_video import shapes_video
from zoo_core.errors import TrackerConfigError
from zoo_core.tracking.config import TrackerConfig, builtin_tracker_path, tracker_config
from zoo_core.tracking.matching import assign, box_iou
from zoo_core.tracking.metrics import tracking_metrics
from zoo_core.tracking.trackers import BoTSORT, ByteTracker, build_tracker


def run_tracker(tracker, video, score: float = 0.9):
    """Feed a tracker a video's ground-truth boxes; the per-frame IDs and boxes it returns."""
    ids, boxes = [], []
    for frame, frame_boxes, classes in zip(video.frames, video.boxes, video.classes):
        found = tracker.update(frame_boxes, np.full(len(frame_boxes), score), classes, frame)
        ids.append(found.ids)
        boxes.append(found.boxes)
    return ids, boxes


def scores_of(name: str, video, **overrides) -> dict[str, float]:
    ids, boxes = run_tracker(build_tracker(tracker_config(name, **overrides)), video)
    return tracking_metrics(video.ids, video.boxes, ids, boxes)


# --------------------------------------------------------------------------- the trackers
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bytetrack_keeps_idf1_above_095_on_generated_crossings(seed):
    video = shapes_video("crossing", seed=seed)
    boxes = np.concatenate(video.boxes)
    # The paths really cross: some pair of objects overlaps in some frame.
    assert any((box_iou(frame, frame) - np.eye(len(frame)) > 0.05).any() for frame in video.boxes), "no crossing rendered"
    assert len(boxes) > 100
    metrics = scores_of("bytetrack", video)
    assert metrics["IDF1"] >= 0.95 and metrics["MOTA"] >= 0.95, metrics


def _gaps(video) -> dict[int, int]:
    """The longest run of frames each object is hidden between two frames in which it shows."""
    longest: dict[int, int] = {}
    present = {int(i): [t for t, ids in enumerate(video.ids) if i in ids] for i in np.unique(np.concatenate(video.ids))}
    for identity, frames in present.items():
        steps = np.diff(frames) - 1
        longest[identity] = int(steps.max()) if len(steps) else 0
    return longest


def test_an_occlusion_shorter_than_the_track_buffer_keeps_the_id_and_a_longer_one_does_not():
    video = shapes_video("occlusion", seed=0)
    gaps = _gaps(video)
    assert all(gap >= 3 for gap in gaps.values()), f"every object must vanish behind the pillar for a while: {gaps}"
    assert max(gaps.values()) < 30
    kept = scores_of("bytetrack", video)
    assert kept["IDSW"] == 0 and kept["IDF1"] >= 0.95, kept
    # With a buffer shorter than the occlusions every object comes back under a new ID.
    forgotten = scores_of("bytetrack", video, track_buffer=1)
    assert forgotten["IDSW"] >= len(gaps) and forgotten["IDF1"] < 0.8, forgotten


def test_botsort_camera_motion_compensation_holds_ids_where_bytetrack_loses_them():
    video = shapes_video("shaking", seed=1)
    byte = scores_of("bytetrack", video)
    bot = scores_of("botsort", video)
    still = scores_of("botsort", video, gmc_method="none")
    assert bot["IDF1"] >= 0.95 and bot["IDSW"] <= 1, bot
    assert byte["IDF1"] < 0.8 and still["IDF1"] < 0.8, (byte, still)


@pytest.mark.parametrize("method", ["sparseOptFlow", "ecc"])
def test_camera_motion_is_measured_from_the_background(method):
    from zoo_core.tracking.motion import CameraMotion

    world = shapes_video("shaking", frames=2, size=160, seed=4).frames[0]
    motion = CameraMotion(method, downscale=2)
    assert np.allclose(motion.estimate(world[10:130, 10:130]), np.eye(2, 3))  # the first frame: nothing to compare
    # The camera moves 4 pixels right and 2 down: the picture's content moves 4 left and 2 up.
    affine = motion.estimate(world[12:132, 14:134])
    assert np.allclose(affine[:, :2], np.eye(2), atol=0.02), affine
    assert np.allclose(affine[:, 2], [-4, -2], atol=0.6), affine


def test_ids_start_at_one_continue_across_calls_and_reset_forgets_every_track():
    video = shapes_video("crossing", frames=12, seed=3)
    whole, _ = run_tracker(ByteTracker(tracker_config("bytetrack")), video)
    assert sorted(whole[0].tolist()) == list(range(1, len(video.ids[0]) + 1))
    tracker = ByteTracker(tracker_config("bytetrack"))
    halves = [*run_tracker(tracker, _frames(video, 0, 6))[0], *run_tracker(tracker, _frames(video, 6, 12))[0]]
    assert [ids.tolist() for ids in halves] == [ids.tolist() for ids in whole]
    tracker.reset()
    again, _ = run_tracker(tracker, _frames(video, 6, 12))
    assert sorted(again[0].tolist()) == list(range(1, len(video.ids[6]) + 1))


def _frames(video, start: int, stop: int):
    from zoo_core.data.shapes_video import ShapesVideo

    return ShapesVideo(video.scenario, video.frames[start:stop], video.ids[start:stop], video.boxes[start:stop],
                       video.classes[start:stop])


def test_low_score_boxes_continue_tracks_but_never_start_one():
    tracker = ByteTracker(tracker_config("bytetrack"))
    box = np.array([[10.0, 10.0, 40.0, 40.0]])
    other = box + 80
    assert tracker.update(box, [0.9], [0]).ids.tolist() == [1]  # the first frame's tracks show at once
    found = tracker.update(np.concatenate([box + 2, other]), [0.15, 0.15], [0, 0])
    assert found.ids.tolist() == [1], "the second association must take a low-score box and start nothing"
    assert len(tracker.update(box + 4, [0.05], [0])) == 0, "a box under track_low_thresh is ignored"
    assert len(tracker.update(np.concatenate([box + 6, other]), [0.9, 0.9], [0, 0])) == 1  # the new one: unconfirmed
    assert sorted(tracker.update(np.concatenate([box + 8, other]), [0.9, 0.9], [0, 0]).ids.tolist()) == [1, 2]


def test_detections_index_the_frames_boxes_so_masks_follow_their_ids():
    tracker = build_tracker(tracker_config("botsort"))
    boxes = np.array([[0, 0, 20, 20], [50, 50, 80, 80], [100, 0, 130, 30]], dtype=float)
    tracker.update(boxes, [0.9, 0.9, 0.9], [0, 1, 2], np.zeros((160, 160, 3), np.uint8))
    found = tracker.update(boxes[::-1] + 1, [0.8, 0.7, 0.6], [2, 1, 0], np.zeros((160, 160, 3), np.uint8))
    by_id = dict(zip(found.ids.tolist(), found.detections.tolist()))
    assert by_id == {1: 2, 2: 1, 3: 0}
    assert dict(zip(found.ids.tolist(), found.classes.tolist())) == {1: 0, 2: 1, 3: 2}
    assert isinstance(tracker, BoTSORT)


def test_assignment_leaves_pairs_over_the_limit_unmatched_even_when_that_matches_fewer():
    # Pricing the forbidden pairs out of a square problem would force one of them in; the extended
    # problem leaves row 0 unmatched instead and keeps the one allowed pair.
    cost = np.array([[0.9, 0.95], [0.1, 0.9]])
    matches, rows, columns = assign(cost, 0.8)
    assert matches.tolist() == [[1, 0]] and rows.tolist() == [0] and columns.tolist() == [1]
    matches, _, _ = assign(np.array([[0.3, 0.2], [0.2, 0.7]]), 0.8)
    assert sorted(map(tuple, matches.tolist())) == [(0, 1), (1, 0)]
    empty, rows, columns = assign(np.zeros((0, 3)), 0.8)
    assert empty.shape == (0, 2) and columns.tolist() == [0, 1, 2]


# --------------------------------------------------------------------------- the metrics
def _random_sequence(rng):
    frames, objects = int(rng.integers(5, 25)), int(rng.integers(1, 6))
    position, velocity = rng.uniform(0, 100, (objects, 2)), rng.normal(0, 3, (objects, 2))
    labels = np.arange(objects) + 10
    gt_ids, gt_boxes, ids, boxes = [], [], [], []
    for t in range(frames):
        visible = np.flatnonzero(rng.random(objects) > 0.15)
        corner = position[visible] + velocity[visible] * t
        truth = np.concatenate([corner, corner + 20], axis=1)
        gt_ids.append(visible + 1)
        gt_boxes.append(truth)
        found = rng.random(len(visible)) > 0.2
        if rng.random() < 0.1:
            labels = rng.permutation(labels)  # identity switches
        extra = int(rng.integers(0, 2))
        clutter = rng.uniform(0, 100, (extra, 2))
        ids.append(np.concatenate([labels[visible[found]], 100 + 10 * t + np.arange(extra)]))
        boxes.append(np.concatenate([truth[found] + rng.normal(0, 3, (int(found.sum()), 4)),
                                     np.concatenate([clutter, clutter + 15], axis=1)]))
    return gt_ids, gt_boxes, ids, boxes


def test_hota_mota_idf1_equal_trackeval_on_random_sequences():
    trackeval = pytest.importorskip("trackeval")
    from trackeval.metrics import CLEAR, HOTA, Identity

    from zoo_core.tracking.metrics import _dense_ids

    rng = np.random.default_rng(0)
    compared = 0
    for _ in range(12):
        gt_ids, gt_boxes, ids, boxes = _random_sequence(rng)
        ours = tracking_metrics(gt_ids, gt_boxes, ids, boxes)
        gt, found, num_gt, num_found = _dense_ids(gt_ids, ids)
        data = {"num_timesteps": len(gt), "num_gt_ids": num_gt, "num_tracker_ids": num_found,
                "num_gt_dets": sum(map(len, gt)), "num_tracker_dets": sum(map(len, found)), "gt_ids": gt,
                "tracker_ids": found, "similarity_scores": [box_iou(a, b) for a, b in zip(gt_boxes, boxes)]}
        reference: dict = {}
        with contextlib.redirect_stdout(io.StringIO()):  # trackeval prints its configuration
            for metric in (HOTA(), CLEAR(), Identity()):
                reference.update(metric.eval_sequence(data))
        for key in ("HOTA", "DetA", "AssA", "LocA", "MOTA", "MOTP", "IDSW", "IDF1", "IDP", "IDR"):
            assert ours[key] == pytest.approx(float(np.mean(reference[key])), abs=1e-9), key
        compared += 1
        assert 0 < ours["HOTA"] < 1
    assert compared == 12 and trackeval


def test_metrics_of_a_perfect_and_of_a_swapped_tracker():
    box = lambda x: np.array([[x, 0.0, x + 10, 10]])  # noqa: E731 - one box per frame
    truth_ids = [np.array([1, 2])] * 4
    truth = [np.concatenate([box(0), box(50)])] * 4
    perfect = tracking_metrics(truth_ids, truth, [np.array([7, 8])] * 4, truth)
    assert perfect["HOTA"] == pytest.approx(1) and perfect["MOTA"] == 1 and perfect["IDF1"] == 1
    swapped = tracking_metrics(truth_ids, truth, [np.array([7, 8])] * 2 + [np.array([8, 7])] * 2, truth)
    assert swapped["IDSW"] == 2 and swapped["MOTA"] == pytest.approx(1 - 2 / 8) and swapped["IDF1"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="appears twice"):
        tracking_metrics([np.array([1, 1])], [np.zeros((2, 4))], [np.zeros(0)], [np.zeros((0, 4))])


# --------------------------------------------------------------------------- tracker YAMLs
def test_builtin_tracker_yamls_hold_the_published_defaults_and_copies_load(tmp_path):
    byte = tracker_config("bytetrack.yaml")
    assert (byte.tracker_type, byte.track_high_thresh, byte.track_low_thresh, byte.new_track_thresh, byte.track_buffer,
            byte.match_thresh, byte.fuse_score) == ("bytetrack", 0.25, 0.1, 0.25, 30, 0.8, True)
    bot = tracker_config("botsort")
    assert bot.tracker_type == "botsort" and bot.gmc_method == "sparseOptFlow" and not bot.with_reid
    copy = tmp_path / "mine.yaml"
    copy.write_text(builtin_tracker_path("bytetrack").read_text().replace("track_buffer: 30", "track_buffer: 60"))
    assert tracker_config(copy).track_buffer == 60 and tracker_config(copy).max_time_lost == 60
    assert tracker_config({"tracker_type": "bytetrack", "frame_rate": 15}).max_time_lost == 15


@pytest.mark.parametrize("content, message", [
    ("tracker_type: bytetrack\ntrack_bufer: 10\n", "unknown tracker setting 'track_bufer'"),
    ("tracker_type: bytetrack\nmatch_thresh: 1.5\n", "match_thresh"),
    ("tracker_type: sort\n", "tracker_type"),
    ("tracker_type: botsort\nwith_reid: true\n", "re-identification"),
    ("tracker_type: bytetrack\ntrack_low_thresh: 0.5\ntrack_high_thresh: 0.3\n", "must not exceed"),
    ("- a list\n", "mapping"),
])
def test_a_bad_tracker_yaml_is_named_with_its_key(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(TrackerConfigError, match=message) as caught:
        tracker_config(path)
    assert "bad.yaml" in str(caught.value)


def test_an_unknown_tracker_name_lists_the_builtins():
    with pytest.raises(TrackerConfigError, match="'bytetrack' or 'botsort'"):
        tracker_config("deepsort")
    assert isinstance(tracker_config(TrackerConfig(tracker_type="botsort")), TrackerConfig)


# --------------------------------------------------------------------------- video files
def test_a_video_is_renamed_into_place_only_when_complete(tmp_path):
    import av

    from zoo_core.data.video import VideoWriter, partial_path, video_rate

    video = shapes_video("crossing", frames=5, size=64, seed=0)
    path = video.write(tmp_path / "clip.mp4", fps=12)
    assert path.is_file() and not partial_path(path).exists()
    with av.open(str(path)) as container:
        decoded = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(decoded) == 5 and decoded[0].shape == (64, 64, 3)
    assert np.abs(decoded[2].astype(int) - video.frames[2]).mean() < 12  # lossy, but the same picture
    assert video_rate(path) == pytest.approx(12)

    target = tmp_path / "broken.mp4"
    with pytest.raises(RuntimeError, match="stopped"), VideoWriter(target) as writer:
        writer.write(video.frames[0])
        assert not target.exists()
        raise RuntimeError("stopped half-way")
    assert not target.exists() and not partial_path(target).exists()


def test_odd_sized_frames_are_padded_and_a_size_change_is_refused(tmp_path):
    from zoo_core.data.video import VideoWriter

    with pytest.raises(ValueError, match="one size"), VideoWriter(tmp_path / "odd.mp4") as writer:
        writer.write(np.zeros((33, 47, 3), np.uint8))
        writer.write(np.zeros((32, 32, 3), np.uint8))
    with VideoWriter(tmp_path / "odd.mp4") as writer:
        writer.write(np.zeros((33, 47, 3), np.uint8))
    assert (tmp_path / "odd.mp4").stat().st_size > 0
