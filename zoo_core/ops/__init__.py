"""Tensor operations shared by families: box arithmetic (``boxes``), NMS (``nms``), resizing dense logits (``resize``) and sliding-window inference (``sliding_window``)."""
