"""Mixed precision of the training step: whether the forward pass runs under autocast, and in which dtype.

``amp=True`` (the default) means autocast on a CUDA device and nothing elsewhere. bfloat16 keeps
float32's exponent range, so its gradients neither underflow nor overflow and need no loss
scaling; it is chosen where the GPU computes it natively (compute capability 8.0 and later:
A100, H100, RTX 30xx on). Older GPUs get float16 with a ``GradScaler``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Precision", "training_precision"]


@dataclass(frozen=True)
class Precision:
    """How one rank's training step computes: ``autocast`` on or off, and the autocast ``dtype``."""

    autocast: bool
    dtype: torch.dtype = torch.float32

    @property
    def scales_loss(self) -> bool:
        """Whether the loss needs a ``GradScaler``: float16 only (its gradients underflow otherwise)."""
        return self.autocast and self.dtype == torch.float16


def training_precision(device: torch.device, amp: bool) -> Precision:
    """The precision ``amp`` asks for on ``device``: bfloat16 autocast on a GPU that computes it natively, else float16
    autocast on CUDA; float32 off CUDA, where ``amp`` has never applied."""
    if not amp or device.type != "cuda":
        return Precision(autocast=False)
    native_bfloat16 = bool(torch.version.hip) or torch.cuda.get_device_properties(device).major >= 8
    return Precision(autocast=True, dtype=torch.bfloat16 if native_bfloat16 else torch.float16)
