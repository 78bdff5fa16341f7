"""The task- and family-agnostic training loop of one rank.

The ``Trainer`` knows neither task nor family: datasets, batches and metrics come from the task
(``zoo_core/tasks/base.py``); the forward pass, parameter groups, optimizer, schedule, EMA,
augmentation and training events come from the family's ``TrainingRecipe``
(``zoo_core/engine/recipe.py``). Rank 0 owns every side effect (E9): the run directory,
checkpoints, logs, plots and callbacks; decisions that end training are broadcast from it (E19).
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from zoo_core.data.damaged import DAMAGED_KEY, CountDamaged, SkipDamagedImages
from zoo_core.data.image_cache import CachedImages, cache_mode
from zoo_core.data.loader_workers import loader_start_method
from zoo_core.engine.callbacks import CallbackList, make_loggers
from zoo_core.engine.checkpoint import CheckpointWriter, snapshot, write_lean_best
from zoo_core.engine.config import TrainConfig
from zoo_core.engine.distributed import DistributedContext
from zoo_core.engine.ema import ModelEMA
from zoo_core.engine.freezing import freeze_parameters
from zoo_core.engine.multi_scale import scaled_size
from zoo_core.engine.precision import Precision, training_precision
from zoo_core.engine.progress import EpochProgress, validation_progress
from zoo_core.engine.recipe import RunInfo, TrainingRecipe
from zoo_core.engine.resume import elastic_run_identity
from zoo_core.engine.schedule import LRSchedule
from zoo_core.engine.spec import PreparedRun
from zoo_core.engine.seeding import loader_generator, loader_seed, seed_everything, seed_worker
from zoo_core.engine.sync_batchnorm import convert_sync_batchnorm, has_batchnorm
from zoo_core.engine.train_result import EpochReport, TrainResult
from zoo_core.engine.validation import shown_losses, validation_losses
from zoo_core.errors import ArgumentError, BatchSizeError, RunDirectoryError, TrainingDivergedError, TrainingWarning, warn
from zoo_core.registry import ImageSize, image_size_hw
from zoo_core.reports.results_plot import plot_results
from zoo_core.reports.validation_report import BATCHES_DRAWN, ValidationReport
from zoo_core.run_dirs import RunDirectoryClaim, claim_run_dir, next_run_dir
from zoo_core.tasks.base import AugmentSettings, DataSpec
from zoo_core.weights import ModelMeta

__all__ = ["RankSetup", "Trainer", "SMALL_BATCH_WARNING"]

log = logging.getLogger("zoo.train")

SMALL_BATCH_WARNING = (
    "the model has BatchNorm, sync_bn is off and each rank trains at batch {per_rank} (< 16): per-rank "
    "BatchNorm statistics this small can hurt the converged model. Pass sync_bn=True (on CPU ranks on one "
    "machine it adds about a quarter to the step time, docs/multi-gpu.md), or a larger batch."
)
_STOP_EARLY = 1
_STOP_DIVERGED = 2


def console(context: DistributedContext, config: TrainConfig, message: str) -> None:
    """Print ``message`` on rank 0 when ``verbose`` (the one place the trainer talks to users)."""
    if context.is_main and config.verbose:
        print(message, flush=True)


@dataclass
class Loaders:
    """A rank's training loader (with its sampler and generator) and validation loader."""

    train: DataLoader
    sampler: DistributedSampler
    generator: torch.Generator
    val: DataLoader | None
    train_set: Any
    base_set: Any  # the task's dataset itself (close_mosaic lives there)


@dataclass
class Optimisation:
    """What one optimisation step touches: the (wrapped) model, optimizer, schedule, scaler, EMA and precision."""

    model: nn.Module  # unwrapped: parameters, checkpoints, family methods
    wrapped: nn.Module  # what forward passes go through (DDP under several ranks)
    optimizer: torch.optim.Optimizer
    schedule: LRSchedule
    scaler: torch.amp.GradScaler
    ema: ModelEMA | None
    precision: Precision

    @property
    def evaluated(self) -> nn.Module:
        """The weights validated and deployed: the EMA when there is one."""
        return self.ema.module if self.ema is not None else self.model


@dataclass(frozen=True)
class RankSetup:
    """Everything one rank's ``Trainer`` starts from, decided by ``run_rank`` before the loop.

    ``model`` is already adapted to the dataset's classes; ``meta`` describes it for checkpoints;
    ``prepared`` holds the data, input size, global batch and micro-batches per optimizer step;
    ``sync_bn`` is the resolved E8 choice; ``checkpoint`` the training checkpoint a resumed run
    continues (None for a new run).
    """

    model: nn.Module
    meta: ModelMeta
    recipe: TrainingRecipe
    prepared: PreparedRun
    config: TrainConfig
    context: DistributedContext
    sync_bn: bool
    checkpoint: dict[str, Any] | None = None


class Trainer:
    """One rank's training run: loaders, optimisation, validation, checkpoints and callbacks."""

    def __init__(self, setup: RankSetup) -> None:
        self.model = setup.model
        self.meta = setup.meta
        self.recipe = setup.recipe
        self.task = setup.recipe.task
        self.data: DataSpec = setup.prepared.data
        self.config = setup.config
        self.context = setup.context
        self.batch = setup.prepared.batch  # global, over all ranks
        self.accumulate = setup.prepared.accumulate
        self.image_size: ImageSize = setup.prepared.image_size
        self.sync_bn = setup.sync_bn
        self.checkpoint = setup.checkpoint
        self.device = setup.context.device
        self.channels_last = setup.recipe.uses_channels_last(self.device)
        self.history: list[dict[str, Any]] = []
        self.best_fitness: float | None = None
        self.best_epoch: int | None = None
        self.best_metrics: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.optimizer_steps = 0
        self.augmentation_closed = False
        self.augment = AugmentSettings(enabled=False)  # the run's augmentation, from the recipe (see _loaders)
        self.multi_scale_sides: tuple[int, ...] = ()
        self.checkpoints = CheckpointWriter()
        self.best_weights: dict[str, torch.Tensor] | None = None
        self.first_epoch = 0
        self.run_dir = Path()
        self.claim: RunDirectoryClaim | None = None  # rank 0's lock on the run folder while it trains
        self.callbacks = CallbackList([])

    # ----------------------------------------------------------------- set-up
    def _run_directory(self) -> Path:
        """The run folder, created and claimed on rank 0 (every rank gets its name, or rank 0's error).

        The claim (``run_dirs.claim_run_dir``) keeps a second run out of the folder while this one
        trains, with or without ``exist_ok`` and for a resume too; stale temp files of a writer killed
        mid-write are removed only once the folder is ours.
        """
        def claimed() -> Path:
            if self.checkpoint is not None:
                run_dir = Path(self.checkpoint["run_dir"])
                try:
                    run_dir.mkdir(parents=True, exist_ok=True)
                except OSError as error:
                    raise RunDirectoryError(f"cannot create the run folder {run_dir} to resume into "
                                            f"({error.strerror or error})") from None
            else:
                run_dir = next_run_dir(self.meta.task, self.config.name, self.config.project, exist_ok=self.config.exist_ok)
            self.claim = claim_run_dir(run_dir)
            try:
                (run_dir / "weights").mkdir(parents=True, exist_ok=True)
                for stale in (run_dir / "weights").glob(".*.tmp"):  # left by a process killed mid-write
                    stale.unlink(missing_ok=True)
            except OSError as error:
                self._release_claim()
                raise RunDirectoryError(f"cannot write in the run folder {run_dir} ({error.strerror or error}); "
                                        "choose a writable project=, or fix the folder's permissions") from None
            return run_dir

        return Path(self.context.compute_on_main(claimed))

    def _release_claim(self) -> None:
        if self.claim is not None:
            self.claim.release()
            self.claim = None

    def _placed_model(self) -> nn.Module:
        """The model on this rank's device, frozen where ``freeze`` says, with SyncBatchNorm where E8 asks for it."""
        config, context = self.config, self.context
        model = self.model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)  # oneDNN's faster convolutions on a CPU
        if config.freeze is not None:
            frozen = freeze_parameters(model, config.freeze, run_forward=lambda: self._example_forward(model))
            console(context, config, frozen.describe(config.freeze))
        if context.distributed and has_batchnorm(model):
            per_rank = self.batch // context.world_size
            if self.sync_bn:
                model = convert_sync_batchnorm(model, self.device, timeout_seconds=config.ddp_timeout)
            elif per_rank < 16 and context.is_main:
                warn(SMALL_BATCH_WARNING.format(per_rank=per_rank), TrainingWarning)
        if config.cuda_graph:
            if context.distributed:
                console(context, config, "cuda_graph=True is not used under DDP; training eagerly")
            elif self.device.type != "cuda":
                console(context, config, "cuda_graph=True needs a CUDA device; training eagerly")
        return model

    def _check_batch_norm_batch(self, images_per_step: int, dataset_size: int) -> None:
        """BatchNorm cannot train on one value per channel: refuse one image per rank before the first step."""
        if images_per_step >= 2 or not has_batchnorm(self.model):
            return
        if self.sync_bn and self.context.distributed and images_per_step * self.context.world_size >= 2:
            return  # SyncBatchNorm computes the statistics over the global batch
        world = self.context.world_size
        raise BatchSizeError(
            f"each rank would train {self.meta.family}-{self.meta.size} on {images_per_step} image per step (global "
            f"batch {self.batch} over {world} rank{'s' if world > 1 else ''}, {dataset_size} training images), but its "
            f"BatchNorm layers need at least 2 images to train. Use a larger batch (at least {2 * world}), more "
            "training images, or sync_bn=True to compute the statistics over all ranks."
        )

    def _cache_images(self, dataset: Any, split: str) -> None:
        """``cache=ram|disk``: decode ``dataset``'s images now, once, instead of every epoch (zoo_core/data/image_cache.py)."""
        mode = cache_mode(self.config.cache)
        if mode is None:
            return
        if not isinstance(dataset, CachedImages):
            raise ArgumentError(f"cache={self.config.cache!r}: {self.task.name!r} datasets are read as they are; remove cache")
        started = time.perf_counter()
        cache = dataset.cache_images(mode)
        held = f", {cache.bytes / 1e6:.1f} MB in RAM" if mode == "ram" else " as .npy files"
        console(self.context, self.config, f"{split}: cached {len(dataset.cached_paths())} images{held} in "
                f"{time.perf_counter() - started:.1f} s")

    def _loaders(self) -> Loaders:
        from zoo_core.data.sampling import InferenceShardSampler

        config, context = self.config, self.context
        self.augment = self.recipe.augment_settings(config)
        self.multi_scale_sides = self._multi_scale_sides()
        base_set = self.task.dataset(self.data, "train", self.image_size, self.augment)
        self._cache_images(base_set, "train")
        train_set: Any = base_set
        if config.fraction < 1:
            train_set = Subset(train_set, range(max(1, int(len(train_set) * config.fraction))))
        train_set = SkipDamagedImages(train_set)
        # One sampler for every world size: ranks take interleaved slices of one shuffled order,
        # so N ranks at batch B/N see exactly the images one process sees at batch B (E6).
        sampler = DistributedSampler(train_set, num_replicas=context.world_size, rank=context.rank, shuffle=True, seed=config.seed)
        generator = loader_generator(config.seed, context.rank, 0)
        loader_options = dict(
            num_workers=config.workers, collate_fn=self.task.collate, pin_memory=self.device.type == "cuda",
            worker_init_fn=seed_worker, multiprocessing_context=loader_start_method(config.workers),
        )
        per_rank_batch = self.batch // context.world_size
        # A last batch of one image breaks BatchNorm in training: drop the incomplete batch whenever a
        # full one exists (the sampler reshuffles every epoch, so every image is still used).
        drop_last = len(sampler) >= per_rank_batch
        train_loader = DataLoader(train_set, batch_size=per_rank_batch, sampler=sampler, generator=generator,
                                  drop_last=drop_last, **{**loader_options, "collate_fn": CountDamaged(self.task.collate)})
        val_loader = None
        if config.val:
            val_set = self.task.dataset(self.data, "val", self.image_size, None)
            self._cache_images(val_set, "val")
            val_loader = DataLoader(val_set, batch_size=max(per_rank_batch, 1) * 2,
                                    sampler=InferenceShardSampler(len(val_set), context.rank, context.world_size),
                                    **loader_options)
        self._check_batch_norm_batch(min(per_rank_batch, len(sampler)), len(train_set))
        return Loaders(train_loader, sampler, generator, val_loader, train_set, base_set)

    def _example_forward(self, model: nn.Module) -> None:
        """One training forward pass of two synthetic images at the run's size (freeze=N's block order)."""
        side = min(image_size_hw(self.image_size))
        batch = self.task.preprocess(self.task.example_batch(2, side, max(len(self.data.names), 1)), self.device)
        self.recipe.forward_train(model.train(), batch)

    def _optimisation(self, model: nn.Module, iterations_per_epoch: int) -> Optimisation:
        config, context, recipe = self.config, self.context, self.recipe
        steps = math.ceil(iterations_per_epoch / self.accumulate) * config.epochs
        optimizer = recipe.build_optimizer(model, config, iterations=steps, images_per_step=self.batch * self.accumulate)
        schedule = recipe.lr_schedule(config, iterations_per_epoch, optimizer)
        precision = training_precision(self.device, config.amp)
        scaler = torch.amp.GradScaler("cuda", enabled=precision.scales_loss)
        if context.distributed:
            wrapped: nn.Module = DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=config.find_unused_parameters,
            )
        else:
            wrapped = model
        cuda_graphs = config.cuda_graph and self.device.type == "cuda" and not context.distributed
        if config.compile or cuda_graphs:
            # compiling the DDP wrapper lets dynamo split the graph at gradient buckets (its DDPOptimizer)
            wrapped = torch.compile(wrapped, mode="reduce-overhead" if cuda_graphs else None)
        # The EMA starts after DDP has broadcast rank 0's weights, so every rank averages the same thing.
        ema = recipe.build_ema(model, config)
        return Optimisation(model, wrapped, optimizer, schedule, scaler, ema, precision)

    def _restore(self, state: Optimisation) -> int:
        """Continue from ``self.checkpoint`` (E16); returns the first epoch to run."""
        checkpoint = self.checkpoint
        if checkpoint is None:
            return 0
        state.optimizer.load_state_dict(checkpoint["optimizer"])
        if checkpoint.get("scaler"):
            state.scaler.load_state_dict(checkpoint["scaler"])
        if state.ema is not None and checkpoint.get("ema_updates"):
            state.ema.load_state_dict({"weights": checkpoint["model"], "updates": checkpoint["ema_updates"]})
        self.best_fitness = checkpoint.get("best_fitness")
        self.best_epoch = checkpoint.get("best_epoch")
        self.history = list(checkpoint.get("history", []))
        self.best_metrics = dict(checkpoint.get("best_metrics", {}))
        self.optimizer_steps = int(checkpoint.get("optimizer_steps", 0))
        return int(checkpoint["epoch"]) + 1

    # ----------------------------------------------------------------- loop
    def fit(self) -> TrainResult:
        """Train for ``config.epochs`` (or until a stop decision) and return the result on every rank.

        A run that fails before its first checkpoint removes the run directory it created.
        """
        self.run_dir = self._run_directory()
        fresh_directory = self.checkpoint is None and not self.config.exist_ok
        try:
            return self._fit()
        except BaseException:
            if self.context.is_main and fresh_directory and not any((self.run_dir / "weights").glob("*.pt")):
                shutil.rmtree(self.run_dir, ignore_errors=True)  # nothing worth keeping: no checkpoint was written
            raise
        finally:
            self._release_claim()  # after the last write (fit waits for the checkpoint writer)

    def _fit(self) -> TrainResult:
        config, context = self.config, self.context
        started = time.monotonic()
        weights_dir = self.run_dir / "weights"
        model = self._placed_model()
        loaders = self._loaders()
        iterations_per_epoch = len(loaders.train)
        state = self._optimisation(model, iterations_per_epoch)
        start_epoch = self.first_epoch = self._restore(state)
        self.callbacks = CallbackList([*make_loggers(config.loggers), *config.callbacks] if context.is_main else [])
        if context.is_main:
            (self.run_dir / "args.yaml").write_text(_as_yaml(config.for_checkpoint()), encoding="utf-8")
            self.callbacks.fire("on_train_start", self.run_dir, config.for_checkpoint())
            if config.plots and start_epoch == 0:
                self.task.plot_training_set(loaders.base_set, self.run_dir)
        group = state.optimizer.param_groups[0]
        console(
            context, config,
            f"training {self.meta.family}-{self.meta.size} on {len(loaders.train_set)} images, {config.epochs} epochs, "
            f"batch {self.batch} ({context.world_size} rank{'s' if context.world_size > 1 else ''} x {self.batch // context.world_size})"
            f", accumulate {self.accumulate}, {type(state.optimizer).__name__} lr {group['initial_lr']:g} -> {self.run_dir}",
        )
        self.recipe.on_train_start(model, self._run_info(start_epoch, iterations_per_epoch))
        profile_steps = self._profiler_steps()
        stopped_early = False
        epoch = start_epoch - 1
        try:
            for epoch in range(start_epoch, config.epochs):
                epoch_started = time.monotonic()
                run = self._run_info(epoch, iterations_per_epoch)
                self._start_epoch(loaders, model, run)
                state.wrapped.train()
                loss_sums, batches_seen, damaged = self._train_epoch(state, loaders.train, epoch, profile_steps)
                profile_steps = 0
                totals = context.all_reduce_sum([batches_seen, damaged, *loss_sums.values()])
                losses = {name: value / max(totals[0], 1) for name, value in zip(loss_sums, totals[2:])}
                metrics: dict[str, float] = {}
                val_losses: dict[str, float] = {}
                if loaders.val is not None:
                    evaluated = state.evaluated
                    evaluated.eval()
                    context.broadcast_buffers(evaluated)  # rank 0's statistics, which the checkpoint keeps
                    batches = validation_progress(loaders.val, enabled=context.is_main and config.verbose)
                    metrics = self.task.validate(evaluated, batches, self.device, self.meta.names)
                    val_losses = self._validation_losses(evaluated, loaders.val, list(losses))
                self.last_metrics = metrics
                if self._end_epoch(state, epoch, losses, metrics, seconds=time.monotonic() - epoch_started,
                                   started=started, damaged=int(totals[1]), val_losses=val_losses):
                    stopped_early = epoch + 1 < config.epochs
                    break
        finally:
            # Also on an interrupt or a failure: the last reported epoch's checkpoint reaches the disk.
            self.checkpoints.wait(raise_error=sys.exc_info()[0] is None)
        result = self._result(epoch + 1, stopped_early, weights_dir)
        if config.plots and loaders.val is not None and result.best_epoch is not None:
            self._report_best(state, loaders, result)
        self._make_best_lean(result)
        if context.is_main:
            if config.plots:
                plot_results(self.run_dir / "results.csv")
            self.callbacks.fire("on_train_end", result)
            console(context, config, f"{'stopped early' if stopped_early else 'done'}: {_format_metrics(result.metrics)} -> {self.run_dir}")
        return result

    def _validation_losses(self, model: nn.Module, loader: DataLoader, names: list[str]) -> dict[str, float]:
        """The epoch's training losses measured on the validation set (averaged over all ranks' batches)."""
        totals = self.context.all_reduce_sum(validation_losses(model, loader, self.recipe, self.device, names))
        batches = totals[-1]
        return {name: value / batches for name, value in zip(names, totals)} if batches else {}

    def _report_best(self, state: Optimisation, loaders: Loaders, result: TrainResult) -> None:
        """Validate ``best.pt`` once more, drawing its report (confusion matrix, curves, batches) into the run directory."""
        model = state.evaluated
        model.load_state_dict(self.shared_best_weights(result))
        model.eval()
        report = ValidationReport(self.run_dir, write=self.context.is_main)
        batches = validation_progress(loaders.val, enabled=self.context.is_main and self.config.verbose)
        metrics = self.task.validate(model, batches, self.device, self.meta.names, report=report)
        table = getattr(metrics, "class_table", None)
        if table is not None:  # Ultralytics prints best.pt's per-class table when training ends
            console(self.context, self.config, table.format())

    def _make_best_lean(self, result: TrainResult) -> None:
        """Rank 0 rewrites the final ``best.pt`` lean (``checkpoint.write_lean_best``).

        Every rank first reads the full-precision best weights (what the caller receives, so a frozen
        layer stays bit for bit what it was); the barrier keeps rank 0 from replacing the file while
        another rank is still about to read it.
        """
        self.shared_best_weights(result)
        self.context.barrier()
        if self.context.is_main and result.best.is_file():
            write_lean_best(result.best)

    def _draw_training_batch(self, batch: dict[str, Any], index: int) -> None:
        """``train_batch<index>.jpg``: what the model is fed after augmentation (rank 0, first epoch, first batches)."""
        from zoo_core.reports.drawing import save_image

        drawn = self.task.draw_batch(batch, self.meta.names)
        if drawn is not None:
            save_image(drawn, self.run_dir / f"train_batch{index}.jpg")

    def _run_info(self, epoch: int, iterations_per_epoch: int) -> RunInfo:
        return RunInfo(epoch, self.config.epochs, iterations_per_epoch, self.context.rank, self.context.world_size)

    def _start_epoch(self, loaders: Loaders, model: nn.Module, run: RunInfo) -> None:
        """Seeds (E10), the sampler's epoch, and the recipe's epoch events (no-augmentation phase included)."""
        config, context = self.config, self.context
        if not self.augmentation_closed and run.epoch >= config.epochs - config.close_mosaic:  # also when resumed past it
            self.augmentation_closed = True
            self.augment = self.recipe.closed_augmentation(self.augment)
            update_augmentation = getattr(loaders.base_set, "update_augmentation", None)
            if callable(update_augmentation):
                update_augmentation(self.augment)
            self.recipe.on_augmentation_closed(model, run)
        self.recipe.on_epoch_start(model, run)
        seed_everything(config.seed, context.rank, run.epoch)
        loaders.generator.manual_seed(loader_seed(config.seed, context.rank, run.epoch))
        loaders.sampler.set_epoch(run.epoch)

    def _profiler_steps(self) -> int:
        if not self.config.profile:
            return 0
        if self.context.distributed:
            if self.context.is_main:
                warn("profile=True is ignored under DDP; profile a single-device run")
            return 0
        return 10

    def _train_epoch(self, state: Optimisation, loader: DataLoader, epoch: int, profile_steps: int) -> tuple[dict[str, float], int, int]:
        """One pass over ``loader``: the per-step loop with accumulation, clipping, AMP and EMA.

        Returns the summed loss items, the batches seen and the damaged images skipped.
        """
        config, context = self.config, self.context
        batches = len(loader)
        loss_sums: dict[str, torch.Tensor] = {}
        profiler = self._start_profiler(profile_steps)
        progress = EpochProgress(loader, description=f"epoch {epoch + 1}/{config.epochs}",
                                 enabled=context.is_main and config.verbose, batch_size=self.batch // context.world_size)
        state.optimizer.zero_grad(set_to_none=True)
        seen = damaged = 0
        draw_batches = context.is_main and config.plots and epoch == self.first_epoch
        for index, batch in enumerate(progress):
            state.schedule.apply(state.optimizer, index + batches * epoch)
            damaged += len(batch.pop(DAMAGED_KEY, ()))
            if draw_batches and index < BATCHES_DRAWN:
                self._draw_training_batch(batch, index)
            batch = self.task.preprocess(batch, self.device)
            if self.augment.enabled and self.augment.multi_scale:
                batch = self._at_random_scale(batch)
            if self.channels_last:
                batch["images"] = batch["images"].contiguous(memory_format=torch.channels_last)
            group_start = (index // self.accumulate) * self.accumulate
            group_size = min(self.accumulate, batches - group_start)
            step_now = index == group_start + group_size - 1
            # Gradients are all-reduced only on the micro-batch that ends an accumulation group.
            sync_context = state.wrapped.no_sync() if context.distributed and not step_now else contextlib.nullcontext()
            with sync_context:
                with torch.autocast(device_type=self.device.type, dtype=state.precision.dtype, enabled=state.precision.autocast):
                    loss, items = self.recipe.forward_train(state.wrapped, batch)
                # The loss is a per-sample mean: DDP's gradient averaging makes it the global mean (E6).
                state.scaler.scale(loss / group_size).backward()
            if step_now:
                self._step(state)
            seen += 1
            for name, value in shown_losses(loss, items).items():
                loss_sums[name] = loss_sums.get(name, 0) + value
            progress.update(index, loss_sums, seen, state.optimizer.param_groups[0]["lr"])
            if profiler is not None:
                profiler.step()
                if index + 1 >= profile_steps:
                    self._stop_profiler(profiler)
                    profiler = None
        if profiler is not None:
            self._stop_profiler(profiler)
        progress.close()
        return {name: float(value) for name, value in loss_sums.items()}, seen, damaged

    def _multi_scale_sides(self) -> tuple[int, ...]:
        """The recipe's multi-scale sizes for this run, less those below the model's ``minimum_input_size``."""
        side = max(image_size_hw(self.image_size))
        minimum = getattr(self.model, "minimum_input_size", 0)
        return tuple(size for size in self.recipe.multi_scale_sizes(side) if size >= minimum) or (side,)

    def _at_random_scale(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch`` resized to a size drawn from the multi-scale sizes (this rank's own draw)."""
        side = random.choice(self.multi_scale_sides)
        return self.task.resize_batch(batch, scaled_size(self.image_size, side, self.recipe.input_size_multiple()))

    def _step(self, state: Optimisation) -> None:
        """Unscale, clip, step, update the EMA and tell the step listeners."""
        state.scaler.unscale_(state.optimizer)
        if self.config.max_grad_norm:
            self._clip_gradients(state.model)
        state.scaler.step(state.optimizer)
        state.scaler.update()
        state.optimizer.zero_grad(set_to_none=True)
        if state.ema is not None:
            state.ema.update(state.model)
        self.optimizer_steps += 1
        for listener in self.callbacks.step_listeners:
            listener(self.optimizer_steps)

    def _clip_gradients(self, model: nn.Module) -> None:
        """Scale the gradients down to a total norm of ``max_grad_norm`` where it is larger.

        On a CPU reading the norm costs nothing, so gradients under the limit (most steps) skip
        the scaling pass; on an accelerator ``clip_grad_norm_`` scales by a clamped factor
        instead, without waiting for the device.
        """
        parameters = [parameter for parameter in model.parameters() if parameter.grad is not None]
        if self.device.type != "cpu":
            torch.nn.utils.clip_grad_norm_(parameters, self.config.max_grad_norm, foreach=True)
            return
        total = torch.nn.utils.get_total_norm([parameter.grad for parameter in parameters], foreach=True)
        if not total <= self.config.max_grad_norm:  # also scales (to NaN) a non-finite norm, as clip_grad_norm_ does
            torch.nn.utils.clip_grads_with_norm_(parameters, self.config.max_grad_norm, total, foreach=True)

    def _start_profiler(self, steps: int) -> Any:
        if steps <= 0:
            return None
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(activities=activities)
        profiler.__enter__()
        return profiler

    def _stop_profiler(self, profiler: Any) -> None:
        profiler.__exit__(None, None, None)
        if self.context.is_main:
            trace = self.run_dir / "profile_trace.json"
            profiler.export_chrome_trace(str(trace))
            console(self.context, self.config, f"profiler trace of the first steps: {trace}")

    # ----------------------------------------------------------------- end of epoch
    def _end_epoch(self, state: Optimisation, epoch: int, losses: dict[str, float], metrics: dict[str, float], *,
                   seconds: float, started: float, damaged: int = 0, val_losses: dict[str, float] | None = None) -> bool:
        """Rank 0 saves and reports; every rank then receives rank 0's stop decision (E19).

        A diverged epoch (non-finite losses or weights) writes nothing: the last finite
        ``last.pt`` and ``best.pt`` stay as they are.
        """
        config, context = self.config, self.context
        weights_dir = self.run_dir / "weights"
        decision = 0
        if context.is_main and self._diverged(losses, state):
            decision = _STOP_DIVERGED
        elif context.is_main:
            fitness = metrics.get(self.task.fitness_metric) if metrics else None
            # Strictly better only: a plateau counts towards patience, and best.pt keeps the first best epoch.
            is_best = fitness is not None and (self.best_fitness is None or fitness > self.best_fitness)
            if is_best:
                self.best_fitness, self.best_epoch, self.best_metrics = fitness, epoch + 1, dict(metrics)
            report = EpochReport(
                epoch=epoch + 1, epochs=config.epochs, losses=losses, val_losses=val_losses or {}, metrics=metrics,
                learning_rate=state.optimizer.param_groups[0]["lr"], fitness=fitness, is_best=is_best,
                seconds=seconds, run_dir=self.run_dir,
            )
            self.history.append(report.row())
            copies = [weights_dir / "best.pt"] if is_best or fitness is None else []
            if config.save_period > 0 and (epoch + 1) % config.save_period == 0:
                copies.append(weights_dir / f"epoch{epoch + 1}.pt")
            self.checkpoints.submit(snapshot(self._checkpoint(state, epoch)), weights_dir / "last.pt", copies)
            self.callbacks.fire("on_epoch_end", report, before_user=self.checkpoints.wait)
            console(
                context, config,
                f"epoch {epoch + 1}/{config.epochs}  " + "  ".join(f"{name} {value:.4f}" for name, value in losses.items())
                + (f"  {_format_metrics(metrics)}" if metrics else "") + f"  {report.seconds:.1f}s"
                + (f"  (skipped {damaged} damaged image{'s' if damaged != 1 else ''})" if damaged else ""),
            )
            decision = self._stop_reason(epoch, started)
        decision = context.broadcast_int(decision)
        if decision == _STOP_DIVERGED:
            self.checkpoints.wait(raise_error=False)
            last = weights_dir / "last.pt"
            if last.is_file():
                # Every rank raises this error and only rank 0 keeps the history: the checkpoint
                # on disk is the one of the epoch before this one on every rank.
                finite = (f"The last finite weights are in {last} (epoch {epoch}): start a new run from "
                          f"them with a lower lr0, LibreYOLO({str(last)!r}).train(..., lr0=...).")
            else:
                finite = "No earlier epoch finished, so there is no checkpoint to start from."
            raise TrainingDivergedError(
                f"training diverged in epoch {epoch + 1}: the loss or the weights became NaN or infinite, so this epoch "
                f"wrote no checkpoint. Lower lr0, keep max_grad_norm set, or check the data. {finite}"
            )
        return decision != 0

    def _diverged(self, losses: dict[str, float], state: Optimisation) -> bool:
        """Whether the epoch's losses or the weights (and their average) hold a NaN or an infinity."""
        if any(not math.isfinite(value) for value in losses.values()):
            return True
        modules = [state.model] + ([state.ema.module] if state.ema is not None else [])
        tensors = [tensor for module in modules for tensor in module.state_dict().values() if tensor.is_floating_point()]
        return bool(tensors) and not bool(torch.stack([tensor.isfinite().all() for tensor in tensors]).all())

    def _stop_reason(self, epoch: int, started: float) -> int:
        config = self.config
        if config.patience and self.best_epoch is not None and epoch + 1 - self.best_epoch >= config.patience:
            console(self.context, config, f"early stopping: no improvement in {config.patience} epochs (best epoch {self.best_epoch})")
            return _STOP_EARLY
        if config.time is not None and time.monotonic() - started >= config.time * 3600:
            console(self.context, config, f"time limit of {config.time} h reached")
            return _STOP_EARLY
        return 0

    def _checkpoint(self, state: Optimisation, epoch: int) -> dict[str, Any]:
        train_weights = _detached_state(state.model)
        return {
            # The deployable weights: the EMA when there is one (resume restores the EMA from here).
            "model": _detached_state(state.ema.module) if state.ema is not None else train_weights,
            "meta": self.meta.to_dict(),
            "train_model": train_weights,
            "ema_updates": state.ema.updates if state.ema is not None else 0,
            "optimizer": state.optimizer.state_dict(),
            "scaler": state.scaler.state_dict() if state.scaler.is_enabled() else None,
            "epoch": epoch,
            # The schedule is a function of the iteration: resuming needs nothing else to continue it.
            "iteration": (epoch + 1) * state.schedule.iterations_per_epoch,
            "best_fitness": self.best_fitness,
            "best_epoch": self.best_epoch,
            "best_metrics": self.best_metrics,
            "history": self.history,
            "config": self.config.for_checkpoint(),
            "run_dir": str(self.run_dir),
            "batch": self.batch,
            "accumulate": self.accumulate,
            "optimizer_steps": self.optimizer_steps,
            "world_size": self.context.world_size,
            # Which torchrun invocation wrote this, so an elastic restart finds its own run (resume.py).
            "elastic_run": elastic_run_identity(),
        }

    def _result(self, epochs_completed: int, stopped_early: bool, weights_dir: Path) -> TrainResult:
        result = None
        if self.context.is_main:
            result = TrainResult(
                run_dir=self.run_dir, best=weights_dir / "best.pt", last=weights_dir / "last.pt",
                metrics=self.best_metrics or self.last_metrics, best_fitness=self.best_fitness, best_epoch=self.best_epoch,
                epochs_completed=epochs_completed, stopped_early=stopped_early, world_size=self.context.world_size,
                batch=self.batch, accumulate=self.accumulate, history=list(self.history),
            )
        return self.context.broadcast_object(result)

    def shared_best_weights(self, result: TrainResult) -> dict[str, torch.Tensor]:
        """Rank 0's best weights on every rank (read from disk where it is visible, else sent); read once."""
        if self.best_weights is None:
            context = self.context
            readable = context.all_reduce_sum([1.0 if result.best.is_file() else 0.0])[0]
            if readable == context.world_size:
                self.best_weights = torch.load(result.best, map_location="cpu", weights_only=True)["model"]
            else:
                weights = torch.load(result.best, map_location="cpu", weights_only=True)["model"] if context.is_main else None
                self.best_weights = context.broadcast_object(weights)
        return self.best_weights


def _detached_state(model: nn.Module) -> dict[str, torch.Tensor]:
    # Tensors are copied by snapshot() before the background write; here only detach.
    return {key: value.detach() for key, value in model.state_dict().items()}


def _format_metrics(metrics: dict[str, float]) -> str:
    return "  ".join(f"{name} {value:.4f}" for name, value in metrics.items()) or "no validation"


def _as_yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
