"""Image reading, predict sources, the inference shard sampler and the problem reporter."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from zoo_core.data.errors import MAX_REPORTED_PROBLEMS, DatasetError, DatasetWarning, ProblemReport
from zoo_core.data.images import inspect_image, load_sources, read_image
from zoo_core.data.sampling import InferenceShardSampler


def test_sources_of_every_kind_become_rgb_uint8_tensors(tmp_path: Path):
    array = np.random.default_rng(0).integers(0, 255, (12, 20, 3), dtype=np.uint8)
    Image.fromarray(array).save(tmp_path / "a.png")
    Image.fromarray(array).save(tmp_path / "b.png")
    (tmp_path / "notes.txt").write_text("not an image")
    sources = load_sources([tmp_path / "a.png", str(tmp_path), Image.fromarray(array), array, array[:, :, 0], torch.from_numpy(array).permute(2, 0, 1)])
    assert [source.name for source in sources] == ["a.png", "a.png", "b.png", "image2", "image3", "image4", "image5"]
    for source in sources[:5] + sources[6:]:
        assert source.image.dtype == torch.uint8 and torch.equal(source.image, torch.from_numpy(array).permute(2, 0, 1))
    assert torch.equal(sources[5].image[1], torch.from_numpy(array[:, :, 0]))  # grey -> three equal channels
    assert sources[0].path == tmp_path / "a.png" and sources[3].path is None
    assert len(load_sources(str(tmp_path / "*.png"))) == 2


def test_bad_sources_say_what_is_accepted(tmp_path: Path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_sources(tmp_path / "missing.jpg")
    with pytest.raises(DatasetError, match="no images"):
        load_sources(tmp_path)
    with pytest.raises(ValueError, match="uint8"):
        load_sources(np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(TypeError, match="unsupported predict source float"):
        load_sources(3.5)  # an int is a camera index (tests/test_predict_sources.py)


def test_exif_orientation_is_applied_when_reading_and_inspecting(tmp_path: Path):
    image = Image.fromarray(np.zeros((10, 30, 3), dtype=np.uint8))
    exif = image.getexif()
    exif[0x0112] = 6  # rotate 90°: displayed 10 wide, 30 high
    image.save(tmp_path / "rotated.jpg", exif=exif.tobytes())
    assert inspect_image(tmp_path / "rotated.jpg") == (30, 10)
    assert read_image(tmp_path / "rotated.jpg").shape == (3, 30, 10)
    with pytest.raises(DatasetError, match="cannot decode image"):
        (tmp_path / "bad.png").write_bytes(b"garbage")
        read_image(tmp_path / "bad.png")


@pytest.mark.parametrize(("count", "world"), [(5, 2), (7, 3), (1, 2), (0, 2), (4, 1)])
def test_inference_shards_cover_every_sample_once_without_padding(count: int, world: int):
    shards = [list(InferenceShardSampler(count, rank, world)) for rank in range(world)]
    assert sorted(index for shard in shards for index in shard) == list(range(count))
    assert shards[0] == list(range(0, count, world))
    assert [len(InferenceShardSampler(count, rank, world)) for rank in range(world)] == [len(shard) for shard in shards]
    with pytest.raises(ValueError, match="rank must be in"):
        InferenceShardSampler(count, world, world)


def test_problem_report_warns_each_problem_then_summarises():
    report = ProblemReport("demo split")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for line in range(MAX_REPORTED_PROBLEMS + 5):
            report.add("labels/a.txt", "bad line", line=line + 1)
        report.finish()
    messages = [str(w.message) for w in caught if issubclass(w.category, DatasetWarning)]
    assert len(messages) == MAX_REPORTED_PROBLEMS + 1
    assert messages[0] == "labels/a.txt:1: bad line"
    assert messages[-1].startswith("demo split: 5 more problems not shown")


def test_problems_are_reported_on_rank_zero_only(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RANK", "1")
    report = ProblemReport("demo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report.add("x.png", "unreadable")
    assert report.count == 1 and not caught
