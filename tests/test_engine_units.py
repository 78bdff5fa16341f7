"""Engine pieces that need no second process: config, device grammar, batch arithmetic, optimizer, seeds."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from zoo_core.engine.autobatch import CPU_DEFAULT_BATCH, accumulation_steps, check_divisible, global_batch_from_probe, probe_batch_size
from zoo_core.engine.config import TrainConfig
from zoo_core.devices import DevicePlan, parse_device, resolve_device_plan
from zoo_core.engine.distributed import choose_backend, find_free_port, is_address_in_use_error
from zoo_core.engine.optim import build_optimizer, split_parameter_groups
from zoo_core.engine.schedule import LRSchedule
from zoo_core.engine.seeding import derive_seed, seed_everything
from zoo_core.errors import BatchSizeError, DeviceSpecError, TrainConfigError


# --------------------------------------------------------------------------- config
def test_unknown_training_argument_names_it_and_suggests():
    with pytest.raises(TrainConfigError, match=r"unknown training argument 'lr'.*Did you mean .*'lr0'"):
        TrainConfig.build({"data": "x", "lr": 0.1})


def test_bad_values_name_the_key_and_the_accepted_values():
    with pytest.raises(TrainConfigError, match=r"'optimizer'='Adamax' is invalid: .*'auto', 'SGD', 'Adam' or 'AdamW'"):
        TrainConfig.build({"data": "x", "optimizer": "Adamax"})
    with pytest.raises(TrainConfigError, match=r"'batch'=0 is invalid: .*-1 for autobatch"):
        TrainConfig.build({"data": "x", "batch": 0})
    with pytest.raises(TrainConfigError, match="needs data="):
        TrainConfig.build({"epochs": 1})


def test_family_defaults_apply_and_user_arguments_win():
    config = TrainConfig.build({"data": "x", "lr0": 0.5}, defaults={"lr0": 0.01, "optimizer": "SGD"})
    assert (config.lr0, config.optimizer) == (0.5, "SGD")
    with pytest.raises(TrainConfigError, match="the family's train_defaults"):
        TrainConfig.build({"data": "x"}, defaults={"learning_rate": 0.1})


# --------------------------------------------------------------------------- devices (grammar of docs/multi-gpu.md)
@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("0,1", DevicePlan("cuda", 2, (0, 1))),
        ([0, 1], DevicePlan("cuda", 2, (0, 1))),
        (0, DevicePlan("cuda", 1, (0,))),
        ("cuda:1", DevicePlan("cuda", 1, (1,))),
        ("cuda", DevicePlan("cuda", 1, (0,))),
        ("cpu", DevicePlan("cpu", 1)),
        ("cpu,cpu", DevicePlan("cpu", 2)),
        (["cpu", "cpu", "cpu", "cpu"], DevicePlan("cpu", 4)),
        ("mps", DevicePlan("mps", 1)),
        ("auto", DevicePlan("auto", 1)),
        (None, DevicePlan("auto", 1)),
    ],
)
def test_device_grammar(spec, expected):
    assert parse_device(spec) == expected


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("0,0", "more than once"),
        ("0,cpu", "mixes device kinds"),
        ("gpu", "unknown device spelling 'gpu'"),
        ("0,,1", "empty entry"),
        ("mps,mps", "MPS has one device"),
        ([True], "is not a device"),
        (-1, "negative"),
    ],
)
def test_bad_device_specs_list_the_accepted_forms(spec, why):
    with pytest.raises(DeviceSpecError) as caught:
        parse_device(spec)
    assert why in str(caught.value) and "accepted forms: '0,1', [0, 1]" in str(caught.value)


def test_indices_beyond_visible_devices_are_logical_indices_into_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert resolve_device_plan("1", cuda_count=2, mps_available=False).cuda_indices == (1,)
    with pytest.raises(DeviceSpecError, match=r"index 2 is beyond the 2 visible device\(s\) 0\.\.1 \(logical indices into CUDA_VISIBLE_DEVICES=2,3\)"):
        resolve_device_plan("0,2", cuda_count=2, mps_available=False)
    with pytest.raises(DeviceSpecError, match="sees no CUDA device; use 'cpu'"):
        resolve_device_plan("0", cuda_count=0, mps_available=False)


def test_auto_prefers_cuda_then_mps_then_cpu():
    assert resolve_device_plan("auto", cuda_count=2, mps_available=False) == DevicePlan("cuda", 1, (0,))
    assert resolve_device_plan("auto", cuda_count=0, mps_available=True) == DevicePlan("mps", 1)
    assert resolve_device_plan("auto", cuda_count=0, mps_available=False) == DevicePlan("cpu", 1)


# --------------------------------------------------------------------------- batch arithmetic (E5, E7)
def test_indivisible_batch_names_the_two_nearest_valid_values():
    with pytest.raises(BatchSizeError) as caught:
        check_divisible(6, 4)
    message = str(caught.value)
    assert "batch=6 is the global batch and must be divisible by world_size=4" in message
    assert message.endswith("Use batch=4 or batch=8.")
    with pytest.raises(BatchSizeError, match=r"Use batch=4\.$"):
        check_divisible(3, 4)
    check_divisible(8, 4)


def test_autobatch_scales_caps_at_nbs_and_rounds_to_world_size():
    assert global_batch_from_probe(16, 2, None) == 32
    assert global_batch_from_probe(16, 2, 64) == 32
    assert global_batch_from_probe(48, 2, 64) == 64  # capped at nbs
    assert global_batch_from_probe(30, 3, 64) == 63  # capped, then rounded down to a multiple of 3
    assert global_batch_from_probe(1, 4, 2) == 4  # never below one image per rank
    # More devices: fewer accumulation steps, same per-device batch.
    assert [accumulation_steps(global_batch_from_probe(8, world, 64), 64) for world in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert accumulation_steps(16, None) == 1


def test_autobatch_returns_the_documented_default_off_cuda():
    model = nn.Linear(3, 2)
    assert probe_batch_size(model, object(), 32, torch.device("cpu"), 2) == CPU_DEFAULT_BATCH == 16


# --------------------------------------------------------------------------- optimizer and schedule
def test_norms_and_biases_get_no_weight_decay():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(2))
    model(torch.rand(1, 3, 5, 5))
    decay, no_decay, biases = split_parameter_groups(model)
    assert [tuple(p.shape) for p in decay.params] == [(4, 3, 3, 3), (2, 36)]
    assert [tuple(p.shape) for p in no_decay.params] == [(4,)]
    assert len(biases.params) == 3 and biases.kind == "bias"
    optimizer = build_optimizer([decay, no_decay, biases], "SGD", 0.1, momentum=0.9, weight_decay=5e-4)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [5e-4, 0.0, 0.0]
    assert isinstance(build_optimizer([decay], "AdamW", 1e-3, momentum=0.9, weight_decay=0.05, beta2=0.95), torch.optim.AdamW)


@pytest.mark.parametrize("name", ["SGD", "Adam", "AdamW"])
def test_cpu_parameters_step_with_the_fused_kernels_to_the_same_weights(name):
    def stepped(kernels: str) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
        torch.manual_seed(0)
        # No bias before the BatchNorm: its true gradient is 0, and Adam would blow the round-off
        # that stands in for it up to whole steps, differently for each kernel.
        model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(36, 2))
        optimizer = build_optimizer(split_parameter_groups(model), name, 0.01, momentum=0.9, weight_decay=5e-4)
        if kernels == "foreach":
            groups = [{key: value for key, value in group.items() if key not in ("fused", "foreach")}
                      for group in optimizer.param_groups]
            optimizer = type(optimizer)(groups, foreach=True)
            assert not any(group["fused"] for group in optimizer.param_groups)
        for _ in range(3):
            model(torch.rand(2, 3, 5, 5)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return optimizer, [parameter.detach() for parameter in model.parameters()]

    fused, fused_weights = stepped("fused")
    assert all(group["fused"] for group in fused.param_groups)
    _, foreach_weights = stepped("foreach")
    for a, b in zip(fused_weights, foreach_weights):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_lr_multipliers_split_groups_by_name_prefix_and_scale_their_rate():
    model = nn.ModuleDict({"backbone": nn.Conv2d(3, 4, 3), "head": nn.Conv2d(4, 2, 1)})
    groups = split_parameter_groups(model, {"backbone.": 0.1})
    assert [(group.kind, group.lr_scale, len(group.params)) for group in groups] == [
        ("decay", 1.0, 1), ("no_decay", 1.0, 0), ("bias", 1.0, 1), ("decay", 0.1, 1), ("no_decay", 0.1, 0), ("bias", 0.1, 1),
    ]
    optimizer = build_optimizer(groups, "AdamW", 1e-3, momentum=0.9, weight_decay=0.0)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([1e-3] * 3 + [1e-4] * 3)


def schedule_values(schedule: LRSchedule) -> list[float]:
    return [schedule.factor(iteration) for iteration in range(schedule.total_iterations + 1)]


def test_linear_and_cosine_start_at_one_and_end_at_lrf_stepping_per_epoch():
    for name in ("linear", "cosine"):
        schedule = LRSchedule(name, epochs=10, iterations_per_epoch=3, lrf=0.01)
        assert schedule.factor(0) == pytest.approx(1.0) and schedule.factor(30) == pytest.approx(0.01)
        assert schedule.factor(15) == pytest.approx(0.505) == schedule.factor(17)  # epoch 5, whichever iteration


def test_flat_cosine_holds_then_decays_until_augmentation_closes():
    schedule = LRSchedule("flat_cosine", epochs=10, iterations_per_epoch=10, lrf=0.5, flat_epochs=4, no_augmentation_epochs=2)
    values = schedule_values(schedule)
    assert values[:41] == [1.0] * 41  # flat through epoch 4
    assert values[60] == pytest.approx(0.75)  # half way through the cosine (epochs 4..8)
    assert values[80:] == [0.5] * 21  # the no-augmentation epochs keep the final rate
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_multistep_and_poly():
    step = LRSchedule("multistep", epochs=6, iterations_per_epoch=2, milestones=(2, 4), gamma=0.1)
    assert [step.factor(epoch * 2) for epoch in range(6)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.01])
    poly = LRSchedule("poly", epochs=1, iterations_per_epoch=100, lrf=0.0, power=1.0)
    assert poly.factor(25) == pytest.approx(0.75) and poly.factor(100) == 0.0


def test_warmup_rises_from_zero_and_biases_from_warmup_bias_lr_with_momentum():
    model = nn.Linear(2, 2)
    groups = split_parameter_groups(model)
    optimizer = build_optimizer(groups, "SGD", 0.01, momentum=0.9, weight_decay=0.0)
    schedule = LRSchedule("linear", epochs=10, iterations_per_epoch=10, lrf=0.01, warmup_iterations=4,
                          warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.9, bias_groups=frozenset({2}))
    schedule.apply(optimizer, 0)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.0, 0.0, 0.1])
    assert optimizer.param_groups[0]["momentum"] == pytest.approx(0.8)
    schedule.apply(optimizer, 2)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.005, 0.005, 0.055])
    assert optimizer.param_groups[0]["momentum"] == pytest.approx(0.85)
    schedule.apply(optimizer, 4)
    assert [group["lr"] for group in optimizer.param_groups] == pytest.approx([0.01] * 3)
    assert optimizer.param_groups[0]["momentum"] == pytest.approx(0.9)


def test_an_unknown_schedule_is_refused():
    with pytest.raises(ValueError, match="unknown lr_schedule 'step'"):
        LRSchedule("step", epochs=1, iterations_per_epoch=1)  # type: ignore[arg-type]
    with pytest.raises(TrainConfigError, match="lr_schedule"):
        TrainConfig.build({"data": "shapes", "lr_schedule": "step"})


# --------------------------------------------------------------------------- seeds, backend, ports
def test_seeds_differ_by_rank_and_epoch_and_repeat():
    seed_everything(0, rank=0, epoch=3)
    first = (random.random(), torch.rand(3))
    seed_everything(0, rank=0, epoch=3)
    again = (random.random(), torch.rand(3))
    seed_everything(0, rank=1, epoch=3)
    other_rank = (random.random(), torch.rand(3))
    assert first[0] == again[0] and torch.equal(first[1], again[1])
    assert first[0] != other_rank[0] and not torch.equal(first[1], other_rank[1])
    assert len({derive_seed(0, rank, epoch) for rank in range(4) for epoch in range(4)}) == 16


def test_a_re_drawn_class_head_depends_on_the_run_seed_alone(tmp_path):
    """The class-dependent tensors a run draws for its dataset come from the run's seed, not from the
    global stream: a draw made before (another test, another model) leaves them as they were."""
    from pathlib import Path

    from tests.doubles import use_test_families
    from zoo_core.engine.rank import adapt_to_dataset
    from zoo_core.engine.spec import ModelSpec
    from zoo_core.plugin_manager import get_plugin_manager
    from zoo_core.tasks.base import DataSpec

    use_test_families()
    manager = get_plugin_manager()
    spec = ModelSpec("tinynet", "s", "classify", 2, {0: "a", 1: "b"})
    data = DataSpec("classify", Path(tmp_path), {0: "a", 1: "b", 2: "c"}, train=None, val=None)

    def head(seed: int, draws_before: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(1234)
        torch.rand(draws_before)
        model, adapted = adapt_to_dataset(spec, data, manager, seed=seed, report=False)
        assert adapted.num_classes == 3
        return model.head.weight.detach().clone(), torch.rand(1)

    (first, after_first), (second, after_second) = head(0, 1), head(0, 1000)
    assert torch.equal(first, second)
    assert not torch.equal(after_first, after_second)  # the global stream itself was left where it was
    assert not torch.equal(first, head(1, 1)[0])


def test_backend_is_gloo_off_cuda_and_nccl_on_cuda_when_built():
    import torch.distributed as dist

    assert choose_backend(torch.device("cpu")) == "gloo"
    expected = "nccl" if dist.is_nccl_available() else "gloo"
    assert choose_backend(torch.device("cuda", 0)) == expected


def test_free_port_is_on_loopback_and_port_clash_is_recognised():
    import socket

    port = find_free_port()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # really free
    assert is_address_in_use_error("... code: -98, name: EADDRINUSE, message: address already in use")
    assert not is_address_in_use_error("connection reset by peer")


# --------------------------------------------------------------------------- EMA
def test_ema_averages_floats_with_warmup_and_copies_integer_buffers():
    from zoo_core.engine.ema import ModelEMA

    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3))
    ema = ModelEMA(model, decay=0.9, tau=1.0)
    start = ema.module[0].weight.clone()
    with torch.no_grad():
        model[0].weight.add_(1.0)
    model(torch.rand(4, 3))  # moves the BatchNorm statistics and its integer counter
    ema.update(model)
    weight = 0.9 * (1 - torch.exp(torch.tensor(-1.0)))
    torch.testing.assert_close(ema.module[0].weight, weight * start + (1 - weight) * model[0].weight)
    assert int(ema.module[1].num_batches_tracked) == 1
    assert all(not parameter.requires_grad for parameter in ema.module.parameters())
    restored = ModelEMA(model)
    restored.load_state_dict(ema.state_dict())
    assert restored.updates == 1 and torch.equal(restored.module[0].weight, ema.module[0].weight)


def test_a_forkserver_that_cannot_start_falls_back_to_spawned_workers_and_says_why(monkeypatch, caplog):
    import multiprocessing.forkserver

    from zoo_core.engine import launcher

    def refuse() -> None:
        raise OSError("AF_UNIX path too long")

    server = launcher.WorkerServer()
    monkeypatch.setattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", refuse)
    with caplog.at_level("WARNING", logger="zoo.train"):
        server.start(launcher.ENGINE_MODULES)
    assert server.start_method() == "spawn" and not server.started_here
    assert "AF_UNIX path too long" in caplog.text and "TMPDIR" in caplog.text


def test_the_forkserver_imports_the_task_and_its_metrics_for_its_workers_exactly_when_the_run_validates(monkeypatch):
    """Imported in each worker at its first validation, torchmetrics costs every rank its seconds at once."""
    import multiprocessing.forkserver

    from zoo_core.engine import fitting, launcher
    from zoo_core.tasks import get_task

    asked: list[list[str]] = []

    def record_preload() -> None:
        asked.append(list(multiprocessing.forkserver._forkserver._preload_modules))
        raise OSError("not started by this test")

    task = get_task("detect")
    for validates in (True, False):
        monkeypatch.setattr(launcher, "WORKER_SERVER", launcher.WorkerServer())
        monkeypatch.setattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
        monkeypatch.setattr(multiprocessing.forkserver._forkserver, "_preload_modules", ["__main__"])
        monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", record_preload)
        launcher.start_worker_server([*fitting.ENGINE_MODULES, *task.preloaded_modules(validates=validates)])
    with_validation, without = asked
    metrics = set(task.validation_modules)
    assert {*launcher.ENGINE_MODULES, "zoo_core.tasks.detect"} <= set(without) and metrics.isdisjoint(without)
    assert {*launcher.ENGINE_MODULES, "zoo_core.tasks.detect", *metrics} <= set(with_validation)


@pytest.mark.parametrize("scale", [0.01, 100.0, float("inf")])
def test_gradient_clipping_on_a_cpu_matches_clip_grad_norm(scale):
    from types import SimpleNamespace

    from zoo_core.engine.trainer import Trainer

    trainer = Trainer.__new__(Trainer)  # only the clipping: its config and device
    trainer.config, trainer.device = SimpleNamespace(max_grad_norm=1.0), torch.device("cpu")
    torch.manual_seed(0)
    model, reference = nn.Linear(20, 5), nn.Linear(20, 5)
    for parameter, twin in zip(model.parameters(), reference.parameters()):
        parameter.grad = torch.randn_like(parameter) * scale
        twin.grad = parameter.grad.clone()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    trainer._clip_gradients(model)
    for parameter, twin in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(parameter.grad, twin.grad, equal_nan=True)


# --------------------------------------------------------------------------- mixed precision
@pytest.mark.parametrize(
    ("device", "amp", "major", "expected"),
    [
        ("cpu", True, None, (False, torch.float32, False)),
        ("cuda:0", False, 9, (False, torch.float32, False)),
        ("cuda:0", True, 9, (True, torch.bfloat16, False)),  # H100: bfloat16, no loss scaling
        ("cuda:0", True, 8, (True, torch.bfloat16, False)),  # A100
        ("cuda:0", True, 7, (True, torch.float16, True)),  # V100 / T4: float16 with a GradScaler
    ],
)
def test_amp_uses_bfloat16_where_the_gpu_computes_it_and_scales_only_float16(monkeypatch, device, amp, major, expected):
    from types import SimpleNamespace

    from zoo_core.engine.precision import training_precision

    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(major=major))
    precision = training_precision(torch.device(device), amp)
    assert (precision.autocast, precision.dtype, precision.scales_loss) == expected


def test_run_directories_take_the_first_free_name_and_never_reuse_one(tmp_path):
    from zoo_core.run_dirs import next_run_dir

    assert next_run_dir("detect", project=tmp_path) == tmp_path / "detect" / "train"
    (tmp_path / "detect" / "train3").mkdir()
    assert next_run_dir("detect", project=tmp_path) == tmp_path / "detect" / "train2"
    assert next_run_dir("detect", project=tmp_path) == tmp_path / "detect" / "train4"
    assert next_run_dir("detect", project=tmp_path, exist_ok=True) == tmp_path / "detect" / "train"
    assert next_run_dir("detect", "val", project=tmp_path) == tmp_path / "detect" / "val"
