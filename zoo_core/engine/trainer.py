"""The task-agnostic training loop, and ``train()``: the one entry point for every launch mode.

``train(libre, **kwargs)`` decides how to run (DESIGN.md §6):

- torchrun variables present (E2): this process is one rank; no process is spawned.
- several devices and no torchrun (E1): ``zoo_core.engine.launcher`` spawns one worker per
  device; each worker sets the torchrun variables and runs ``run_rank`` — the same code path.
- one device: ``run_rank`` in this process.

``run_rank`` prepares the data once (rank 0, E17), agrees on the batch (E5, E7), adapts the
model's head to the dataset's classes and runs ``Trainer.fit``. The trainer knows no task or
family: datasets, batches, losses and metrics come from the ``Task`` (zoo_core/tasks/base.py).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset

from zoo_core.engine.autobatch import accumulation_steps, check_divisible, global_batch_from_probe, probe_batch_size
from zoo_core.engine.callbacks import CallbackList, make_loggers
from zoo_core.engine.checkpoint import CheckpointWriter, snapshot
from zoo_core.engine.config import TrainConfig
from zoo_core.engine.devices import parse_device, resolve_device_plan
from zoo_core.engine.distributed import DistributedContext, init_distributed, single_process_context, torchrun_environment
from zoo_core.engine.ema import ModelEMA
from zoo_core.engine.optim import WarmupPlan, auto_optimizer, build_optimizer, lr_factor
from zoo_core.engine.plotting import plot_results
from zoo_core.engine.resume import config_for_resume, find_resume_checkpoint, read_training_checkpoint
from zoo_core.engine.results import EpochReport, TrainResult
from zoo_core.engine.seeding import loader_generator, loader_seed, seed_everything, seed_worker
from zoo_core.engine.sync_batchnorm import convert_sync_batchnorm, has_batchnorm
from zoo_core.errors import SpawnGuardError, TrainingDivergedError
from zoo_core.plugin_manager import get_plugin_manager
from zoo_core.run_dirs import next_run_dir
from zoo_core.tasks import get_task
from zoo_core.tasks.base import AugmentSettings, DataSpec, Task
from zoo_core.tasks.runner import check_image_size
from zoo_core.weights import ModelMeta

if TYPE_CHECKING:
    from zoo_core.facade import LibreYOLO

__all__ = ["train", "run_rank", "Trainer", "SPAWNED_WORKER_MARKER", "SMALL_BATCH_WARNING", "adapt_model_to_data"]

log = logging.getLogger("zoo.train")

# Set in the environment of spawned workers: a train() call there means the user's script re-ran
# its top level in the worker, i.e. the __main__ guard is missing (E3).
SPAWNED_WORKER_MARKER = "ZOO_SPAWNED_WORKER"
SPAWN_ERROR_DIRECTORY = "ZOO_SPAWN_ERROR_DIR"
SMALL_BATCH_WARNING = (
    "the model has BatchNorm, sync_bn is off and each rank trains at batch {per_rank} (< 16): per-rank "
    "BatchNorm statistics this small can hurt the converged model. Pass sync_bn=True, or a larger batch."
)
GUARD_MESSAGE = (
    "train(device=...) was called from inside a spawned training worker. This usually means your "
    "script calls model.train(device=...) at the top level without a 'if __name__ == \"__main__\":' "
    "guard: each worker re-imports your script, so the training call runs again. Fix:\n\n"
    "    if __name__ == \"__main__\":\n"
    "        model = LibreYOLO(...)\n"
    "        model.train(data=..., device=...)\n"
)


def console(context: DistributedContext, config: TrainConfig, message: str) -> None:
    """Print ``message`` on rank 0 when ``verbose`` (the one place the trainer talks to users)."""
    if context.is_main and config.verbose:
        print(message, flush=True)


# --------------------------------------------------------------------------- entry point
def train(libre: "LibreYOLO", **kwargs: Any) -> TrainResult:
    """Train ``libre`` with ``kwargs`` (see ``TrainConfig``); choose one device, torchrun or spawn."""
    if os.environ.get(SPAWNED_WORKER_MARKER):
        raise_guard_error()
    resume_from = find_resume_checkpoint(libre, kwargs.get("resume", False), kwargs.get("project", "runs"))
    if resume_from is not None:
        config = config_for_resume(resume_from, kwargs)
    else:
        config = TrainConfig.build(kwargs, defaults=get_plugin_manager().family(libre.family).train_defaults)
    if torchrun_environment():
        # torchrun owns the processes: each rank takes cuda:LOCAL_RANK, or the CPU when asked (E2).
        on_cpu = parse_device(config.device).kind == "cpu" or not torch.cuda.is_available()
        device = torch.device("cpu") if on_cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        return run_rank(libre, config, device=device, resume_from=resume_from)
    plan = resolve_device_plan(config.device)
    if plan.multi_device:
        from zoo_core.engine.launcher import spawn_training

        return spawn_training(libre, config, plan, resume_from=resume_from)
    return run_rank(libre, config, device=plan.torch_device(0), resume_from=resume_from)


def raise_guard_error() -> None:
    """Raise the E3 error; in a spawned worker also leave it where the parent will read it."""
    error_directory = os.environ.get(SPAWN_ERROR_DIRECTORY)
    if error_directory:
        from zoo_core.engine.launcher import record_worker_error

        with contextlib.suppress(OSError):
            record_worker_error(Path(error_directory), None, SpawnGuardError(GUARD_MESSAGE))
    raise SpawnGuardError(GUARD_MESSAGE)


# --------------------------------------------------------------------------- one rank
def adapt_model_to_data(libre: "LibreYOLO", spec: DataSpec) -> tuple[nn.Module, dict[int, str], int]:
    """A copy of ``libre.model`` with a head for ``spec``'s classes (weights of matching shape kept).

    The caller's model is never modified here: it receives the trained weights only on success.
    """
    if libre.task == "restore" or spec.num_classes == libre.num_classes:
        names = dict(spec.names) if spec.names else dict(libre.names)
        return copy.deepcopy(libre.model), names, libre.num_classes
    fresh = get_plugin_manager().build_model(libre.family, libre.size, spec.num_classes, libre.options)
    wanted = fresh.state_dict()
    transferable = {
        key: value for key, value in libre.model.state_dict().items() if key in wanted and wanted[key].shape == value.shape
    }
    fresh.load_state_dict(transferable, strict=False)
    return fresh, dict(spec.names), spec.num_classes


def on_main_then_share(context: DistributedContext, compute: Callable[[], Any]) -> Any:
    """Run ``compute`` on rank 0 only and give every rank its value, or its failure (never a hang)."""
    if not context.distributed:
        return compute()
    outcome = None
    if context.is_main:
        try:
            outcome = ("ok", compute())
        except Exception as error:
            context.broadcast_object(("error", f"{type(error).__name__}: {error}"))
            raise
    status, payload = context.broadcast_object(outcome)
    if status == "error":
        raise RuntimeError(f"rank 0 failed, so rank {context.rank} stops too: {payload}")
    return payload


def resolve_batch(config: TrainConfig, context: DistributedContext, probe: Callable[[], int]) -> tuple[int, int]:
    """The global batch and accumulation steps; autobatch (-1) is measured once, on rank 0 (E7)."""
    batch = config.batch
    if batch == -1:
        per_device = probe() if context.is_main else 0
        per_device = context.broadcast_int(per_device)  # one long tensor from rank 0
        batch = global_batch_from_probe(per_device, context.world_size, config.nbs)
    check_divisible(batch, context.world_size)
    return batch, accumulation_steps(batch, config.nbs)


def run_rank(
    libre: "LibreYOLO",
    config: TrainConfig,
    *,
    device: torch.device,
    spec: DataSpec | None = None,
    batch: int | None = None,
    resume_from: Path | None = None,
    on_result: Callable[[TrainResult], None] | None = None,
) -> TrainResult:
    """Train as this process's rank (or as the only process) and return the run's result.

    ``spec`` and ``batch`` are given by a spawning parent that already prepared the data and
    measured the batch; under torchrun rank 0 does both and broadcasts them.
    """
    context = init_distributed(device, config.ddp_timeout) if torchrun_environment() else single_process_context(device)
    try:
        task = get_task(libre.task)
        if spec is None:
            spec = on_main_then_share(context, lambda: task.prepare(config.data))
        image_size = check_image_size(libre.task, config.imgsz or libre.input_size)
        if batch is None:
            batch, accumulate = resolve_batch(
                config, context,
                lambda: probe_batch_size(copy.deepcopy(libre.model), task, image_size, device, max(libre.num_classes, 1)),
            )
        else:
            check_divisible(batch, context.world_size)
            accumulate = accumulation_steps(batch, config.nbs)
        seed_everything(config.seed)
        checkpoint = read_training_checkpoint(resume_from) if resume_from is not None else None
        model, names, num_classes = adapt_model_to_data(libre, spec)
        if checkpoint is not None:
            model.load_state_dict(checkpoint["train_model"])
        meta = ModelMeta(libre.family, libre.size, libre.task, num_classes, names, image_size, _zoo_version(), dict(libre.options))
        trainer = Trainer(
            model=model, meta=meta, task=task, spec=spec, config=config, context=context,
            batch=batch, accumulate=accumulate, image_size=image_size, checkpoint=checkpoint,
        )
        result = trainer.fit()
        best_weights = trainer.shared_best_weights(result)
        model.load_state_dict(best_weights)
        libre.model, libre.names, libre.num_classes = model.cpu().eval(), names, num_classes
        libre.input_size, libre.weights_path = image_size, result.best
        if on_result is not None and context.is_main:
            on_result(result)
        return result
    finally:
        context.close()


def _zoo_version() -> str:
    from zoo_core import __version__

    return __version__


# --------------------------------------------------------------------------- the loop
class Trainer:
    """One rank's training run: loaders, optimisation, validation, checkpoints and callbacks."""

    def __init__(self, *, model: nn.Module, meta: ModelMeta, task: Task, spec: DataSpec, config: TrainConfig,
                 context: DistributedContext, batch: int, accumulate: int, image_size: int,
                 checkpoint: dict[str, Any] | None = None) -> None:
        self.model = model
        self.meta = meta
        self.task = task
        self.spec = spec
        self.config = config
        self.context = context
        self.batch = batch
        self.accumulate = accumulate
        self.image_size = image_size
        self.checkpoint = checkpoint
        self.device = context.device
        self.history: list[dict[str, Any]] = []
        self.best_fitness: float | None = None
        self.best_epoch: int | None = None
        self.best_metrics: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.optimizer_steps = 0
        self.checkpoints = CheckpointWriter()

    # ----------------------------------------------------------------- set-up
    def _run_directory(self) -> Path:
        if self.checkpoint is not None:
            run_dir = Path(self.checkpoint["run_dir"])
        else:
            run_dir = on_main_then_share(
                self.context,
                lambda: next_run_dir(self.meta.task, self.config.name, self.config.project, exist_ok=self.config.exist_ok),
            )
        if self.context.is_main:
            (run_dir / "weights").mkdir(parents=True, exist_ok=True)
            for stale in (run_dir / "weights").glob(".*.tmp"):  # left by a process killed mid-write
                stale.unlink(missing_ok=True)
        return Path(run_dir)

    def _prepare_model(self) -> nn.Module:
        config, context = self.config, self.context
        model = self.model.to(self.device)
        if context.distributed and has_batchnorm(model):
            sync_bn = config.sync_bn if config.sync_bn is not None else get_plugin_manager().default_sync_bn(self.meta.family)
            per_rank = self.batch // context.world_size
            if sync_bn:
                model = convert_sync_batchnorm(model, self.device)
            elif per_rank < 16 and context.is_main:
                warnings.warn(SMALL_BATCH_WARNING.format(per_rank=per_rank), stacklevel=3)
        if config.cuda_graph:
            if context.distributed:
                console(context, config, "cuda_graph=True is not used under DDP; training eagerly")
            elif self.device.type != "cuda":
                console(context, config, "cuda_graph=True needs a CUDA device; training eagerly")
        return model

    def _loaders(self) -> tuple[DataLoader, DistributedSampler, DataLoader | None]:
        from zoo_core.data.sampling import InferenceShardSampler

        config, context = self.config, self.context
        augment = AugmentSettings(
            enabled=config.augment, hsv_h=config.hsv_h, hsv_s=config.hsv_s, hsv_v=config.hsv_v, degrees=config.degrees,
            translate=config.translate, scale=config.scale, fliplr=config.fliplr, mosaic=config.mosaic,
        )
        train_set = self.task.dataset(self.spec, "train", self.image_size, augment)
        if config.fraction < 1:
            train_set = Subset(train_set, range(max(1, int(len(train_set) * config.fraction))))
        self.train_set = train_set
        # One sampler for every world size: ranks take interleaved slices of one shuffled order,
        # so N ranks at batch B/N see exactly the images one process sees at batch B (E6).
        sampler = DistributedSampler(train_set, num_replicas=context.world_size, rank=context.rank, shuffle=True, seed=config.seed)
        self.generator = loader_generator(config.seed, context.rank, 0)
        loader_options = dict(
            num_workers=config.workers, collate_fn=self.task.collate, pin_memory=self.device.type == "cuda",
            worker_init_fn=seed_worker, multiprocessing_context=_loader_start_method(config.workers),
        )
        per_rank_batch = self.batch // context.world_size
        # A last batch of one image breaks BatchNorm in training: drop the incomplete batch whenever a
        # full one exists (the sampler reshuffles every epoch, so every image is still used).
        drop_last = len(sampler) >= per_rank_batch
        train_loader = DataLoader(
            train_set, batch_size=per_rank_batch, sampler=sampler, generator=self.generator, drop_last=drop_last,
            **loader_options,
        )
        val_loader = None
        if config.val:
            val_set = self.task.dataset(self.spec, "val", self.image_size, None)
            val_loader = DataLoader(
                val_set, batch_size=max(self.batch // context.world_size, 1) * 2,
                sampler=InferenceShardSampler(len(val_set), context.rank, context.world_size), **loader_options,
            )
        return train_loader, sampler, val_loader

    # ----------------------------------------------------------------- loop
    def fit(self) -> TrainResult:
        """Train for ``config.epochs`` (or until a stop decision) and return the result on every rank."""
        config, context = self.config, self.context
        started = time.monotonic()
        self.run_dir = self._run_directory()
        weights_dir = self.run_dir / "weights"
        model = self._prepare_model()
        train_loader, sampler, val_loader = self._loaders()
        batches_per_epoch = len(train_loader)
        optimizer_name, optimizer_lr = config.optimizer, config.lr0
        if optimizer_name == "auto":
            optimizer_name, optimizer_lr = auto_optimizer(
                math.ceil(batches_per_epoch / self.accumulate) * config.epochs
            )
        # Weight decay scales with the images per optimizer step relative to the nominal batch.
        weight_decay = config.weight_decay * (self.batch * self.accumulate / config.nbs if config.nbs else 1.0)
        optimizer = build_optimizer(model, optimizer_name, optimizer_lr, config.momentum, weight_decay)
        schedule = lr_factor(config.epochs, config.lrf, config.cos_lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=schedule)
        use_amp = config.amp and self.device.type == "cuda"
        scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
        warmup = WarmupPlan(round(config.warmup_epochs * batches_per_epoch), config.warmup_bias_lr, config.warmup_momentum, config.momentum)
        if context.distributed:
            ddp_model: nn.Module = DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=config.find_unused_parameters,
            )
        else:
            ddp_model = model
            if config.cuda_graph and self.device.type == "cuda":
                ddp_model = torch.compile(model, mode="reduce-overhead")
        # The EMA starts after DDP has broadcast rank 0's weights, so every rank averages the same thing.
        ema = ModelEMA(model, config.ema_decay, config.ema_tau) if config.ema else None
        start_epoch = 0
        if self.checkpoint is not None:
            optimizer.load_state_dict(self.checkpoint["optimizer"])
            scheduler.load_state_dict(self.checkpoint["scheduler"])
            if self.checkpoint.get("scaler"):
                scaler.load_state_dict(self.checkpoint["scaler"])
            if ema is not None and self.checkpoint.get("ema_updates"):
                ema.load_state_dict({"weights": self.checkpoint["model"], "updates": self.checkpoint["ema_updates"]})
            start_epoch = int(self.checkpoint["epoch"]) + 1
            self.best_fitness = self.checkpoint.get("best_fitness")
            self.best_epoch = self.checkpoint.get("best_epoch")
            self.history = list(self.checkpoint.get("history", []))
            self.best_metrics = dict(self.checkpoint.get("best_metrics", {}))
            self.optimizer_steps = int(self.checkpoint.get("optimizer_steps", 0))
        callbacks = CallbackList([*make_loggers(config.loggers), *config.callbacks] if context.is_main else [])
        if context.is_main:
            (self.run_dir / "args.yaml").write_text(_as_yaml(config.for_checkpoint()), encoding="utf-8")
            callbacks.fire("on_train_start", self.run_dir, config.for_checkpoint())
        console(
            context, config,
            f"training {self.meta.family}-{self.meta.size} on {len(self.train_set)} images, {config.epochs} epochs, "
            f"batch {self.batch} ({context.world_size} rank{'s' if context.world_size > 1 else ''} x {self.batch // context.world_size})"
            f", accumulate {self.accumulate}, {optimizer_name} lr {optimizer_lr:g} -> {self.run_dir}",
        )
        profile_steps = self._profiler_steps()
        stopped_early = False
        epoch = start_epoch - 1
        for epoch in range(start_epoch, config.epochs):
            epoch_started = time.monotonic()
            if epoch >= config.epochs - config.close_mosaic:  # also when resumed past that epoch
                close_mosaic = getattr(getattr(self.train_set, "dataset", self.train_set), "close_mosaic", None)
                if callable(close_mosaic):
                    close_mosaic()
            seed_everything(config.seed, context.rank, epoch)
            self.generator.manual_seed(loader_seed(config.seed, context.rank, epoch))
            sampler.set_epoch(epoch)
            ddp_model.train()
            loss_sums, batches_seen = self._train_epoch(
                ddp_model, model, ema, optimizer, scaler, warmup, scheduler, train_loader, epoch, use_amp, profile_steps,
                callbacks,
            )
            profile_steps = 0
            scheduler.step()
            totals = context.all_reduce_sum([batches_seen, *loss_sums.values()])
            losses = {name: value / max(totals[0], 1) for name, value in zip(loss_sums, totals[1:])}
            metrics: dict[str, float] = {}
            if val_loader is not None:
                evaluated = ema.module if ema is not None else model
                evaluated.eval()
                metrics = self.task.validate(evaluated, val_loader, self.device, self.meta.names)
            self.last_metrics = metrics
            stop = self._end_epoch(epoch, losses, metrics, optimizer, scheduler, scaler, ema, model, weights_dir,
                                   callbacks, epoch_started, started)
            if stop:
                stopped_early = epoch + 1 < config.epochs
                break
        self.checkpoints.wait()
        result = self._result(epoch + 1, stopped_early, weights_dir)
        if context.is_main:
            if config.plots:
                plot_results(self.run_dir / "results.csv")
            callbacks.fire("on_train_end", result)
            console(context, config, f"{'stopped early' if stopped_early else 'done'}: {_format_metrics(result.metrics)} -> {self.run_dir}")
        return result

    def _profiler_steps(self) -> int:
        if not self.config.profile:
            return 0
        if self.context.distributed:
            if self.context.is_main:
                warnings.warn("profile=True is ignored under DDP; profile a single-device run", stacklevel=3)
            return 0
        return 10

    def _train_epoch(self, ddp_model: nn.Module, model: nn.Module, ema: ModelEMA | None, optimizer: torch.optim.Optimizer,
                     scaler: torch.amp.GradScaler, warmup: WarmupPlan, scheduler: Any, loader: DataLoader, epoch: int,
                     use_amp: bool, profile_steps: int, callbacks: CallbackList) -> tuple[dict[str, float], int]:
        """One pass over ``loader``: the per-step loop with accumulation, clipping, AMP and EMA."""
        from tqdm import tqdm

        config, context = self.config, self.context
        batches = len(loader)
        scheduled = [group["initial_lr"] * scheduler.lr_lambdas[0](epoch) for group in optimizer.param_groups]
        loss_sums: dict[str, torch.Tensor] = {}
        profiler = self._start_profiler(profile_steps)
        progress = tqdm(loader, total=batches, desc=f"epoch {epoch + 1}/{config.epochs}", leave=False,
                        disable=not (context.is_main and config.verbose), dynamic_ncols=True)
        optimizer.zero_grad(set_to_none=True)
        seen = 0
        for index, batch in enumerate(progress):
            warmup.apply(optimizer, index + batches * epoch, scheduled)
            batch = self.task.preprocess(batch, self.device)
            group_start = (index // self.accumulate) * self.accumulate
            group_size = min(self.accumulate, batches - group_start)
            step_now = index == group_start + group_size - 1
            # Gradients are all-reduced only on the micro-batch that ends an accumulation group.
            sync_context = ddp_model.no_sync() if context.distributed and not step_now else contextlib.nullcontext()
            with sync_context:
                with torch.autocast(device_type=self.device.type, dtype=torch.float16, enabled=use_amp):
                    outputs = ddp_model(batch["images"])
                    loss, items = self.task.loss(model, outputs, batch)
                # The loss is a per-sample mean: DDP's gradient averaging makes it the global mean (E6).
                scaler.scale(loss / group_size).backward()
            if step_now:
                scaler.unscale_(optimizer)
                if config.max_grad_norm:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:
                    ema.update(model)
                self.optimizer_steps += 1
                for listener in callbacks.step_listeners:
                    listener(self.optimizer_steps)
            seen += 1
            for name, value in {"loss": loss, **items}.items():
                loss_sums[name] = loss_sums.get(name, 0) + value.detach().float()
            if context.is_main and config.verbose and index % 10 == 0:  # .item() syncs the device: not every step
                progress.set_postfix(loss=f"{float(loss.detach()):.4f}", refresh=False)
            if profiler is not None:
                profiler.step()
                if index + 1 >= profile_steps:
                    self._stop_profiler(profiler)
                    profiler = None
        if profiler is not None:
            self._stop_profiler(profiler)
        progress.close()
        return {name: float(value) for name, value in loss_sums.items()}, seen

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
    def _end_epoch(self, epoch: int, losses: dict[str, float], metrics: dict[str, float], optimizer: torch.optim.Optimizer,
                   scheduler: Any, scaler: torch.amp.GradScaler, ema: ModelEMA | None, model: nn.Module,
                   weights_dir: Path, callbacks: CallbackList, epoch_started: float, started: float) -> bool:
        """Rank 0 saves and reports; every rank then receives rank 0's stop decision (E19)."""
        config, context = self.config, self.context
        decision = 0
        if context.is_main:
            fitness = metrics.get(self.task.fitness_metric) if metrics else None
            # Strictly better only: a plateau counts towards patience, and best.pt keeps the first best epoch.
            is_best = fitness is not None and (self.best_fitness is None or fitness > self.best_fitness)
            if is_best:
                self.best_fitness, self.best_epoch, self.best_metrics = fitness, epoch + 1, dict(metrics)
            report = EpochReport(
                epoch=epoch + 1, epochs=config.epochs, losses=losses, metrics=metrics,
                learning_rate=optimizer.param_groups[0]["lr"], fitness=fitness, is_best=is_best,
                seconds=time.monotonic() - epoch_started, run_dir=self.run_dir,
            )
            self.history.append(report.row())
            checkpoint = self._checkpoint(epoch, model, ema, optimizer, scheduler, scaler)
            copies = [weights_dir / "best.pt"] if is_best or fitness is None else []
            if config.save_period > 0 and (epoch + 1) % config.save_period == 0:
                copies.append(weights_dir / f"epoch{epoch + 1}.pt")
            self.checkpoints.submit(snapshot(checkpoint), weights_dir / "last.pt", copies)
            callbacks.fire("on_epoch_end", report, before_user=self.checkpoints.wait)
            console(
                context, config,
                f"epoch {epoch + 1}/{config.epochs}  " + "  ".join(f"{name} {value:.4f}" for name, value in losses.items())
                + (f"  {_format_metrics(metrics)}" if metrics else "") + f"  {report.seconds:.1f}s",
            )
            decision = self._stop_reason(epoch, losses, started)
        decision = context.broadcast_int(decision)
        if decision == _STOP_DIVERGED:
            raise TrainingDivergedError(
                f"the training loss became NaN or infinite in epoch {epoch + 1}; lower lr0, check the data, "
                f"or resume from the last good checkpoint ({weights_dir / 'last.pt'})"
            )
        return decision != 0

    def _stop_reason(self, epoch: int, losses: dict[str, float], started: float) -> int:
        config = self.config
        if any(not math.isfinite(value) for value in losses.values()):
            return _STOP_DIVERGED
        if config.patience and self.best_epoch is not None and epoch + 1 - self.best_epoch >= config.patience:
            console(self.context, config, f"early stopping: no improvement in {config.patience} epochs (best epoch {self.best_epoch})")
            return _STOP_EARLY
        if config.time is not None and time.monotonic() - started >= config.time * 3600:
            console(self.context, config, f"time limit of {config.time} h reached")
            return _STOP_EARLY
        return 0

    def _checkpoint(self, epoch: int, model: nn.Module, ema: ModelEMA | None, optimizer: torch.optim.Optimizer,
                    scheduler: Any, scaler: torch.amp.GradScaler) -> dict[str, Any]:
        train_weights = _cpu_state(model)
        return {
            # The deployable weights: the EMA when there is one (resume restores the EMA from here).
            "model": _cpu_state(ema.module) if ema is not None else train_weights,
            "meta": self.meta.to_dict(),
            "train_model": train_weights,
            "ema_updates": ema.updates if ema is not None else 0,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler.is_enabled() else None,
            "epoch": epoch,
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
        """Rank 0's best weights on every rank (read from disk where it is visible, else sent)."""
        context = self.context
        readable = context.all_reduce_sum([1.0 if result.best.is_file() else 0.0])[0]
        if readable == context.world_size:
            return torch.load(result.best, map_location="cpu", weights_only=True)["model"]
        weights = torch.load(result.best, map_location="cpu", weights_only=True)["model"] if context.is_main else None
        return context.broadcast_object(weights)


def _loader_start_method(workers: int) -> str | None:
    """Fork loader workers on Linux, as torchrun ranks do by default.

    A process started with the spawn method (our DDP workers) inherits "spawn" as its default, and
    spawned loader workers re-import torch and the user's script: seconds per epoch.
    """
    return "fork" if workers > 0 and sys.platform.startswith("linux") else None


_STOP_EARLY = 1
_STOP_DIVERGED = 2


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    # Tensors are copied by snapshot() before the background write; here only detach.
    return {key: value.detach() for key, value in model.state_dict().items()}


def _format_metrics(metrics: dict[str, float]) -> str:
    return "  ".join(f"{name} {value:.4f}" for name, value in metrics.items()) or "no validation"


def _as_yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
