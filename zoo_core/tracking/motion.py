"""Camera-motion estimation between consecutive frames (BoT-SORT's global motion compensation).

``CameraMotion.estimate(frame)`` returns the 2×3 affine that maps the previous frame's pixels onto this
frame's, so predicted track boxes can be moved with the camera before they are matched. Two methods,
both OpenCV's: ``"sparseOptFlow"`` (Shi-Tomasi corners tracked with pyramidal Lucas-Kanade, a
RANSAC-fitted partial affine: rotation, uniform scale, translation) and ``"ecc"`` (the enhanced
correlation coefficient maximised over a Euclidean warp). Frames are shrunk ``downscale`` times first;
the translation is scaled back.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CameraMotion", "IDENTITY"]

IDENTITY = np.eye(2, 3)


class CameraMotion:
    """The camera's motion from one frame to the next, by ``method`` (``"sparseOptFlow"``, ``"ecc"`` or ``"none"``)."""

    def __init__(self, method: str = "sparseOptFlow", downscale: int = 2) -> None:
        if method not in ("sparseOptFlow", "ecc", "none"):
            raise ValueError(f"gmc_method={method!r}: give 'sparseOptFlow', 'ecc' or 'none'")
        self.method = method
        self.downscale = max(1, int(downscale))
        self._previous: np.ndarray | None = None
        self._previous_points: np.ndarray | None = None

    def reset(self) -> None:
        """Forget the previous frame (a new video starts)."""
        self._previous = None
        self._previous_points = None

    def _grey(self, frame: np.ndarray) -> np.ndarray:
        import cv2

        grey = cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2GRAY) if frame.ndim == 3 else np.ascontiguousarray(frame)
        if self.downscale > 1:
            height, width = grey.shape
            grey = cv2.resize(grey, (max(1, width // self.downscale), max(1, height // self.downscale)))
        return grey

    def estimate(self, frame: np.ndarray | None) -> np.ndarray:
        """The 2×3 affine from the previous frame to ``frame`` (``H×W×3`` RGB uint8); the identity for the first."""
        if self.method == "none" or frame is None:
            return IDENTITY.copy()
        grey = self._grey(frame)
        previous, self._previous = self._previous, grey
        if previous is None or previous.shape != grey.shape:
            self._previous_points = self._corners(grey) if self.method == "sparseOptFlow" else None
            return IDENTITY.copy()
        affine = self._optical_flow(previous, grey) if self.method == "sparseOptFlow" else self._ecc(previous, grey)
        affine[:, 2] *= self.downscale
        return affine

    @staticmethod
    def _corners(grey: np.ndarray) -> np.ndarray | None:
        import cv2

        return cv2.goodFeaturesToTrack(grey, maxCorners=1000, qualityLevel=0.01, minDistance=1, blockSize=3,
                                       useHarrisDetector=False, k=0.04)

    def _optical_flow(self, previous: np.ndarray, grey: np.ndarray) -> np.ndarray:
        import cv2

        points, self._previous_points = self._previous_points, self._corners(grey)
        if points is None or len(points) < 4:
            return IDENTITY.copy()
        moved, status, _ = cv2.calcOpticalFlowPyrLK(previous, grey, points, None)
        found = status.reshape(-1).astype(bool)
        if found.sum() < 4:
            return IDENTITY.copy()
        affine, _ = cv2.estimateAffinePartial2D(points[found], moved[found], method=cv2.RANSAC)
        return affine if affine is not None else IDENTITY.copy()

    @staticmethod
    def _ecc(previous: np.ndarray, grey: np.ndarray) -> np.ndarray:
        import cv2

        warp = np.eye(2, 3, dtype=np.float32)
        criteria = (cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 100, 1e-5)
        try:
            _, warp = cv2.findTransformECC(previous, grey, warp, cv2.MOTION_EUCLIDEAN, criteria, None, 1)
        except cv2.error:  # no convergence (a featureless or changed scene): assume a still camera
            return IDENTITY.copy()
        # With the previous frame as template, grey(warp(x)) ~ previous(x): warp maps previous pixels to current ones.
        return warp.astype(np.float64)
