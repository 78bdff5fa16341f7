"""The DETR core of zoo: the RT-DETR line (RT-DETR, D-FINE, DEIM, RT-DETRv4) and its descendants.

Modules, each usable on its own (their public names are a stable API: families built on this
core import them; changes are additive):

- ``geometry``: box formats, inverse sigmoid, IoU/GIoU, the AIFI sine-cosine position grid;
- ``deformable_attention``: multi-scale deformable attention in pure PyTorch (``grid_sample``);
- ``fusion_blocks``: RepConv, CSPRep (RT-DETR), ELAN (D-FINE) and separable-downsampling blocks;
- ``hybrid_encoder``: AIFI + CCFM over any backbone's maps; CCFM blocks are pluggable
  (``CrossScaleFusion``; ``csp_rep_fusion``, ``elan_fusion``);
- ``hgnetv2``: HGNetV2 B0–B6 (timm) as a multi-level backbone;
- ``targets``: zoo's ``M×6`` pixel targets → per-image normalised cxcywh (``DETRTargets``);
- ``denoising``: contrastive denoising queries and their attention mask;
- ``decoder``: query selection, decoder layers, delta (RT-DETR) and distribution (D-FINE FDR)
  refinement decoders; ``DETRDecoderBase`` for new ones (``run_layers``, and
  ``inference_unused_parameter_count`` for the deployed form);
- ``distribution``: FDR's weighting function, expectation, box encoding/decoding;
- ``matcher``: Hungarian matching (focal + L1 + GIoU costs, scipy);
- ``losses``: MAL, FGL and the DDF divergence (VFL lives in ``zoo_core.losses.iou_aware_classification``);
- ``criterion``: ``SetCriterion`` (VFL/MAL + L1 + GIoU [+ FGL + DDF], auxiliary, encoder,
  initial and denoising terms, GO-LSD union); the box count is averaged over ranks with
  ``zoo_core.ops.distributed.mean_over_ranks`` (``average_box_count``);
- ``postprocess``: top-k over queries × classes, no NMS;
- ``detector``: ``DETRDetector``, the model contract (``model(images, targets=...)`` in training),
  ``minimum_input_size`` (enough encoder tokens for the queries) and
  ``published_parameter_count()`` (``published_form``: ``"trainable"`` or ``"deploy"``);
- ``deploy``: the deployed form's parameter count (folded conv-BN pairs and RepVGG blocks, no
  training-only heads), the form D-FINE, DEIM and RT-DETRv4 publish;
- ``distribution_detr``: the D-FINE / DEIM / RT-DETRv4 assembly from registry data
  (``build_distribution_detr``; ``build_from_request`` checks the build options
  ``num_queries`` and ``num_denoising``);
- ``key_mapping`` (``KeyRule`` lists on ``zoo_core.key_renaming.KeyRenamer``), ``libreyolo_keys``:
  checkpoint key renaming rules (LibreYOLO / official names).

A family assembles a ``DETRDetector`` from these (see ``plugins/zoo_rtdetr`` and
``zoo_core.detr.distribution_detr`` for the D-FINE-style families); its training recipe derives
from ``zoo_core.recipes.detr.DETRRecipe`` (the targets reach ``forward``; the backbone's
learning-rate multiplier and the per-size published numbers), which sits above the engine.
Nothing here imports timm or scipy until the module that needs it is imported, and nothing here
imports the engine (``zoo_core.detr`` sits between the tasks and the building blocks in the
import layers).
"""
