"""One rank's run, and what is decided once per run before any rank trains.

``prepare_run`` resolves the dataset (E17), the input size and the global batch (E5, E7) exactly
once: in the parent before spawning, or on rank 0 of a torchrun launch, which shares the answer
with the other ranks. ``run_rank`` is the code every rank runs, whatever started it: it joins the
process group, rebuilds the model from its ``ModelSpec`` through the plugin manager it is given,
fits the head to the dataset's classes and hands the loop to the ``Trainer``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zoo_core import __version__
from zoo_core.engine.autobatch import accumulation_steps, check_divisible, global_batch_from_probe, probe_batch_size
from zoo_core.engine.config import TrainConfig
from zoo_core.engine.distributed import DistributedContext, init_distributed, single_process_context, torchrun_environment
from zoo_core.engine.recipe import TrainingRecipe
from zoo_core.engine.resume import read_training_checkpoint
from zoo_core.engine.seeding import class_head_seed, seed_everything
from zoo_core.engine.spec import FitOutcome, ModelSpec, PreparedRun, build_from_spec
from zoo_core.engine.trainer import RankSetup, Trainer
from zoo_core.errors import ArgumentError
from zoo_core.registry import image_size_hw
from zoo_core.tasks.base import DataSpec
from zoo_core.tasks.runner import check_image_size, one_class_data
from zoo_core.weights import read_weights

if TYPE_CHECKING:
    from zoo_core.plugin_manager import ZooPluginManager
    from zoo_core.tasks.base import Task

__all__ = ["prepare_run", "run_rank", "adapt_to_dataset"]


def prepare_run(spec: ModelSpec, config: TrainConfig, *, recipe: TrainingRecipe, context: DistributedContext,
                world_size: int, manager: "ZooPluginManager") -> PreparedRun:
    """Resolve the data, input size and global batch once (rank 0 measures autobatch and shares it).

    ``world_size`` is the size of the run being prepared: the parent of a spawn prepares for its
    future workers from a one-process ``context``. A global batch the user gave is checked against it
    here, before the data is prepared, and only here (E5); an autobatch is a multiple of it by construction.
    """
    training_build_options(config, recipe.task)  # a dropout the task does not take is refused before any worker starts
    if config.batch != -1:
        check_divisible(config.batch, world_size)
    data = context.compute_on_main(lambda: recipe.task.prepare(config.data))
    if config.single_cls:
        data = one_class_data(data, recipe.task)
    image_size = check_image_size(config.imgsz or spec.input_size, recipe.input_size_multiple(), spec.task)
    multi_scale = config.multi_scale and config.augment
    if multi_scale and not recipe.task.supports_multi_scale:
        raise ArgumentError(f"multi_scale=True: {spec.task!r} models train at one size; remove multi_scale "
                            "(it is for detection)")
    batch = config.batch
    if batch == -1:
        per_device = 0
        if context.is_main:
            model = build_from_spec(spec, manager)
            # The batch must fit at the largest size a multi-scale run can draw.
            probe_size = max(recipe.multi_scale_sizes(max(image_size_hw(image_size)))) if multi_scale else image_size
            per_device = probe_batch_size(model, recipe, probe_size, context.device, max(spec.num_classes, 1))
        per_device = context.broadcast_int(per_device)  # one long tensor from rank 0 (E7)
        batch = global_batch_from_probe(per_device, world_size, config.nbs)  # a multiple of world_size
    return PreparedRun(data, image_size, batch, accumulation_steps(batch, config.nbs))


def training_build_options(config: TrainConfig, task: "Task") -> dict[str, Any]:
    """The build options a training argument sets: ``dropout`` as the task's ``dropout_option``; ``ArgumentError`` for a
    task it does not apply to."""
    if config.dropout == 0:
        return {}
    if task.dropout_option is None:
        raise ArgumentError(f"dropout={config.dropout}: dropout before the classifier layer is for classification models; "
                            f"{task.name!r} models do not take it (remove dropout)")
    return {task.dropout_option: config.dropout}


def adapt_to_dataset(spec: ModelSpec, data: DataSpec, manager: "ZooPluginManager", *, seed: int,
                     report: bool, build_options: dict[str, Any] | None = None) -> tuple[nn.Module, ModelSpec]:
    """``spec``'s model with a head for ``data``'s classes, and the spec of that model.

    With the same number of classes the model is returned as built. Otherwise the model is built for
    the new class count and every tensor whose name and shape both models share is carried over from
    ``spec``'s weights; only the class-dependent tensors start fresh (``report``: print which). They
    are drawn from a generator of the run's ``seed`` alone, so no draw made earlier in the process
    (another model's initialisation, another test) changes them. A model the caller built fresh
    (``spec.source`` is None: no file it was loaded from) reports that it is randomly initialised
    instead: nothing of it is "kept" from pretraining. ``build_options`` (the training arguments' own, such as the
    classifier's dropout) are built in too.
    """
    if report and spec.source is None:
        classes = data.num_classes if data.names else spec.num_classes
        print(f"{spec.name}: randomly initialised (built fresh, no weights file), {classes} classes", flush=True)
    # A dataset may also fix build options (the pose task: the number of keypoints and their skeleton).
    options = {**spec.options, **dict(data.extra.get("model_options") or {}), **(build_options or {})}
    if (not data.names or data.num_classes == spec.num_classes) and options == dict(spec.options):
        names = dict(data.names) if data.names else dict(spec.names)
        return build_from_spec(spec, manager), spec.replace(names=names)
    num_classes = data.num_classes if data.names else spec.num_classes
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(class_head_seed(seed))
        adapted = manager.build_model(spec.family, spec.size, num_classes, options)
    trained = read_weights(spec.weights)[0] if spec.weights is not None else build_from_spec(spec, manager).state_dict()
    wanted = adapted.state_dict()
    kept = {key: value for key, value in trained.items() if key in wanted and wanted[key].shape == value.shape}
    adapted.load_state_dict(kept, strict=False)
    fresh = [key for key in wanted if key not in kept]
    if report and fresh and spec.source is not None:  # fine-tuning what spec.source held
        print(f"{spec.name}: {spec.num_classes} -> {num_classes} classes; kept {len(kept)} of {len(wanted)} tensors "
              f"of {spec.source.name}, re-initialised the class-dependent ones: {', '.join(fresh)}", flush=True)
    return adapted, spec.replace(num_classes=num_classes, names=dict(data.names) if data.names else dict(spec.names), options=options)


def run_rank(spec: ModelSpec, config: TrainConfig, *, device: torch.device, manager: "ZooPluginManager",
             prepared: PreparedRun | None = None, resume_from: Path | None = None) -> FitOutcome:
    """Train as this process's rank (or as the only process) and return the outcome on every rank.

    ``prepared`` comes from a spawning parent; without it (torchrun, one device) this rank takes
    part in ``prepare_run`` itself.
    """
    context = init_distributed(device, config.ddp_timeout) if torchrun_environment() else single_process_context(device)
    try:
        recipe = manager.training_recipe(spec.family, spec.size)
        recipe.task.input_pipeline = recipe.task.input_pipeline.merged(spec.input_pipeline)  # what the weights record
        if prepared is None:
            prepared = prepare_run(spec, config, recipe=recipe, context=context, world_size=context.world_size, manager=manager)
        seed_everything(config.seed)
        checkpoint = read_training_checkpoint(resume_from) if resume_from is not None else None
        model, trained_spec = adapt_to_dataset(spec, prepared.data, manager, seed=config.seed,
                                               report=context.is_main and config.verbose,
                                               build_options=training_build_options(config, recipe.task))
        if checkpoint is not None:
            model.load_state_dict(checkpoint["train_model"])
        trained_spec = trained_spec.replace(input_size=prepared.image_size, weights=None, source=None)
        sync_bn = config.sync_bn if config.sync_bn is not None else manager.default_sync_bn(spec.family)
        trainer = Trainer(RankSetup(
            model=model, meta=dataclasses.replace(trained_spec.meta(__version__), data=str(config.data)), recipe=recipe,
            prepared=prepared, config=config, context=context, sync_bn=sync_bn, checkpoint=checkpoint,
        ))
        result = trainer.fit()
        weights = trainer.shared_best_weights(result)
        return FitOutcome(result=result, spec=trained_spec.replace(weights=result.best), state_dict=weights)
    finally:
        context.close()

