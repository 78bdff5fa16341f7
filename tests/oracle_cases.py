"""How each family is compared with LibreYOLO 1.6, the output oracle (docs/weights.md).

For every family in the registry, ``ORACLE_CASES`` says which LibreYOLO class builds it, on what
input the two are compared and which outputs are compared: decoded boxes and class scores
before NMS for detection, logits for classification and segmentation, images for restoration.
``tests/test_libreyolo_oracle.py`` runs the smallest size of every family;
``benchmarks/libreyolo_oracle.py`` runs every size and prints a table. A family without a case
fails the suite: every family ships its oracle comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["OracleCase", "ORACLE_CASES", "build_libreyolo", "compare_on_random_weights"]

TOLERANCE = 1e-4


def _detection_zoo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    outputs = model(images)
    return {"boxes": outputs["boxes"], "scores": outputs["scores"]}


def _detection_libreyolo(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    predictions = model(images)["predictions"]  # N x (4 + C) x A: xyxy pixels, then class probabilities
    return {"boxes": predictions[:, :4].transpose(1, 2), "scores": predictions[:, 4:].transpose(1, 2)}


def _tensor_output(name: str) -> Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]:
    def outputs(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {name: model(images)}

    return outputs


def _imagenet_normalised(images: torch.Tensor) -> torch.Tensor:
    from zoo_core.tasks.classify import imagenet_normalise

    return imagenet_normalise(images, images.device)


@dataclass(frozen=True)
class OracleCase:
    """One family's comparison: the LibreYOLO class, the input, and the outputs to compare.

    ``libreyolo_input`` / ``zoo_input`` turn the shared random image batch (in [0, 1]) into each
    model's input (LibreYOLO's UNet normalises inside the model, zoo's semantic task outside).
    ``relative`` widens the tolerance by that fraction of an output's magnitude: box corners are
    pixels, where one float32 step at 1000 px is already 6e-5.
    """

    libreyolo_class: str
    num_classes: int | None
    image_size: int
    zoo_outputs: Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]
    libreyolo_outputs: Callable[[nn.Module, torch.Tensor], dict[str, torch.Tensor]]
    zoo_input: Callable[[torch.Tensor], torch.Tensor] = lambda images: images
    libreyolo_input: Callable[[torch.Tensor], torch.Tensor] = lambda images: images
    relative: float = 0.0
    libreyolo_sizes: dict[str, str] = field(default_factory=dict)  # zoo size -> LibreYOLO size, where they differ
    # zoo sizes whose layout LibreYOLO only reads from a file (it builds its default layout of that name)
    zoo_only_sizes: tuple[str, ...] = ()


_CLASSIFIER = dict(num_classes=10, image_size=64, zoo_outputs=_tensor_output("logits"),
                   libreyolo_outputs=_tensor_output("logits"), zoo_input=_imagenet_normalised,
                   libreyolo_input=_imagenet_normalised)
ORACLE_CASES: dict[str, OracleCase] = {
    "yolo9": OracleCase("LibreYOLO9", 3, 128, _detection_zoo, _detection_libreyolo, relative=1e-6),
    "unet": OracleCase("LibreUNet", 4, 64, _tensor_output("logits"), _tensor_output("logits"),
                       zoo_input=_imagenet_normalised),
    "nafnet": OracleCase("LibreNAFNet", None, 48, _tensor_output("image"), _tensor_output("image"),
                         zoo_only_sizes=("s_sidd", "l_sidd")),
    "resnet": OracleCase("LibreResNet", **_CLASSIFIER),
    "convnext": OracleCase("LibreConvNeXt", **_CLASSIFIER),
    "convnextv2": OracleCase("LibreConvNeXtV2", **_CLASSIFIER),
    "efficientnetv2": OracleCase("LibreEfficientNetV2", **_CLASSIFIER),
    "mobilenetv4": OracleCase("LibreMobileNetV4", **_CLASSIFIER),
}


def build_libreyolo(family: str, size: str, seed: int = 0) -> Any:
    """A LibreYOLO 1.6 wrapper of ``family``/``size`` at random initialisation (``model_path=None``: no download)."""
    import libreyolo

    case = ORACLE_CASES[family]
    torch.manual_seed(seed)
    keyword = {} if case.num_classes is None else {"nb_classes": case.num_classes}
    wrapper = getattr(libreyolo, case.libreyolo_class)(None, size=case.libreyolo_sizes.get(size, size), device="cpu", **keyword)
    wrapper.model.eval()  # a fresh LibreYOLO model starts in train mode
    return wrapper


def _max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor], relative: float) -> float:
    worst = 0.0
    for name, value in first.items():
        other = second[name]
        assert value.shape == other.shape, f"{name}: {tuple(value.shape)} vs {tuple(other.shape)}"
        excess = (value - other).abs() - relative * other.abs()
        worst = max(worst, float(excess.max()))
    return worst


@torch.no_grad()
def compare_on_random_weights(family: str, size: str, workdir: Path) -> dict[str, Any]:
    """LibreYOLO -> zoo -> LibreYOLO on one random model: the two maximum output differences and the parameter counts.

    The LibreYOLO model saves its own checkpoint; ``zoo_core.LibreYOLO`` loads it (converting its
    keys) and must give LibreYOLO's outputs; zoo then writes a LibreYOLO checkpoint, which
    LibreYOLO loads and must give zoo's outputs.
    """
    import libreyolo

    from zoo_core import LibreYOLO
    from zoo_core.building import count_parameters

    case = ORACLE_CASES[family]
    original = workdir / f"libreyolo-{family}-{size}.pt"
    if size in case.zoo_only_sizes:  # LibreYOLO reads this layout from a file only: start from zoo's
        torch.manual_seed(0)
        LibreYOLO(f"{family}-{size}", seed=None).save(workdir / "start.pt", format="libreyolo")
        reference = libreyolo.LibreYOLO(str(workdir / "start.pt"), device="cpu")
        reference.model.eval()
    else:
        reference = build_libreyolo(family, size)
    reference.save(str(original))
    model = LibreYOLO(original)
    model.model.eval()
    generator = torch.Generator().manual_seed(1)
    images = torch.rand(2, 3, case.image_size, case.image_size, generator=generator)
    expected = case.libreyolo_outputs(reference.model, case.libreyolo_input(images))
    loaded = _max_difference(case.zoo_outputs(model.model, case.zoo_input(images)), expected, case.relative)
    written = workdir / f"zoo-{family}-{size}.pt"
    model.save(written, format="libreyolo")
    reloaded = libreyolo.LibreYOLO(str(written), device="cpu")
    reloaded.model.eval()
    back = _max_difference(case.libreyolo_outputs(reloaded.model, case.libreyolo_input(images)),
                           case.zoo_outputs(model.model, case.zoo_input(images)), case.relative)
    return {
        "family": family, "size": size, "zoo_params": count_parameters(model.model),
        "libreyolo_params": count_parameters(reference.model), "loaded_difference": loaded, "written_difference": back,
        "zoo_size": model.size, "reloaded_family": type(reloaded).__name__,
    }
