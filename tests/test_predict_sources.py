"""``predict`` reads videos frame by frame, and ``stream=True`` yields one result at a time."""

from __future__ import annotations

import itertools
import sys
import types

import numpy as np
import pytest

import zoo_core.data.images as images_module
from zoo_core import LibreYOLO
from zoo_core.cli import main
from zoo_core.data.errors import DatasetError

FRAMES = 6


def write_video(path, frames: int = FRAMES, side: int = 64):
    """A short MPEG-4 clip: a white square moving across a grey frame."""
    import av

    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=5)
        stream.width = stream.height = side
        stream.pix_fmt = "yuv420p"
        for index in range(frames):
            pixels = np.full((side, side, 3), 90, dtype=np.uint8)
            pixels[20:40, 4 + 6 * index:24 + 6 * index] = 255
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


@pytest.fixture(scope="module")
def detector():
    model = LibreYOLO("yolo9-t", num_classes=3)
    model.input_size = 64
    return model


def test_a_video_gives_one_result_per_frame_saved_as_one_annotated_video(detector, tmp_path):
    import av

    video = write_video(tmp_path / "clip.mp4")
    results = detector.predict(video, save=True, project=tmp_path / "runs")
    assert [result.name for result in results] == [f"clip_{index:06d}" for index in range(FRAMES)]
    assert all(result.orig_img.shape == (64, 64, 3) for result in results)
    saved = sorted(path.name for path in (tmp_path / "runs" / "detect" / "predict").iterdir())
    assert saved == ["clip.mp4"] and {result.save_path.name for result in results} == {"clip.mp4"}
    with av.open(str(tmp_path / "runs" / "detect" / "predict" / "clip.mp4")) as container:
        stream = container.streams.video[0]
        assert (stream.width, stream.height, float(stream.average_rate)) == (64, 64, 5.0)
        assert sum(1 for _ in container.decode(video=0)) == FRAMES


def test_stream_reads_and_predicts_only_what_is_consumed(detector, tmp_path, monkeypatch):
    video = write_video(tmp_path / "clip.mp4")
    decoded = []
    original = images_module.video_frames

    def counting_frames(path):
        for frame in original(path):
            decoded.append(frame.name)
            yield frame

    monkeypatch.setattr(images_module, "video_frames", counting_frames)
    stream = detector.predict(video, stream=True)
    assert isinstance(stream, types.GeneratorType) and decoded == []
    first_two = list(itertools.islice(stream, 2))
    assert [result.name for result in first_two] == ["clip_000000", "clip_000001"]
    assert len(decoded) == 2, "stream=True decoded frames nobody asked for"


def test_the_cli_streams_a_video_and_says_where_it_saved(detector, tmp_path, capsys, monkeypatch):
    video = write_video(tmp_path / "clip.mp4", frames=3)
    monkeypatch.chdir(tmp_path)
    assert main(["predict", "yolo9-t", str(video), "save=true", "imgsz=64"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("clip_00000") == 3 and "drawn results written to" in printed


def test_videos_without_pyav_and_broken_videos_are_named(tmp_path, monkeypatch):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video at all")
    with pytest.raises(DatasetError, match="broken.mp4: cannot open this video"):
        images_module.load_sources(broken)
    monkeypatch.setitem(sys.modules, "av", None)
    with pytest.raises(DatasetError, match="pip install av"):
        images_module.load_sources(broken)


def test_a_camera_index_opens_that_camera_or_says_which_it_could_not_open(tmp_path, monkeypatch):
    opened = []

    def fake_open(device, format=None, **_):
        opened.append((device, format))
        raise OSError("No such file or directory")

    import av

    monkeypatch.setattr(av, "open", fake_open)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.chdir(tmp_path)  # no file called "3" here
    for source in (3, "3"):
        with pytest.raises(DatasetError, match=r"webcam 3: cannot open camera /dev/video3 .*is it connected"):
            images_module.load_sources(source)
    assert opened == [("/dev/video3", "v4l2")] * 2
    monkeypatch.setattr(sys, "platform", "win32")
    with pytest.raises(DatasetError, match="on win32 record a video file"):
        images_module.load_sources(0)
