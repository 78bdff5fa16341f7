"""``fit(spec, arguments, manager=...)``: the engine's one entry point, for every launch mode.

``fit`` decides how to run (docs/architecture.md, "The life of train(device=[0, 1])"):

- torchrun variables present (E2): this process is one rank; no process is spawned. After an
  elastic restart (``torchrun --max-restarts``) the run continues from its own last checkpoint;
- several devices and no torchrun (E1): the run is prepared here once (data, input size,
  batch), then ``launcher.launch`` starts one worker per device; each worker rebuilds the
  plugin manager and the model from the ``ModelSpec`` and runs ``run_rank``, the same code path
  a torchrun rank runs; ``launch`` returns rank 0's result;
- one device: ``run_rank`` in this process.

Every mode returns the same ``FitOutcome``; the caller (the facade) applies it to its own state.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch

from zoo_core.devices import parse_device, resolve_device_plan
from zoo_core.engine.config import TrainConfig
from zoo_core.engine.distributed import single_process_context, torchrun_environment
from zoo_core.engine.launcher import ENGINE_MODULES, LaunchPlan, launch, pickle_arguments, refuse_inside_worker, start_worker_server
from zoo_core.engine.rank import prepare_run, run_rank
from zoo_core.engine.resume import config_for_resume, find_elastic_checkpoint, find_resume_checkpoint, spec_for_resume
from zoo_core.engine.spec import FitOutcome, ModelSpec
from zoo_core.errors import SpawnGuardError, SpawnNotSupportedError
from zoo_core.settings import runs_dir

if TYPE_CHECKING:
    from zoo_core.devices import DevicePlan
    from zoo_core.engine.recipe import TrainingRecipe
    from zoo_core.plugin_manager import ZooPluginManager

__all__ = ["fit", "GUARD_MESSAGE"]

GUARD_MESSAGE = (
    "train(device=...) was called from inside a spawned training worker. This usually means your "
    "script calls model.train(device=...) at the top level without a 'if __name__ == \"__main__\":' "
    "guard: each worker re-imports your script, so the training call runs again. Fix:\n\n"
    "    if __name__ == \"__main__\":\n"
    "        model = LibreYOLO(...)\n"
    "        model.train(data=..., device=...)\n"
)


def fit(spec: ModelSpec, arguments: Mapping[str, Any], *, manager: "ZooPluginManager") -> FitOutcome:
    """Train the model ``spec`` describes with ``arguments`` (``TrainConfig``'s keys); see the module docstring."""
    refuse_inside_worker(SpawnGuardError(GUARD_MESSAGE))  # E3: the user's script re-ran its top level in a worker
    recipe = manager.training_recipe(spec.family, spec.size)
    if torchrun_environment() and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and not arguments.get("resume"):
        # torchrun restarted the workers (--max-restarts): continue this invocation's run where it stopped.
        restart_from = find_elastic_checkpoint(spec, arguments.get("project") or runs_dir())
        if restart_from is not None:
            arguments = {**arguments, "resume": str(restart_from)}
    resume_from = find_resume_checkpoint(spec, arguments.get("resume", False), arguments.get("project") or runs_dir())
    if resume_from is not None:
        config = config_for_resume(resume_from, dict(arguments))
        spec = spec_for_resume(resume_from, spec)
    else:
        config = TrainConfig.build(arguments, defaults=recipe.config_defaults)
    if torchrun_environment():
        # torchrun owns the processes: each rank takes cuda:LOCAL_RANK, or the CPU when asked (E2).
        on_cpu = parse_device(config.device).kind == "cpu" or not torch.cuda.is_available()
        device = torch.device("cpu") if on_cpu else torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        return run_rank(spec, config, device=device, manager=manager, resume_from=resume_from)
    plan = resolve_device_plan(config.device)
    if plan.multi_device:
        return _fit_spawned(spec, config, plan, manager=manager, recipe=recipe, resume_from=resume_from)
    return run_rank(spec, config, device=plan.torch_device(0), manager=manager, resume_from=resume_from)


# --------------------------------------------------------------------------- spawn (E1)
def _fit_spawned(spec: ModelSpec, config: TrainConfig, plan: "DevicePlan", *, manager: "ZooPluginManager",
                 recipe: "TrainingRecipe", resume_from: Path | None) -> FitOutcome:
    """Check what can be checked, prepare once, launch one worker per device, return rank 0's outcome."""
    world_size = plan.world_size
    if not manager.supports_spawn(spec.family):
        raise SpawnNotSupportedError(
            f"the {spec.family!r} family's plugin does not support spawning one process per device, so "
            f"device={config.device!r} cannot start {world_size} workers from train(). Launch the ranks "
            f"with torchrun instead, from a script that calls model.train(...) without several devices:\n\n"
            f"    torchrun --nproc_per_node={world_size} your_script.py\n\n"
            f"(Python API: LibreYOLO({spec.name!r}).train(data=...) inside that script.)"
        )
    arguments = pickle_arguments(_user_arguments(config, manager))  # E4: before any side effect
    # The workers' imports run while the data is prepared.
    start_worker_server([*ENGINE_MODULES, *recipe.task.preloaded_modules(validates=config.val)])
    prepared = prepare_run(spec, config, recipe=recipe, context=single_process_context(plan.torch_device(0)),
                           world_size=world_size, manager=manager)  # E5: an indivisible batch stops here
    arguments.update(pickle_arguments({"spec": spec, "prepared": prepared, "resume_from": resume_from, "device plan": plan}))
    user_port = config.master_port or (int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None)
    cpu_threads = max(1, (os.cpu_count() or 1) // world_size) if plan.kind == "cpu" else 0
    result, trained_spec, state_dict = launch(_spawned_rank, arguments, LaunchPlan(
        world_size, cpu_threads, user_port, "master_port=" if config.master_port else "MASTER_PORT"))
    return FitOutcome(result=result, spec=trained_spec, state_dict=state_dict)


def _user_arguments(config: TrainConfig, manager: "ZooPluginManager") -> dict[str, Any]:
    """Everything user-supplied the workers need, by name, so a pickling error can name it."""
    arguments: dict[str, Any] = {"config": config.model_copy(update={"callbacks": []})}
    for index, callback in enumerate(config.callbacks):
        arguments[f"callbacks[{index}]"] = callback
    for name, plugin in manager.runtime_plugins:
        arguments[f"plugin {name!r}"] = plugin
    arguments["plugin settings"] = manager.settings()
    return arguments


def _spawned_rank(local_rank: int, arguments: dict[str, Any]) -> tuple[Any, ModelSpec, dict[str, Any]]:
    """A spawned worker: rebuild the plugin manager from the arguments, then run the torchrun code path.

    Returns the run's result, the trained model's spec and its best weights in full precision (the
    launcher hands rank 0's to the caller; the final ``best.pt`` on disk holds them in half precision).
    """
    from zoo_core.plugin_manager import reset_plugin_manager

    settings = arguments["plugin settings"]
    manager = reset_plugin_manager(block=settings["blocked"], autoload=settings["autoload"])
    for name, plugin in arguments.items():
        if name.startswith("plugin '"):
            manager.register_family_plugin(plugin, name[len("plugin '"):-1])
    callbacks = [value for name, value in arguments.items() if name.startswith("callbacks[")]
    config: TrainConfig = arguments["config"].model_copy(update={"callbacks": callbacks})
    plan: "DevicePlan" = arguments["device plan"]
    outcome = run_rank(arguments["spec"], config, device=plan.torch_device(local_rank), manager=manager,
                       prepared=arguments["prepared"], resume_from=arguments["resume_from"])
    return outcome.result, outcome.spec, outcome.state_dict
