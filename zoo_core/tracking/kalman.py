"""A constant-velocity Kalman filter over many boxes at once (the motion model of ByteTrack and BoT-SORT).

The state of a box is 8 numbers: its 4 measured coordinates and their velocities. ByteTrack measures
``(cx, cy, aspect, height)`` (``"xyah"``), BoT-SORT ``(cx, cy, width, height)`` (``"xywh"``). The
process and measurement noise scale with the box's size, with the weights of the published trackers
(1/20 of the size for positions, 1/160 for velocities). Every operation takes ``n`` states stacked
(``n×8`` means, ``n×8×8`` covariances) and works on all of them in one set of array operations.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

__all__ = ["BoxKalmanFilter", "xyxy_to_measurement", "state_to_xyxy"]

Layout = Literal["xyah", "xywh"]

_POSITION_WEIGHT = 1.0 / 20
_VELOCITY_WEIGHT = 1.0 / 160


def xyxy_to_measurement(boxes: np.ndarray, layout: Layout) -> np.ndarray:
    """``n×4`` xyxy boxes as the filter's ``n×4`` measurements in ``layout``."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    width, height = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    centre_x, centre_y = (boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2
    third = width / np.maximum(height, 1e-9) if layout == "xyah" else width
    return np.stack([centre_x, centre_y, third, height], axis=1)


def state_to_xyxy(means: np.ndarray, layout: Layout) -> np.ndarray:
    """The ``n×4`` xyxy boxes of ``n×8`` states (or ``n×4`` measurements) in ``layout``."""
    means = np.asarray(means, dtype=np.float64).reshape(len(means), -1)
    height = means[:, 3]
    width = means[:, 2] * height if layout == "xyah" else means[:, 2]
    return np.stack([means[:, 0] - width / 2, means[:, 1] - height / 2, means[:, 0] + width / 2, means[:, 1] + height / 2], axis=1)


class BoxKalmanFilter:
    """Constant-velocity Kalman filtering of boxes in ``layout`` (``"xyah"``: ByteTrack; ``"xywh"``: BoT-SORT)."""

    def __init__(self, layout: Layout = "xyah") -> None:
        if layout not in ("xyah", "xywh"):
            raise ValueError(f"layout={layout!r}: give 'xyah' (ByteTrack) or 'xywh' (BoT-SORT)")
        self.layout = layout
        # x' = F x with one frame of velocity; z = H x reads the four coordinates.
        self.motion = np.eye(8)
        self.motion[:4, 4:] = np.eye(4)
        self.observation = np.eye(4, 8)

    def _scales(self, sizes: np.ndarray) -> np.ndarray:
        """``n×4`` per-coordinate scales of the noise: the height everywhere (xyah) or width, height, width, height."""
        if self.layout == "xyah":
            return np.repeat(sizes[:, 3:4], 4, axis=1)
        return sizes[:, [2, 3, 2, 3]]

    def _aspect_fixed(self, stds: np.ndarray, value: float) -> np.ndarray:
        """xyah: the aspect ratio's noise is a constant, not a multiple of the height."""
        if self.layout == "xyah":
            stds[:, 2] = value
        return stds

    def initiate(self, measurements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """States of new tracks from their first ``n×4`` measurements: zero velocity, wide uncertainty."""
        measurements = np.asarray(measurements, dtype=np.float64).reshape(-1, 4)
        means = np.concatenate([measurements, np.zeros_like(measurements)], axis=1)
        scale = self._scales(measurements)
        position = self._aspect_fixed(2 * _POSITION_WEIGHT * scale, 1e-2)
        velocity = self._aspect_fixed(10 * _VELOCITY_WEIGHT * scale, 1e-5)
        stds = np.concatenate([position, velocity], axis=1)
        covariances = np.einsum("ni,ij->nij", stds**2, np.eye(8))
        return means, covariances

    def predict(self, means: np.ndarray, covariances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` states one frame later."""
        if len(means) == 0:
            return means, covariances
        scale = self._scales(means[:, :4])
        position = self._aspect_fixed(_POSITION_WEIGHT * scale, 1e-2)
        velocity = self._aspect_fixed(_VELOCITY_WEIGHT * scale, 1e-5)
        noise = np.einsum("ni,ij->nij", np.concatenate([position, velocity], axis=1) ** 2, np.eye(8))
        means = means @ self.motion.T
        covariances = self.motion @ covariances @ self.motion.T + noise
        return means, covariances

    def project(self, means: np.ndarray, covariances: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` states in measurement space (``n×4`` and ``n×4×4``), measurement noise included."""
        scale = self._scales(means[:, :4])
        stds = self._aspect_fixed(_POSITION_WEIGHT * scale, 1e-1)
        noise = np.einsum("ni,ij->nij", stds**2, np.eye(4))
        projected = means @ self.observation.T
        projected_cov = self.observation @ covariances @ self.observation.T + noise
        return projected, projected_cov

    def update(self, means: np.ndarray, covariances: np.ndarray, measurements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` states corrected by their ``n×4`` measurements (one per state, in the same order)."""
        if len(means) == 0:
            return means, covariances
        measurements = np.asarray(measurements, dtype=np.float64).reshape(-1, 4)
        projected, projected_cov = self.project(means, covariances)
        cross = covariances @ self.observation.T  # n×8×4
        # The gain K = P Hᵀ S⁻¹, from a solve on the symmetric S rather than an explicit inverse.
        gain = np.linalg.solve(projected_cov, cross.transpose(0, 2, 1)).transpose(0, 2, 1)
        innovation = measurements - projected
        means = means + np.einsum("nij,nj->ni", gain, innovation)
        covariances = covariances - gain @ projected_cov @ gain.transpose(0, 2, 1)
        return means, covariances

    @staticmethod
    def warp(means: np.ndarray, covariances: np.ndarray, affine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ``n`` states moved by a 2×3 camera-motion ``affine`` (BoT-SORT's compensation).

        The linear part acts on every (x, y) pair of the state (position, size, and their velocities);
        the translation moves the centre only.
        """
        if len(means) == 0:
            return means, covariances
        linear = np.asarray(affine, dtype=np.float64)[:, :2]
        block = np.kron(np.eye(4), linear)
        means = means @ block.T
        means[:, :2] += np.asarray(affine, dtype=np.float64)[:, 2]
        covariances = block @ covariances @ block.T
        return means, covariances
