"""Drawing on images: class colours, captions sized to the picture, boxes, masks (class maps and translucent,
outlined instance masks) and batch grids.

Images are uint8 ``3×H×W`` RGB tensors (what the tasks load); ``image_grid`` and ``save_image``
turn them into the JPEG/PNG files people open. torchvision's ``draw_*`` utilities do the drawing.
"""

from __future__ import annotations

import colorsys
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
import torch

__all__ = [
    "class_colour", "drawing_sizes", "caption_font", "as_numpy_image", "draw_boxes", "draw_mask", "draw_caption",
    "image_grid", "save_image", "as_uint8_images", "draw_box_batch", "draw_captioned_batch", "IMAGES_PER_GRID",
    "draw_instance_masks", "mask_outlines", "draw_instance_batch", "draw_rotated_boxes", "draw_rotated_box_batch",
    "draw_keypoints", "draw_pose_batch", "draw_trails",
]

#: A keypoint is drawn when its visibility or confidence reaches this (Ultralytics' plotting threshold).
KEYPOINT_DRAW_THRESHOLD = 0.5

IMAGES_PER_GRID = 16


def class_colour(index: int) -> tuple[int, int, int]:
    """A distinct, stable RGB colour for class ``index`` (golden-ratio steps around the hue circle)."""
    hue = (index * 0.618033988749895 + 0.1) % 1.0
    red, green, blue = colorsys.hsv_to_rgb(hue, 0.8, 0.95)
    return int(red * 255), int(green * 255), int(blue * 255)


def drawing_sizes(shape: tuple[int, int]) -> tuple[int, int]:
    """``(caption font size, line width)`` in pixels for an image of ``(height, width)``."""
    short_side = min(shape)
    return max(10, round(short_side * 0.03)), max(1, round(short_side / 320))


def caption_font() -> str | None:
    """A TrueType font for captions: DejaVu Sans from matplotlib's data (a dependency), if present."""
    import matplotlib

    path = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    return str(path) if path.is_file() else None


def as_numpy_image(image: torch.Tensor) -> np.ndarray:
    """A uint8 ``3×H×W`` tensor as an ``H×W×3`` NumPy array."""
    return image.detach().cpu().permute(1, 2, 0).contiguous().numpy()


def draw_boxes(
    image: torch.Tensor,
    boxes: torch.Tensor,
    labels: Sequence[int],
    names: Mapping[int, str],
    scores: Sequence[float] | None = None,
    line_width: int | None = None,
    ids: Sequence[int] | None = None,
) -> torch.Tensor:
    """``image`` with xyxy ``boxes`` (input pixels), captioned ``name`` or ``name score`` on a filled box in the class colour,
    prefixed ``id:3`` with track ``ids``.

    ``line_width`` (pixels) overrides the width chosen for the image's size.
    """
    from torchvision.utils import draw_bounding_boxes

    labels = [int(label) for label in labels]
    if not labels:
        return image
    if scores is None:
        captions = [str(names.get(label, label)) for label in labels]
    else:
        captions = [f"{names.get(label, label)} {float(score):.2f}" for label, score in zip(labels, scores)]
    if ids is not None:
        captions = [f"id:{int(track_id)} {caption}" for track_id, caption in zip(ids, captions)]
    colours = [class_colour(label) for label in labels]
    # Captions on a filled box in the class colour, sized to the image: readable on busy pictures.
    font_size, line = drawing_sizes((int(image.shape[-2]), int(image.shape[-1])))
    return draw_bounding_boxes(
        image, boxes.detach().float().cpu().reshape(-1, 4), labels=captions, colors=colours, width=line_width or line,
        font=caption_font(), font_size=font_size, label_colors=(255, 255, 255), label_background_colors=colours,
        fill_labels=True,
    )


def draw_trails(image: torch.Tensor, trails: torch.Tensor, labels: Sequence[int], line_width: int | None = None) -> torch.Tensor:
    """``image`` with each tracked object's trail (``n×k×2`` recent centres in pixels, NaN where a trail is shorter) as a
    line in its class colour."""
    import cv2

    if not len(labels):
        return image
    canvas = np.ascontiguousarray(as_numpy_image(image))
    _, line = drawing_sizes(canvas.shape[:2])
    for trail, label in zip(trails.detach().float().cpu().numpy(), labels):
        points = trail[~np.isnan(trail).any(axis=1)]
        if len(points) >= 2:
            cv2.polylines(canvas, [np.rint(points).astype(np.int32).reshape(-1, 1, 2)], False, class_colour(int(label)),
                          line_width or line, cv2.LINE_AA)
    return torch.from_numpy(canvas).permute(2, 0, 1).contiguous()


def draw_mask(image: torch.Tensor, mask: torch.Tensor, alpha: float = 0.5, ignore_index: int | None = None) -> torch.Tensor:
    """``image`` with each class of the ``H×W`` class-index ``mask`` overlaid in its colour (``ignore_index`` left bare)."""
    from torchvision.utils import draw_segmentation_masks

    mask = mask.detach().cpu()
    present = [int(value) for value in torch.unique(mask) if ignore_index is None or int(value) != ignore_index]
    if not present:
        return image
    masks = torch.stack([mask == value for value in present])
    return draw_segmentation_masks(image, masks, alpha=alpha, colors=[class_colour(value) for value in present])


def mask_outlines(mask: torch.Tensor | np.ndarray) -> list[np.ndarray]:
    """The outer contours of an ``H×W`` mask (OpenCV ``findContours``), each a ``k×2`` int32 array of ``x, y`` pixels."""
    import cv2

    planes = mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)
    contours, _ = cv2.findContours(np.ascontiguousarray(planes.astype(np.uint8)), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    return [contour.reshape(-1, 2) for contour in contours]


def draw_instance_masks(
    image: torch.Tensor,
    masks: torch.Tensor,
    labels: Sequence[int],
    alpha: float = 0.4,
    line_width: int | None = None,
) -> torch.Tensor:
    """``image`` with each of the ``n×H×W`` instance ``masks`` filled translucently in its class colour and outlined in it.

    Drawn in order, so a later object covers an earlier one where they overlap; boxes and captions go on top
    (``draw_boxes``).
    """
    import cv2
    from torchvision.utils import draw_segmentation_masks

    labels = [int(label) for label in labels]
    masks = masks.detach().cpu().bool()
    if not labels or not len(masks):
        return image
    colours = [class_colour(label) for label in labels]
    filled = draw_segmentation_masks(image.cpu(), masks, alpha=alpha, colors=colours)
    canvas = np.ascontiguousarray(as_numpy_image(filled))
    _, line = drawing_sizes((int(image.shape[-2]), int(image.shape[-1])))
    for mask, colour in zip(masks, colours):
        outlines = mask_outlines(mask)
        if outlines:
            cv2.polylines(canvas, [outline.reshape(-1, 1, 2) for outline in outlines], True, colour, line_width or line)
    return torch.from_numpy(canvas).permute(2, 0, 1).contiguous()


def draw_caption(image: torch.Tensor, lines: Sequence[str], colour: tuple[int, int, int] = (0, 0, 0)) -> torch.Tensor:
    """``image`` with ``lines`` written top-left, white on a filled ``colour`` box, sized to the image."""
    from PIL import Image, ImageDraw, ImageFont

    canvas = Image.fromarray(as_numpy_image(image))
    draw = ImageDraw.Draw(canvas)
    font_size, _ = drawing_sizes(canvas.size[::-1])
    font_path = caption_font()
    font = ImageFont.truetype(font_path, font_size) if font_path else ImageFont.load_default()
    top = 2
    for line in lines:
        left, upper, right, lower = draw.textbbox((4, top), line, font=font)
        draw.rectangle((left - 2, upper - 1, right + 2, lower + 1), fill=colour)
        draw.text((4, top), line, fill=(255, 255, 255), font=font)
        top = lower + 3
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)


def image_grid(images: Sequence[torch.Tensor], columns: int | None = None, padding: int = 2) -> torch.Tensor:
    """Equal-sized uint8 ``3×H×W`` images tiled row by row (square-ish when ``columns`` is None)."""
    import math

    from torchvision.utils import make_grid

    if not images:
        raise ValueError("image_grid needs at least one image")
    columns = columns or math.ceil(math.sqrt(len(images)))
    return make_grid(torch.stack([image.cpu() for image in images]), nrow=columns, padding=padding, pad_value=255)


def save_image(image: torch.Tensor | np.ndarray, path: Path) -> Path:
    """Write a uint8 ``3×H×W`` tensor or ``H×W×3`` array as a JPEG (quality 90) or PNG, by ``path``'s suffix."""
    from PIL import Image

    array = as_numpy_image(image) if isinstance(image, torch.Tensor) else image
    path.parent.mkdir(parents=True, exist_ok=True)
    options = {"quality": 90} if path.suffix.lower() in (".jpg", ".jpeg") else {}
    Image.fromarray(array).save(path, **options)
    return path


def as_uint8_images(images: torch.Tensor) -> torch.Tensor:
    """A batch of images (uint8, or float in [0, 1]) as uint8 ``N×3×H×W`` on the CPU."""
    images = images.detach().cpu()
    return images if images.dtype == torch.uint8 else images.float().clamp(0, 1).mul(255).round().to(torch.uint8)


def draw_box_batch(images: torch.Tensor, rows: torch.Tensor, names: Mapping[int, str]) -> torch.Tensor:
    """The first ``IMAGES_PER_GRID`` images of a batch in a grid, each with its boxes.

    ``rows`` is ``M×6`` (image index, class, x1, y1, x2, y2 in input pixels): a detection batch's
    ``targets``; a seventh column, when present, is a score written in the caption.
    """
    images = as_uint8_images(images[:IMAGES_PER_GRID])
    rows = rows.detach().float().cpu()
    drawn = []
    for position, image in enumerate(images):
        mine = rows[rows[:, 0] == position]
        scores = mine[:, 6].tolist() if mine.shape[1] > 6 else None
        drawn.append(draw_boxes(image, mine[:, 2:6], mine[:, 1].long().tolist(), names, scores=scores))
    return image_grid(drawn)


def draw_instance_batch(images: torch.Tensor, rows: torch.Tensor, masks: torch.Tensor, names: Mapping[int, str]) -> torch.Tensor:
    """``draw_box_batch`` with each row's mask drawn under its box: ``masks`` is ``M×H×W`` (row i the mask of ``rows``
    row i, in input pixels), a segment batch's ``masks``."""
    images = as_uint8_images(images[:IMAGES_PER_GRID])
    rows = rows.detach().float().cpu()
    masks = masks.detach().cpu()
    drawn = []
    for position, image in enumerate(images):
        mine = rows[:, 0] == position
        picked = rows[mine]
        scores = picked[:, 6].tolist() if picked.shape[1] > 6 else None
        labels = picked[:, 1].long().tolist()
        with_masks = draw_instance_masks(image, masks[mine], labels) if len(masks) == len(rows) else image
        drawn.append(draw_boxes(with_masks, picked[:, 2:6], labels, names, scores=scores))
    return image_grid(drawn)


def draw_keypoints(
    image: torch.Tensor,
    keypoints: torch.Tensor,
    labels: Sequence[int],
    skeleton: Sequence[Sequence[int]] = (),
    radius: int | None = None,
    line_width: int | None = None,
) -> torch.Tensor:
    """``image`` with each object's keypoints (``n×K×3``: x, y in image pixels and a visibility or confidence) as dots in
    its class colour outlined in white, and the ``skeleton`` pairs joined by lines; points under
    ``KEYPOINT_DRAW_THRESHOLD`` (unlabelled, or found with too little confidence) are left out."""
    import cv2

    points = keypoints.detach().float().cpu().reshape(len(labels), -1, 3) if len(labels) else keypoints.reshape(0, 1, 3)
    if not len(points):
        return image
    canvas = np.ascontiguousarray(as_numpy_image(image))
    height, width = canvas.shape[:2]
    _, line = drawing_sizes((height, width))
    line = line_width or line
    radius = radius if radius is not None else max(2, round(min(height, width) * 0.008))
    for object_points, label in zip(points.tolist(), labels):
        colour = class_colour(int(label))
        shown = [point[2] >= KEYPOINT_DRAW_THRESHOLD for point in object_points]
        for first, second in skeleton:
            if first < len(object_points) and second < len(object_points) and shown[first] and shown[second]:
                start = (int(round(object_points[first][0])), int(round(object_points[first][1])))
                end = (int(round(object_points[second][0])), int(round(object_points[second][1])))
                cv2.line(canvas, start, end, colour, line, cv2.LINE_AA)
        for (x, y, _), visible in zip(object_points, shown):
            if visible:
                centre = (int(round(x)), int(round(y)))
                cv2.circle(canvas, centre, radius + 1, (255, 255, 255), -1, cv2.LINE_AA)
                cv2.circle(canvas, centre, radius, colour, -1, cv2.LINE_AA)
    return torch.from_numpy(canvas).permute(2, 0, 1).contiguous()


def draw_pose_batch(images: torch.Tensor, rows: torch.Tensor, keypoints: torch.Tensor, names: Mapping[int, str],
                    skeleton: Sequence[Sequence[int]] = ()) -> torch.Tensor:
    """``draw_box_batch`` with each row's keypoints (``keypoints`` M×K×3, row i the points of ``rows`` row i, in input
    pixels: a pose batch's) drawn over its box, joined by ``skeleton``."""
    images = as_uint8_images(images[:IMAGES_PER_GRID])
    rows = rows.detach().float().cpu()
    keypoints = keypoints.detach().float().cpu()
    drawn = []
    for position, image in enumerate(images):
        mine = rows[:, 0] == position
        picked = rows[mine]
        scores = picked[:, 6].tolist() if picked.shape[1] > 6 else None
        labels = picked[:, 1].long().tolist()
        boxed = draw_boxes(image, picked[:, 2:6], labels, names, scores=scores)
        drawn.append(draw_keypoints(boxed, keypoints[mine], labels, skeleton) if len(keypoints) == len(rows) else boxed)
    return image_grid(drawn)


def draw_captioned_batch(images: torch.Tensor, captions: Sequence[Sequence[str]]) -> torch.Tensor:
    """The first ``IMAGES_PER_GRID`` images of a batch in a grid, image ``i`` captioned with the lines ``captions[i]``."""
    images = as_uint8_images(images[:IMAGES_PER_GRID])
    return image_grid([draw_caption(image, lines) for image, lines in zip(images, captions)])


def draw_rotated_boxes(
    image: torch.Tensor,
    corners: torch.Tensor,
    labels: Sequence[int],
    names: Mapping[int, str],
    scores: Sequence[float] | None = None,
    line_width: int | None = None,
) -> torch.Tensor:
    """``image`` with rotated boxes given by their ``n×4×2`` corners (pixels), each outlined in its class colour and
    captioned ``name`` or ``name score`` on a filled box at its top-most corner; ``line_width`` overrides the width."""
    from PIL import Image, ImageDraw, ImageFont

    labels = [int(label) for label in labels]
    if not labels:
        return image
    canvas = Image.fromarray(as_numpy_image(image))
    draw = ImageDraw.Draw(canvas)
    font_size, line = drawing_sizes((int(image.shape[-2]), int(image.shape[-1])))
    path = caption_font()
    font = ImageFont.truetype(path, font_size) if path else ImageFont.load_default()
    points = corners.detach().float().cpu().reshape(-1, 4, 2).tolist()
    for position, (label, polygon) in enumerate(zip(labels, points)):
        colour = class_colour(label)
        outline = [tuple(point) for point in polygon]
        draw.line(outline + [outline[0]], fill=colour, width=line_width or line)
        caption = str(names.get(label, label)) if scores is None else f"{names.get(label, label)} {float(scores[position]):.2f}"
        x, y = min(outline, key=lambda point: point[1])
        left, top, right, bottom = draw.textbbox((x, y), caption, font=font)
        top_shift = bottom - top  # the caption sits above the corner, as the axis-aligned boxes' captions do
        draw.rectangle((left, top - top_shift, right, bottom - top_shift), fill=colour)
        draw.text((x, y - top_shift), caption, fill=(255, 255, 255), font=font)
    return torch.from_numpy(np.asarray(canvas)).permute(2, 0, 1).contiguous()


def draw_rotated_box_batch(images: torch.Tensor, rows: torch.Tensor, names: Mapping[int, str]) -> torch.Tensor:
    """The first ``IMAGES_PER_GRID`` images of an OBB batch in a grid, each with its rotated boxes.

    ``rows`` is ``M×7`` (image index, class, cx, cy, w, h, angle in input pixels and radians): an OBB batch's
    ``targets``; an eighth column, when present, is a score written in the caption.
    """
    from zoo_core.ops.rotated_boxes import xywhr_to_corners

    images = as_uint8_images(images[:IMAGES_PER_GRID])
    rows = rows.detach().float().cpu()
    drawn = []
    for position, image in enumerate(images):
        mine = rows[rows[:, 0] == position]
        scores = mine[:, 7].tolist() if mine.shape[1] > 7 else None
        drawn.append(draw_rotated_boxes(image, xywhr_to_corners(mine[:, 2:7]), mine[:, 1].long().tolist(), names, scores=scores))
    return image_grid(drawn)
