"""Finding, checking and reading images, and turning a ``predict`` source into images.

Images travel as uint8 tensors ``3×H×W`` (RGB, EXIF orientation applied) from the dataset to the
collate function; ``Task.preprocess`` converts them to floats on the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from zoo_core.data.errors import DatasetError, ImageDecodeError, ProblemReport

if TYPE_CHECKING:
    import torch

__all__ = [
    "IMAGE_SUFFIXES",
    "VIDEO_SUFFIXES",
    "SourceImage",
    "is_image_file",
    "images_in_directory",
    "images_from_entry",
    "inspect_image",
    "usable_images",
    "refuse_shared_annotations",
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_PIXELS_VARIABLE",
    "max_image_pixels",
    "read_image",
    "iter_sources",
    "load_sources",
    "video_frames",
    "webcam_frames",
]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
# Videos ``predict`` reads frame by frame with PyAV (``pip install av``, the ``video`` extra).
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v")
# Images above this many pixels are skipped when a dataset is indexed, with a DatasetWarning naming the file
# (64 MP: 8000×8000; a 61 MP camera's 9504×6336 still passes). One such image decodes to 192 MB of RGB, and
# the augmentation pipeline holds several copies, so a 10000×10000 scan costs gigabytes per loader worker
# for a picture that trains at a few hundred pixels. ZOO_MAX_IMAGE_PIXELS overrides it (0: no zoo limit;
# PIL's own decompression-bomb check, PIL.Image.MAX_IMAGE_PIXELS, still applies).
MAX_IMAGE_PIXELS = 64_000_000
MAX_IMAGE_PIXELS_VARIABLE = "ZOO_MAX_IMAGE_PIXELS"
_EXIF_ORIENTATION_TAG = 0x0112
_TRANSPOSING_ORIENTATIONS = (5, 6, 7, 8)


def is_image_file(path: Path) -> bool:
    """Whether ``path`` has one of ``IMAGE_SUFFIXES`` (case-insensitive) and is not hidden."""
    return path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def images_in_directory(directory: Path, recursive: bool = True) -> list[Path]:
    """The image files under ``directory`` (sorted, hidden files and folders skipped)."""
    candidates = directory.rglob("*") if recursive else directory.iterdir()
    found = []
    for path in candidates:
        relative = path.relative_to(directory)
        if any(part.startswith(".") for part in relative.parts):
            continue
        if path.is_file() and is_image_file(path):
            found.append(path)
    return sorted(found)


def images_from_entry(entry: Path, report: ProblemReport) -> list[Path]:
    """Images named by one split entry: a folder (searched recursively), a ``.txt`` list, or one image.

    In a list file, each non-empty line is an image path; relative paths are relative to the
    list file's folder (``./images/a.jpg`` style). Missing listed files are reported with the
    list file and line and skipped.
    """
    if entry.is_dir():
        return images_in_directory(entry)
    if entry.is_file() and entry.suffix.lower() == ".txt":
        images = []
        try:
            lines = entry.read_text(encoding="utf-8-sig").splitlines()  # -sig: a byte-order mark is not a path
        except UnicodeDecodeError as error:
            raise DatasetError(f"{entry}: the image list is not UTF-8 text (byte 0x{error.object[error.start]:02X} at "
                               f"offset {error.start}); re-save it as UTF-8") from None
        for number, text in enumerate(lines, start=1):
            text = text.strip()
            if not text or text.startswith("#"):
                continue
            path = Path(text).expanduser()
            if not path.is_absolute():
                path = entry.parent / path
            if not path.is_file():
                report.add(entry, f"listed image {text!r} does not exist", line=number)
            elif not is_image_file(path):
                report.add(entry, f"listed file {text!r} is not an image ({', '.join(IMAGE_SUFFIXES)})", line=number)
            else:
                images.append(path)
        return images
    if entry.is_file() and is_image_file(entry):
        return [entry]
    if entry.exists():
        raise DatasetError(f"{entry}: not an image folder, a .txt list of images, or an image file")
    raise DatasetError(f"{entry} does not exist; check the path (relative paths are relative to the dataset root)")


def max_image_pixels() -> int:
    """The pixel limit of dataset images: ``$ZOO_MAX_IMAGE_PIXELS``, else ``MAX_IMAGE_PIXELS`` (0: none).

    ``DatasetError`` names the variable when its value is not a whole number >= 0.
    """
    import os

    configured = os.environ.get(MAX_IMAGE_PIXELS_VARIABLE, "").strip().replace("_", "")
    if not configured:
        return MAX_IMAGE_PIXELS
    if not (configured.isascii() and configured.isdigit()):
        raise DatasetError(f"{MAX_IMAGE_PIXELS_VARIABLE}={os.environ[MAX_IMAGE_PIXELS_VARIABLE]!r} is not a number of "
                           f"pixels; give a whole number (default {MAX_IMAGE_PIXELS:_}), or 0 for no limit")
    return int(configured)


def _too_large(width: int, height: int, limit: int) -> str:
    return (f"{width}×{height} = {width * height:,} pixels is above zoo's limit of {limit:,} "
            f"({MAX_IMAGE_PIXELS_VARIABLE}); downscale the image, or raise the limit")


def inspect_image(path: Path, limit: int | None = None) -> tuple[int, int] | str:
    """``(height, width)`` as displayed (EXIF orientation applied), or the reason it cannot be used.

    Reads headers and checks integrity cheaply: PIL's ``verify()`` (PNG chunk checksums and
    structure) and, for JPEG, the end-of-image marker a truncated file lacks. An image of more
    than ``limit`` pixels (default ``max_image_pixels()``; 0: no limit) is refused from its header,
    before any pixel is decoded.
    """
    from PIL import Image

    limit = max_image_pixels() if limit is None else limit
    try:
        with Image.open(path) as image:
            width, height = image.size
            if limit and width * height > limit:
                return _too_large(width, height, limit)
            image.verify()  # must come straight after open; the file is reopened below
        with Image.open(path) as image:
            image_format = image.format
            width, height = image.size
            orientation = image.getexif().get(_EXIF_ORIENTATION_TAG, 1)
        if image_format == "JPEG":
            with open(path, "rb") as handle:
                handle.seek(-2, 2)
                if handle.read(2) != b"\xff\xd9":
                    return "truncated JPEG (no end-of-image marker)"
    except Image.DecompressionBombError as error:  # more than twice PIL's own limit: PIL refuses to open it
        return f"{error} (PIL's limit, PIL.Image.MAX_IMAGE_PIXELS, above zoo's {MAX_IMAGE_PIXELS_VARIABLE})"
    except Exception as error:  # PIL raises many types (OSError, SyntaxError, ValueError...) for bad files
        return f"unreadable image ({type(error).__name__}: {error})"
    if width < 1 or height < 1:
        return f"empty image ({width}×{height})"
    if orientation in _TRANSPOSING_ORIENTATIONS:
        width, height = height, width
    return height, width


def usable_images(paths: Iterable[Path], report: ProblemReport) -> list[tuple[Path, tuple[int, int]]]:
    """The images of ``paths`` that can be read, with their ``(height, width)``; the others are reported.

    Duplicates are dropped (first occurrence kept), and so is an image above the pixel limit
    (``max_image_pixels``), with a warning naming it. Headers are checked on a few threads: the
    work is file I/O and decoding in C, which releases the GIL.
    """
    import os
    import warnings
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    unique = list(dict.fromkeys(paths))
    limit = max_image_pixels()
    with warnings.catch_warnings(), ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        # PIL warns about a large image as it opens the header; the limit check reports it by name instead.
        # The filter is process-wide, so it is set here, around the pool, not in the threads.
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        outcomes = list(pool.map(lambda path: inspect_image(path, limit), unique, chunksize=64))
    usable = []
    for path, outcome in zip(unique, outcomes):
        if isinstance(outcome, str):
            report.add(path, f"{outcome}; skipped")
        else:
            usable.append((path, outcome))
    return usable


def refuse_shared_annotations(pairs: Iterable[tuple[Path, Path]], what: str, *, only_existing: bool = True) -> None:
    """``DatasetError`` naming two images whose annotation (``what``: a label file, a mask) would be one file.

    Annotations are found by replacing an image's suffix, so ``a.jpg`` and ``a.png`` in one folder
    share ``a.txt``; training both on it would give one picture the other's boxes. ``pairs`` are
    ``(image, annotation)``; with ``only_existing`` (label files, masks) a shared annotation that does
    not exist is no conflict (both are background images).
    """
    claimed: dict[Path, Path] = {}
    for image, annotation in pairs:
        first = claimed.setdefault(annotation, image)
        if first != image and (not only_existing or annotation.exists()):
            raise DatasetError(
                f"{first} and {image} would share one {what}, {annotation}, and zoo cannot tell which picture it "
                f"describes. Rename one image (e.g. {image.stem}_{image.suffix.lstrip('.').lower()}{image.suffix}) and its "
                f"{what}, or remove the duplicate"
            )


def read_image(path: str | Path) -> "torch.Tensor":
    """The image at ``path`` as a uint8 RGB tensor ``3×H×W`` (EXIF orientation applied).

    Decoded with PIL (torchvision's decoders are deprecated from 0.29 on). Raises
    ``ImageDecodeError`` (a ``DatasetError``) naming the file when it cannot be decoded.
    """
    import numpy as np
    import torch
    from PIL import Image, ImageOps

    path = Path(path)
    try:
        with Image.open(path) as pil_image:
            pil_image = ImageOps.exif_transpose(pil_image)
            if pil_image.mode in ("I;16", "I;16B", "I"):  # 16-bit: scale to 8 bits rather than clip
                pil_image = Image.fromarray((np.asarray(pil_image, dtype=np.float32) / 257.0).round().astype(np.uint8))
            array = np.array(pil_image.convert("RGB"))
    except Exception as error:  # PIL raises many types (OSError, SyntaxError, ValueError...) for bad files
        raise ImageDecodeError(f"{path}: cannot decode image ({type(error).__name__}: {error}); remove or replace the file") from error
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


@dataclass
class SourceImage:
    """One image to predict on: pixels (uint8 ``3×H×W`` RGB), its file (if any) and a display name."""

    image: "torch.Tensor"
    path: Path | None
    name: str


def _array_to_tensor(array: Any, name: str) -> "torch.Tensor":
    import numpy as np
    import torch

    array = np.asarray(array)
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] not in (1, 3, 4):
        raise ValueError(f"{name}: expected an H×W×3 (RGB) or H×W array, got shape {array.shape}")
    if array.shape[2] == 1:
        array = np.repeat(array, 3, axis=2)
    if array.shape[2] == 4:
        array = array[:, :, :3]
    if array.dtype != np.uint8:
        raise ValueError(f"{name}: expected a uint8 array (0-255), got {array.dtype}; convert with array.astype('uint8')")
    return torch.from_numpy(np.array(array)).permute(2, 0, 1).contiguous()


def _expand_source(item: Any, position: int) -> Iterable[SourceImage]:
    import torch

    # A camera index, as Ultralytics takes it: source=0, or "0" from the command line when no file is called that.
    if isinstance(item, int) and not isinstance(item, bool) or isinstance(item, str) and item.isdigit() and not Path(item).exists():
        yield from webcam_frames(int(item))
        return
    if isinstance(item, (str, Path)):
        path = Path(item).expanduser()
        if path.is_dir():
            paths = images_in_directory(path, recursive=True)  # class folders included
            if not paths:
                raise DatasetError(f"{path}: no images ({', '.join(IMAGE_SUFFIXES)}) in this folder or its sub-folders")
        elif path.is_file() and path.suffix.lower() in VIDEO_SUFFIXES:
            yield from video_frames(path)
            return
        elif path.is_file():
            paths = [path]
        elif any(character in str(item) for character in "*?["):
            import glob

            paths = sorted(Path(candidate) for candidate in glob.glob(str(path), recursive=True) if is_image_file(Path(candidate)))
            videos = sorted(Path(candidate) for candidate in glob.glob(str(path), recursive=True)
                            if Path(candidate).suffix.lower() in VIDEO_SUFFIXES)
            for video in videos:
                yield from video_frames(video)
            if videos and not paths:
                return
            if not paths:
                raise DatasetError(f"{item!r}: the pattern matches no image")
        else:
            raise DatasetError(f"predict source {str(item)!r} does not exist; give an image file, a folder or a glob")
        for found in paths:
            yield SourceImage(read_image(found), found, found.name)
        return
    name = f"image{position}"
    if isinstance(item, torch.Tensor):
        if item.dim() != 3 or item.shape[0] != 3 or item.dtype != torch.uint8:
            raise ValueError(f"{name}: a tensor source must be uint8 3×H×W (RGB), got {item.dtype} {tuple(item.shape)}")
        yield SourceImage(item.contiguous(), None, name)
        return
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        Image = None
    if Image is not None and isinstance(item, Image.Image):
        yield SourceImage(_array_to_tensor(item.convert("RGB"), name), None, name)
        return
    if hasattr(item, "__array__"):
        yield SourceImage(_array_to_tensor(item, name), None, name)
        return
    raise TypeError(
        f"unsupported predict source {type(item).__name__}; give a path, a folder, a glob, a PIL image, "
        "a uint8 H×W×3 RGB numpy array, a uint8 3×H×W tensor, or a list of them"
    )


def video_frames(path: Path) -> Iterator[SourceImage]:
    """The frames of a video file, decoded one at a time (a video is never held whole in memory).

    Each frame is named ``<video stem>_<frame number, 6 digits>``; its ``path`` is the video's.
    """
    try:
        import av
    except ImportError:
        raise DatasetError(
            f"{path}: reading videos needs PyAV; install it with `pip install av` (or zoo's `video` extra)"
        ) from None
    import torch

    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as error:
        raise DatasetError(f"{path}: cannot open this video ({error}); is the file complete?") from None
    with container:
        for index, frame in enumerate(container.decode(video=0)):
            pixels = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1).contiguous()
            yield SourceImage(pixels, path, f"{path.stem}_{index:06d}")


#: How FFmpeg (through PyAV) opens camera ``N`` on each platform: the device's name and the input format.
_CAMERA_INPUTS = {"linux": ("/dev/video{index}", "v4l2"), "darwin": ("{index}", "avfoundation")}


def webcam_frames(index: int) -> Iterator[SourceImage]:
    """The frames of camera ``index`` as they are captured (Linux: ``/dev/videoN`` through v4l2; macOS: AVFoundation),
    named ``webcam<N>_<frame number>``; until the camera stops or the caller stops reading."""
    import sys

    try:
        import av
    except ImportError:
        raise DatasetError(f"webcam {index}: reading a camera needs PyAV; install it with `pip install av`") from None
    import torch

    platform = "linux" if sys.platform.startswith("linux") else sys.platform
    if platform not in _CAMERA_INPUTS:
        raise DatasetError(f"webcam {index}: cameras are read on Linux (v4l2) and macOS (AVFoundation); on {sys.platform} "
                           "record a video file and give its path")
    device, input_format = (part.format(index=index) for part in _CAMERA_INPUTS[platform])
    try:
        container = av.open(device, format=input_format)
    except (av.FFmpegError, OSError) as error:
        raise DatasetError(f"webcam {index}: cannot open camera {device} ({error}); is it connected, and free? "
                           "(a file named like a number is read as a camera index unless it exists)") from None
    with container:
        for frame_number, frame in enumerate(container.decode(video=0)):
            pixels = torch.from_numpy(frame.to_ndarray(format="rgb24")).permute(2, 0, 1).contiguous()
            yield SourceImage(pixels, None, f"webcam{index}_{frame_number:06d}")


def iter_sources(source: Any) -> Iterator[SourceImage]:
    """The images of a ``predict`` source one at a time, read as they are needed.

    ``source``: a path (image, video, folder, glob), a PIL image, an RGB array, a tensor, or a
    list of them. Raises ``DatasetError`` when the source holds no image.
    """
    items = list(source) if isinstance(source, (list, tuple)) else [source]
    found = False
    for position, item in enumerate(items):
        for image in _expand_source(item, position):
            found = True
            yield image
    if not found:
        raise DatasetError("predict got no image; give an image file, a video, a folder, a PIL image or an array")


def load_sources(source: Any) -> list[SourceImage]:
    """Every image of a ``predict`` source (``iter_sources``), read now."""
    return list(iter_sources(source))
