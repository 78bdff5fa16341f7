"""Tracking: IDs that hold from frame to frame for any model whose task finds boxes.

``trackers`` (ByteTrack, BoT-SORT) associate each frame's boxes with the tracks, ``kalman``, ``matching`` and
``motion`` are their parts, ``config`` reads the tracker YAMLs in ``trackers/``, ``metrics`` scores a tracker
(HOTA, MOTA, IDF1), and ``video_tracking`` is ``LibreYOLO.track``: predict, then track, frame by frame.
"""
