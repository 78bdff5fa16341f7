"""Writing videos: annotated frames to an H.264 ``.mp4`` with PyAV, whole or not at all.

``VideoWriter(path, fps)`` encodes into ``<stem>.partial.mp4`` beside ``path`` and renames it to ``path``
only when the block ends without an error, so a run that is killed or fails leaves nothing half-written
under the final name (the partial file of a failed block is removed; one left by a killed process is
plainly named as partial). ``video_rate(path)`` is a video file's frame rate.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from zoo_core.data.errors import DatasetError

__all__ = ["VideoWriter", "video_rate", "partial_path", "DEFAULT_FPS"]

#: The frame rate of a video made from images or an in-memory source (which have none of their own).
DEFAULT_FPS = 30.0


def _pyav() -> Any:
    try:
        import av
    except ImportError:
        raise DatasetError("writing videos needs PyAV; install it with `pip install av` (or zoo's `video` extra)") from None
    return av


def partial_path(path: Path) -> Path:
    """Where ``VideoWriter`` encodes ``path`` until it is complete: ``clip.mp4`` -> ``clip.partial.mp4``."""
    return path.with_name(f"{path.stem}.partial{path.suffix}")


def video_rate(path: Path, default: float = DEFAULT_FPS) -> float:
    """The frame rate of video file ``path`` (its stream's average rate), or ``default`` when it states none."""
    av = _pyav()
    try:
        with av.open(str(path)) as container:
            rate = container.streams.video[0].average_rate
    except (av.FFmpegError, OSError, IndexError):
        return default
    return float(rate) if rate else default


class VideoWriter:
    """Frames (``H×W×3`` uint8 RGB arrays, all of one size) into an ``.mp4`` at ``fps``; a context manager.

    H.264 (``libx264``) where PyAV's FFmpeg has it, else MPEG-4 Part 2. Odd frame sizes are padded by one
    pixel (the 4:2:0 colour planes need even sides).
    """

    def __init__(self, path: str | os.PathLike[str], fps: float = DEFAULT_FPS) -> None:
        self.path = Path(path)
        self.partial = partial_path(self.path)
        self.fps = float(fps) if fps and fps > 0 else DEFAULT_FPS
        self.frames = 0
        self._container: Any = None
        self._stream: Any = None
        self._size: tuple[int, int] | None = None

    def __enter__(self) -> "VideoWriter":
        av = _pyav()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._container = av.open(str(self.partial), mode="w", format="mp4")
        return self

    def _open_stream(self, height: int, width: int) -> None:
        av = _pyav()
        rate = Fraction(self.fps).limit_denominator(1001)
        try:
            av.codec.Codec("libx264", "w")
            codec = "libx264"
        except (av.FFmpegError, ValueError):
            codec = "mpeg4"
        self._stream = self._container.add_stream(codec, rate=rate)
        self._stream.width, self._stream.height = width + width % 2, height + height % 2
        self._stream.pix_fmt = "yuv420p"
        self._size = (height, width)

    def write(self, frame: np.ndarray) -> None:
        """Append one ``H×W×3`` uint8 RGB frame."""
        av = _pyav()
        frame = np.asarray(frame)
        if frame.ndim != 3 or frame.shape[2] != 3 or frame.dtype != np.uint8:
            raise ValueError(f"a video frame is an H×W×3 uint8 RGB array, got {frame.dtype} {frame.shape}")
        if self._stream is None:
            self._open_stream(frame.shape[0], frame.shape[1])
        if frame.shape[:2] != self._size:
            raise ValueError(f"frame {self.frames} of {self.path} is {frame.shape[1]}×{frame.shape[0]}, the video "
                             f"{self._size[1]}×{self._size[0]}; every frame of one video has one size")
        height, width = frame.shape[:2]
        if height % 2 or width % 2:
            frame = np.pad(frame, ((0, height % 2), (0, width % 2), (0, 0)), mode="edge")
        for packet in self._stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="rgb24")):
            self._container.mux(packet)
        self.frames += 1

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        try:
            if kind is None and self._stream is not None:
                for packet in self._stream.encode():  # flush the encoder's delayed frames
                    self._container.mux(packet)
        finally:
            self._container.close()
        if kind is None and self.frames:
            os.replace(self.partial, self.path)
        else:
            self.partial.unlink(missing_ok=True)
