"""State-dict conversion between zoo's SegFormer and the LibreYOLO / Hugging Face checkpoint layouts.

Pure key and tensor mapping, no model is built. Three layouts name the same tensors:

- ``zoo``: this plugin's modules (``encoder.stages.0.blocks.1.attn.kv.weight``...);
- ``libreyolo``: LibreYOLO 1.6.0's ``LibreSegformerNet`` (the ``model`` entry of a
  ``LibreSegformer*.pt`` checkpoint);
- ``upstream``: the Hugging Face release of the official weights
  (``nvidia/segformer-b*-finetuned-ade-*``, ``SegformerForSemanticSegmentation``), from which
  LibreYOLO's checkpoints are converted.

Each layout is a table of module paths with ``{stage}``/``{block}`` placeholders for one logical
part. Two parts differ in shape as well as name: zoo keeps keys and values in one ``kv`` linear
(keys first) where the others have separate ``k``/``v`` linears, and zoo's decoder projections
are 1×1 convolutions (``D×C×1×1``) where the others use linears (``D×C``).
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

__all__ = ["LAYOUTS", "convert", "from_libreyolo", "from_upstream", "to_libreyolo", "to_upstream"]

LAYOUTS: dict[str, dict[str, str]] = {
    "zoo": {
        "embed_proj": "encoder.stages.{stage}.embed.proj",
        "embed_norm": "encoder.stages.{stage}.embed.norm",
        "stage_norm": "encoder.stages.{stage}.norm",
        "attn_norm": "encoder.stages.{stage}.blocks.{block}.attn_norm",
        "q": "encoder.stages.{stage}.blocks.{block}.attn.q",
        "kv": "encoder.stages.{stage}.blocks.{block}.attn.kv",
        "attn_out": "encoder.stages.{stage}.blocks.{block}.attn.out",
        "reduce": "encoder.stages.{stage}.blocks.{block}.attn.reduce",
        "reduce_norm": "encoder.stages.{stage}.blocks.{block}.attn.reduce_norm",
        "ffn_norm": "encoder.stages.{stage}.blocks.{block}.ffn_norm",
        "fc1": "encoder.stages.{stage}.blocks.{block}.ffn.fc1",
        "pos": "encoder.stages.{stage}.blocks.{block}.ffn.pos",
        "fc2": "encoder.stages.{stage}.blocks.{block}.ffn.fc2",
        "decoder_proj": "decoder.proj.{stage}",
        "fuse_conv": "decoder.fuse.0",
        "fuse_norm": "decoder.fuse.1",
        "classifier": "decoder.classifier",
    },
    "libreyolo": {
        "embed_proj": "encoder.stages.{stage}.patch_embeddings.proj",
        "embed_norm": "encoder.stages.{stage}.patch_embeddings.layer_norm",
        "stage_norm": "encoder.stages.{stage}.layer_norm",
        "attn_norm": "encoder.stages.{stage}.blocks.{block}.layernorm_before",
        "q": "encoder.stages.{stage}.blocks.{block}.attention.q_proj",
        "k": "encoder.stages.{stage}.blocks.{block}.attention.k_proj",
        "v": "encoder.stages.{stage}.blocks.{block}.attention.v_proj",
        "attn_out": "encoder.stages.{stage}.blocks.{block}.attention.o_proj",
        "reduce": "encoder.stages.{stage}.blocks.{block}.attention.sequence_reduction.sequence_reduction",
        "reduce_norm": "encoder.stages.{stage}.blocks.{block}.attention.sequence_reduction.layer_norm",
        "ffn_norm": "encoder.stages.{stage}.blocks.{block}.layernorm_after",
        "fc1": "encoder.stages.{stage}.blocks.{block}.mlp.fc1",
        "pos": "encoder.stages.{stage}.blocks.{block}.mlp.dwconv.dwconv",
        "fc2": "encoder.stages.{stage}.blocks.{block}.mlp.fc2",
        "decoder_proj": "decode_head.linear_projections.{stage}.proj",
        "fuse_conv": "decode_head.linear_fuse",
        "fuse_norm": "decode_head.batch_norm",
        "classifier": "decode_head.classifier",
    },
    "upstream": {
        "embed_proj": "segformer.encoder.patch_embeddings.{stage}.proj",
        "embed_norm": "segformer.encoder.patch_embeddings.{stage}.layer_norm",
        "stage_norm": "segformer.encoder.layer_norm.{stage}",
        "attn_norm": "segformer.encoder.block.{stage}.{block}.layer_norm_1",
        "q": "segformer.encoder.block.{stage}.{block}.attention.self.query",
        "k": "segformer.encoder.block.{stage}.{block}.attention.self.key",
        "v": "segformer.encoder.block.{stage}.{block}.attention.self.value",
        "attn_out": "segformer.encoder.block.{stage}.{block}.attention.output.dense",
        "reduce": "segformer.encoder.block.{stage}.{block}.attention.self.sr",
        "reduce_norm": "segformer.encoder.block.{stage}.{block}.attention.self.layer_norm",
        "ffn_norm": "segformer.encoder.block.{stage}.{block}.layer_norm_2",
        "fc1": "segformer.encoder.block.{stage}.{block}.mlp.dense1",
        "pos": "segformer.encoder.block.{stage}.{block}.mlp.dwconv.dwconv",
        "fc2": "segformer.encoder.block.{stage}.{block}.mlp.dense2",
        "decoder_proj": "decode_head.linear_c.{stage}.proj",
        "fuse_conv": "decode_head.linear_fuse",
        "fuse_norm": "decode_head.batch_norm",
        "classifier": "decode_head.classifier",
    },
}

_LEAVES = "weight|bias|running_mean|running_var|num_batches_tracked"


def _patterns(layout: str) -> list[tuple[re.Pattern[str], str]]:
    """(regex of a full key, part name) for every part of ``layout``; the regex captures stage, block, leaf."""
    compiled = []
    for part, template in LAYOUTS[layout].items():
        body = re.escape(template).replace(r"\{stage\}", r"(?P<stage>\d+)").replace(r"\{block\}", r"(?P<block>\d+)")
        compiled.append((re.compile(rf"{body}\.(?P<leaf>{_LEAVES})"), part))
    return compiled


_PATTERNS = {layout: _patterns(layout) for layout in LAYOUTS}
Key = tuple[str, int, int, str]  # (part, stage, block, leaf); -1 where the part has no such index


def _parse(state_dict: Mapping[str, torch.Tensor], layout: str) -> dict[Key, torch.Tensor]:
    """The tensors of ``state_dict`` under logical keys; ValueError listing keys ``layout`` does not know."""
    parsed: dict[Key, torch.Tensor] = {}
    unknown = []
    for name, tensor in state_dict.items():
        for pattern, part in _PATTERNS[layout]:
            match = pattern.fullmatch(name)
            if match:
                stage = int(match.group("stage")) if "stage" in pattern.groupindex else -1
                block = int(match.group("block")) if "block" in pattern.groupindex else -1
                parsed[(part, stage, block, match.group("leaf"))] = tensor
                break
        else:
            unknown.append(name)
    if unknown:
        shown = ", ".join(unknown[:8]) + (f" (+{len(unknown) - 8} more)" if len(unknown) > 8 else "")
        raise ValueError(f"not a {layout} SegFormer state dict: unexpected key(s) {shown}")
    return parsed


def _format(parsed: Mapping[Key, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    templates = LAYOUTS[layout]
    return {
        f"{templates[part].format(stage=stage, block=block)}.{leaf}": tensor
        for (part, stage, block, leaf), tensor in parsed.items()
    }


def _to_zoo(state_dict: Mapping[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    parsed = _parse(state_dict, layout)
    merged: dict[Key, torch.Tensor] = {}
    for (part, stage, block, leaf), tensor in parsed.items():
        if part == "v":
            continue
        if part == "k":
            value = parsed.get(("v", stage, block, leaf))
            if value is None:
                raise ValueError(
                    f"{layout} SegFormer state dict has a key projection but no value projection "
                    f"({leaf}) in stage {stage} block {block}"
                )
            merged[("kv", stage, block, leaf)] = torch.cat([tensor, value], dim=0)
        elif part == "decoder_proj" and leaf == "weight":
            merged[(part, stage, block, leaf)] = tensor.reshape(*tensor.shape, 1, 1)
        else:
            merged[(part, stage, block, leaf)] = tensor
    orphans = [key for key in parsed if key[0] == "v" and ("k",) + key[1:] not in parsed]
    if orphans:
        raise ValueError(f"{layout} SegFormer state dict has value projections without key projections: {orphans[:4]}")
    return _format(merged, "zoo")


def _from_zoo(state_dict: Mapping[str, torch.Tensor], layout: str) -> dict[str, torch.Tensor]:
    split: dict[Key, torch.Tensor] = {}
    for (part, stage, block, leaf), tensor in _parse(state_dict, "zoo").items():
        if part == "kv":
            key, value = tensor.chunk(2, dim=0)
            split[("k", stage, block, leaf)] = key.clone()
            split[("v", stage, block, leaf)] = value.clone()
        elif part == "decoder_proj" and leaf == "weight":
            split[(part, stage, block, leaf)] = tensor.reshape(tensor.shape[0], tensor.shape[1])
        else:
            split[(part, stage, block, leaf)] = tensor
    return _format(split, layout)


def from_libreyolo(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A LibreYOLO 1.6.0 ``LibreSegformerNet`` state dict in zoo's keys."""
    return _to_zoo(state_dict, "libreyolo")


def to_libreyolo(size: str, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Zoo's SegFormer state dict in LibreYOLO 1.6.0's keys (``size`` is the same in both; kept for the API)."""
    del size  # one key layout serves every size
    return _from_zoo(state_dict, "libreyolo")


def from_upstream(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Hugging Face ``SegformerForSemanticSegmentation`` state dict in zoo's keys."""
    return _to_zoo(state_dict, "upstream")


def to_upstream(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Zoo's SegFormer state dict in the Hugging Face layout."""
    return _from_zoo(state_dict, "upstream")


def convert(size: str, state_dict: Mapping[str, torch.Tensor], source: str, target: str) -> dict[str, torch.Tensor] | None:
    """The registry ``converter`` of segformer: ``state_dict`` from layout ``source`` to ``target`` (one of
    them ``"zoo"``, the other ``"libreyolo"`` or ``"upstream"``); None for any other pair."""
    del size  # one key layout serves every size
    if target == "zoo" and source in ("libreyolo", "upstream"):
        return _to_zoo(state_dict, source)
    if source == "zoo" and target in ("libreyolo", "upstream"):
        return _from_zoo(state_dict, target)
    return None

