"""Tensor operations shared by detection families: box arithmetic (``boxes``) and NMS (``nms``)."""
