"""Blocks shared by the ViT-backed DETR families (DEIMv2 S-X, EdgeCrafter ECDet), on top of ``zoo_core.detr``.

The DEIMv2 ViT-Tiny/Tiny+ backbones and EdgeCrafter's ECViT are the same small RoPE vision
transformer with different stems and taps, and both families pair it with the same variant of the
D-FINE machinery. What they share lives here, once:

- ``rope_vit``: the DINOv3-style axial rotary position embedding and a pre-norm ViT trunk with one
  prefix token (``RopeViT``) whose patch embedding is pluggable (a strided conv for DEIMv2, a
  conv pyramid for ECViT);
- ``fusion``: the cross-scale fusion blocks of their hybrid encoders: a split CSP block (one 1x1
  conv, halves added after the RepVGG branch), the ELAN block built from it, with the two maps
  summed rather than concatenated (``fuse_op: sum``), and ``vit_hybrid_encoder`` which assembles
  ``zoo_core.detr.hybrid_encoder.HybridEncoder`` with them;
- ``decoder``: ``ViTDistributionDecoder``, the FDR decoder of ``zoo_core.detr`` as these families
  configure it (query selection straight on the memory, a 3-layer query-position MLP evaluated
  once from the initial references, optional shared box head) and ``RMSDecoderLayer`` (DEIMv2's
  RMSNorm + SwiGLU layer);
- ``libreyolo_keys``: LibreYOLO 1.6 key rules of the pieces above.

Nothing here imports timm or scipy at import time.
"""
