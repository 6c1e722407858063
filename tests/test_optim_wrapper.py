"""OptimWrapper, AmpOptimWrapper and OptimWrapperDict: the behaviour a training loop relies on."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn as nn
from torch.optim import SGD, Adagrad, Adam

from shardwise.optim import (
    AmpOptimWrapper,
    BaseOptimWrapper,
    OptimWrapper,
    OptimWrapperDict,
    StepLR,
    clip_grad_norm_,
)
from tests.distributed import run_distributed


def _scalar_param() -> nn.Parameter:
    return nn.Parameter(torch.ones(1))


def _record_steps(optim_wrapper: OptimWrapper, param: torch.Tensor) -> list[tuple[int, float]]:
    """Patch the optimizer's step to record (iteration, accumulated grad) at every step."""
    steps: list[tuple[int, float]] = []
    original = optim_wrapper.optimizer.step

    def step(*args, **kwargs):
        steps.append((optim_wrapper.inner_count, float(param.grad)))
        return original(*args, **kwargs)

    optim_wrapper.optimizer.step = step  # type: ignore[method-assign]
    return steps


# ---------------------------------------------------------------------- accumulation


def test_update_params_steps_and_zeroes_every_iteration_by_default():
    model = nn.Linear(2, 1)
    before = copy.deepcopy(model.state_dict())
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.1))
    optim_wrapper.update_params(model(torch.ones(1, 2)).sum())
    assert not torch.equal(model.weight, before["weight"])
    assert model.weight.grad is None  # zero_grad(set_to_none=True)
    assert optim_wrapper.inner_count == 1


def test_accumulating_k_micro_batches_equals_one_step_on_the_k_times_batch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 1))
    twin = copy.deepcopy(model)
    x, y = torch.randn(4 * 8, 6), torch.randn(4 * 8, 1)
    accumulating = OptimWrapper(Adam(model.parameters(), lr=0.1), accumulative_counts=4)
    accumulating.initialize_count_status(model, 0, 8)
    for step in range(8):
        chunk = slice((step % 4) * 8, (step % 4 + 1) * 8)
        accumulating.update_params(nn.functional.mse_loss(model(x[chunk]), y[chunk]))
        if step == 3:
            after_first_window = copy.deepcopy(model.state_dict())
    whole = OptimWrapper(Adam(twin.parameters(), lr=0.1))
    whole.update_params(nn.functional.mse_loss(twin(x), y))
    for key, value in twin.state_dict().items():
        torch.testing.assert_close(after_first_window[key], value, rtol=1e-5, atol=1e-6)
    whole.update_params(nn.functional.mse_loss(twin(x), y))
    for key, value in twin.state_dict().items():
        torch.testing.assert_close(model.state_dict()[key], value, rtol=1e-5, atol=1e-6)


def test_bf16_amp_trains_a_small_model_on_cpu():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    wrapper = AmpOptimWrapper(dtype="bfloat16", optimizer=Adam(model.parameters(), lr=1e-2))
    x = torch.randn(64, 8)
    y = x.sum(1, keepdim=True)
    losses = []
    for _ in range(60):
        with wrapper.optim_context(model):
            out = model(x)
            loss = nn.functional.mse_loss(out.float(), y)
        assert out.dtype == torch.bfloat16
        wrapper.update_params(loss)
        losses.append(loss.item())
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    assert losses[-1] < 0.1 * losses[0]


def test_accumulation_divides_the_loss_and_steps_every_n_iterations():
    param = _scalar_param()
    optim_wrapper = OptimWrapper(SGD([param], lr=0.0), accumulative_counts=3)
    steps = _record_steps(optim_wrapper, param)
    for i in range(1, 7):
        optim_wrapper.update_params(param.sum())
        if i % 3:
            assert float(param.grad) == pytest.approx((i % 3) / 3)
    # Each window of 3 accumulates exactly one full-loss gradient.
    assert steps == [(3, pytest.approx(1.0)), (6, pytest.approx(1.0))]


def test_trailing_window_is_scaled_by_its_true_size():
    param = _scalar_param()
    optim_wrapper = OptimWrapper(SGD([param], lr=0.0), accumulative_counts=4)
    optim_wrapper.initialize_count_status(nn.Linear(1, 1), init_counts=0, max_counts=10)
    steps = _record_steps(optim_wrapper, param)
    factors = []
    for _ in range(10):
        factors.append(float(optim_wrapper.scale_loss(torch.tensor(1.0))))
        optim_wrapper.update_params(param.sum())
    assert factors == [0.25] * 8 + [0.5] * 2
    assert steps == [(4, pytest.approx(1.0)), (8, pytest.approx(1.0)), (10, pytest.approx(1.0))]


def test_without_count_status_a_trailing_window_does_not_step():
    param = _scalar_param()
    optim_wrapper = OptimWrapper(SGD([param], lr=0.0), accumulative_counts=4)
    steps = _record_steps(optim_wrapper, param)
    for _ in range(10):
        optim_wrapper.update_params(param.sum())
    assert [count for count, _ in steps] == [4, 8]
    assert optim_wrapper.max_counts == -1


def test_should_sync_predicts_the_update_iteration():
    optim_wrapper = OptimWrapper(SGD([_scalar_param()], lr=0.1), accumulative_counts=2)
    optim_wrapper.initialize_count_status(nn.Linear(1, 1), 0, 3)
    syncs, updates = [], []
    for _ in range(3):
        syncs.append(optim_wrapper.should_sync())
        optim_wrapper.backward(torch.zeros(1, requires_grad=True).sum())
        updates.append(optim_wrapper.should_update())
    assert syncs == updates == [False, True, True]


def test_resuming_mid_window_and_batch_norm_are_warned_about(caplog):
    optim_wrapper = OptimWrapper(SGD([_scalar_param()], lr=0.1), accumulative_counts=3)
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        optim_wrapper.initialize_count_status(nn.Linear(1, 1), 3, 99)
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        optim_wrapper.initialize_count_status(nn.Linear(1, 1), 2, 100)
    assert "not divisible" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="shardwise"):
        optim_wrapper.initialize_count_status(nn.Sequential(nn.BatchNorm1d(2)), 0, 99)
    assert "BatchNorm" in caplog.text
    assert optim_wrapper.inner_count == 0 and optim_wrapper.max_counts == 99


def test_initialize_count_status_rejects_impossible_counts():
    optim_wrapper = OptimWrapper(SGD([_scalar_param()], lr=0.1))
    with pytest.raises(ValueError, match="init_counts"):
        optim_wrapper.initialize_count_status(nn.Linear(1, 1), 5, 3)
    with pytest.raises(TypeError, match="max_counts"):
        optim_wrapper.initialize_count_status(nn.Linear(1, 1), 0, 3.5)


# ---------------------------------------------------------------------- optim_context


class _FakeFSDPModule(nn.Linear):
    """Records set_requires_gradient_sync calls the way an FSDP2 module receives them."""

    def __init__(self) -> None:
        super().__init__(1, 1)
        self.sync_calls: list[bool] = []

    def set_requires_gradient_sync(self, requires_gradient_sync: bool) -> None:
        self.sync_calls.append(requires_gradient_sync)


def test_optim_context_turns_fsdp2_sync_off_until_the_backward_of_a_non_update_step():
    model = _FakeFSDPModule()
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    with optim_wrapper.optim_context(model):
        loss = model(torch.ones(1, 1)).sum()
    # FSDP2 reads the flag during backward, so it must still be off after the context.
    assert model.sync_calls == [False]
    optim_wrapper.update_params(loss)
    assert model.sync_calls == [False, True]
    with optim_wrapper.optim_context(model):  # the update step: no change needed
        loss = model(torch.ones(1, 1)).sum()
    optim_wrapper.update_params(loss)
    assert model.sync_calls == [False, True]


def test_optim_context_is_a_no_op_for_a_plain_model():
    model = nn.Linear(1, 1)
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    with optim_wrapper.optim_context(model):
        loss = model(torch.ones(1, 1)).sum()
    optim_wrapper.update_params(loss)
    assert model.weight.grad is not None


# ---------------------------------------------------------------------- clipping


def _model_with_grads(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    (model(torch.randn(5, 3)) * 10).sum().backward()
    return model


def test_clip_grad_by_norm_clips_and_records_the_total_norm():
    model = _model_with_grads()
    expected = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.0), clip_grad=dict(max_norm=0.5))
    assert optim_wrapper.get_log_vars() == {}
    optim_wrapper.step()
    assert optim_wrapper.last_grad_norm == pytest.approx(float(expected), rel=1e-5)
    assert optim_wrapper.get_log_vars() == {"grad_norm": optim_wrapper.last_grad_norm}
    clipped = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert float(clipped) == pytest.approx(0.5, rel=1e-4)


class _Hub:
    """The part of a message hub an optimizer wrapper uses."""

    def __init__(self) -> None:
        self.scalars: dict[str, list[float]] = {}

    def update_scalar(self, key: str, value: float) -> None:
        self.scalars.setdefault(key, []).append(value)


def test_an_attached_message_hub_receives_the_grad_norm():
    model = _model_with_grads()
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.0), clip_grad=dict(max_norm=0.5))
    assert optim_wrapper.message_hub is None  # the owner of the run attaches one
    optim_wrapper.message_hub = hub = _Hub()
    optim_wrapper.step()
    assert hub.scalars == {"train/grad_norm": [optim_wrapper.last_grad_norm]}


def test_clip_grad_by_value_clamps_gradients():
    model = _model_with_grads()
    clip_grad = dict(type="value", clip_value=0.1)
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.0), clip_grad=clip_grad)
    optim_wrapper.step()
    assert all(float(p.grad.abs().max()) <= 0.1 + 1e-7 for p in model.parameters())
    assert optim_wrapper.last_grad_norm is None
    assert clip_grad == dict(type="value", clip_value=0.1)  # the caller's dict is untouched


def test_clip_grad_type_defaults_to_norm_with_torch_arguments():
    model = _model_with_grads()
    optim_wrapper = OptimWrapper(
        SGD(model.parameters(), lr=0.0), clip_grad=dict(max_norm=1.0, norm_type=float("inf"))
    )
    expected = max(float(p.grad.abs().max()) for p in model.parameters())
    optim_wrapper.step()
    assert optim_wrapper.clip_grad_type == "norm"
    assert optim_wrapper.last_grad_norm == pytest.approx(expected)


def test_clip_grad_norm_can_refuse_a_non_finite_norm():
    model = _model_with_grads()
    model[0].weight.grad[0, 0] = float("inf")
    clip_grad = dict(max_norm=1.0, error_if_nonfinite=True)
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.0), clip_grad=clip_grad)
    with pytest.raises(RuntimeError, match="non-finite"):
        optim_wrapper.step()


# ---------------------------------------------------------------------- hyper-parameters, state


def test_get_lr_and_get_momentum_report_every_param_group():
    model = nn.Linear(2, 1)
    sgd = OptimWrapper(SGD(model.parameters(), lr=0.1, momentum=0.8))
    assert sgd.get_lr() == {"lr": [0.1]}
    assert sgd.get_momentum() == {"momentum": [0.8]}
    adam = OptimWrapper(Adam(model.parameters(), lr=0.01, betas=(0.7, 0.9)))
    assert adam.get_momentum() == {"momentum": [0.7]}
    assert OptimWrapper(Adagrad(model.parameters())).get_momentum() == {"momentum": [0]}
    groups = [{"params": [model.weight], "lr": 0.01}, {"params": [model.bias]}]
    two_groups = OptimWrapper(SGD(groups, lr=0.1))
    assert two_groups.get_lr() == {"base_lr": [0.1], "lr": [0.01, 0.1]}
    assert len(two_groups.param_groups) == 3  # base_param_settings is scheduled too
    assert two_groups.defaults["lr"] == 0.1


def test_state_dict_round_trip_resumes_the_optimizer_exactly():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    resumed_model = copy.deepcopy(model)
    groups = [{"params": [model.weight], "lr": 0.01}, {"params": [model.bias]}]
    optim_wrapper = OptimWrapper(Adam(groups, lr=0.1))
    data = torch.randn(4, 3)
    optim_wrapper.update_params(model(data).sum())
    optim_wrapper.base_param_settings["lr"] = 0.05  # as a scheduler would
    state = optim_wrapper.state_dict()
    assert state["base_param_settings"]["lr"] == 0.05

    resumed_groups = [{"params": [resumed_model.weight]}, {"params": [resumed_model.bias]}]
    resumed_model.load_state_dict(model.state_dict())
    resumed = OptimWrapper(Adam(resumed_groups, lr=0.1))
    snapshot = copy.deepcopy(state)
    resumed.load_state_dict(state)
    assert state.keys() == snapshot.keys()  # the caller's dict is not consumed
    assert resumed.get_lr() == {"base_lr": [0.05], "lr": [0.01, 0.1]}

    optim_wrapper.update_params(model(data).sum())
    resumed.update_params(resumed_model(data).sum())
    assert torch.equal(model.weight, resumed_model.weight)


class _PlainWrapper(BaseOptimWrapper):
    """A wrapper of another kind: only the four updating methods of its own."""

    def update_params(self, loss):
        self.backward(loss)
        self.step()
        self.zero_grad()

    def backward(self, loss, **kwargs):
        loss.backward(**kwargs)

    def step(self, **kwargs):
        self.optimizer.step(**kwargs)

    def zero_grad(self, **kwargs):
        self.optimizer.zero_grad(**kwargs)


def test_a_base_optim_wrapper_subclass_is_scheduled_and_saved_like_optim_wrapper():
    model = nn.Linear(2, 1)
    groups = [{"params": [model.weight], "lr": 0.01}, {"params": [model.bias]}]
    plain = _PlainWrapper(SGD(groups, lr=0.1, momentum=0.9))
    scheduler = StepLR(plain, step_size=1, gamma=0.5)
    plain.update_params(model(torch.randn(3, 2)).sum())
    scheduler.step()
    assert plain.get_lr() == {"base_lr": [0.05], "lr": [0.005, 0.05]}
    assert plain.state_dict()["base_param_settings"]["lr"] == 0.05
    assert isinstance(OptimWrapper(SGD(model.parameters(), lr=0.1)), BaseOptimWrapper)
    with pytest.raises(TypeError, match="abstract"):
        BaseOptimWrapper(SGD(model.parameters(), lr=0.1))  # type: ignore[abstract]


def test_hyper_parameters_and_state_are_mmengine_s():
    mm_optim = pytest.importorskip("mmengine.optim")
    model = nn.Linear(2, 1)
    groups = [{"params": [model.weight], "lr": 0.01}, {"params": [model.bias], "betas": (0.5, 1)}]
    adam = Adam(groups, lr=0.1)
    ours, theirs = OptimWrapper(adam), mm_optim.OptimWrapper(adam)
    assert ours.get_lr() == theirs.get_lr()
    assert ours.get_momentum() == theirs.get_momentum()
    assert len(ours.param_groups) == len(theirs.param_groups) == 3
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert ours.state_dict()["base_param_settings"].keys() == (
        theirs.state_dict()["base_param_settings"].keys()
    )


def test_introspection_properties_and_repr():
    optimizer = SGD(nn.Linear(1, 1).parameters(), lr=0.1)
    optim_wrapper = OptimWrapper(optimizer, accumulative_counts=2)
    assert optim_wrapper.param_groups is optimizer.param_groups
    assert optim_wrapper.accumulative_counts == 2
    assert optim_wrapper.inner_count == 0 and optim_wrapper.max_counts == -1
    assert optim_wrapper.state_dict() == optimizer.state_dict()
    assert "_accumulative_counts: 2" in repr(optim_wrapper) and "SGD" in repr(optim_wrapper)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(clip_grad=dict(type="l2", max_norm=1)), ValueError, "'norm', 'value'"),
        (dict(clip_grad=[1.0]), TypeError, "clip_grad must be None or a dict"),
        (dict(clip_grad=dict()), ValueError, "needs \\['max_norm'\\]"),
        (dict(clip_grad=dict(type="value", max_norm=1)), ValueError, "unknown keys"),
        (dict(accumulative_counts=0), ValueError, "accumulative_counts must be >= 1"),
        (dict(accumulative_counts=2.0), TypeError, "accumulative_counts must be an int"),
        (dict(accumulative_counts=True), TypeError, "accumulative_counts must be an int"),
    ],
)
def test_bad_arguments_are_rejected_at_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        OptimWrapper(SGD([_scalar_param()], lr=0.1), **kwargs)


def test_an_optimizer_config_instead_of_an_optimizer_is_rejected():
    with pytest.raises(TypeError, match="build_optim_wrapper"):
        OptimWrapper(dict(type="SGD", lr=0.1))  # type: ignore[arg-type]


# ---------------------------------------------------------------------- AmpOptimWrapper


def test_bf16_amp_runs_the_forward_under_cpu_autocast_without_a_scaler():
    model = nn.Linear(3, 2)
    optim_wrapper = AmpOptimWrapper(optimizer=SGD(model.parameters(), lr=0.1))  # dtype None
    assert optim_wrapper.cast_dtype == torch.bfloat16 and optim_wrapper.device_type == "cpu"
    assert optim_wrapper.loss_scaler is None
    with optim_wrapper.optim_context(model):
        out = model(torch.randn(4, 3))
    assert out.dtype == torch.bfloat16
    before = model.weight.detach().clone()
    optim_wrapper.update_params(out.float().sum())
    assert not torch.equal(before, model.weight)
    assert "loss_scaler" not in optim_wrapper.state_dict()


@pytest.mark.parametrize("dtype", ["float32", "float64", torch.float32])
def test_full_precision_amp_dtype_turns_autocast_off(dtype):
    # mmengine accepts them (valid_dtypes); torch's autocast has no float32 mode
    model = nn.Linear(3, 2)
    optim_wrapper = AmpOptimWrapper(optimizer=SGD(model.parameters(), lr=0.1), dtype=dtype)
    assert set(AmpOptimWrapper.valid_dtypes) == {"float16", "bfloat16", "float32", "float64"}
    assert optim_wrapper.loss_scaler is None
    with optim_wrapper.optim_context(model):
        assert not torch.is_autocast_enabled("cpu")
        out = model(torch.randn(4, 3))
    assert out.dtype == torch.float32


def test_fp16_amp_has_a_scaler_saved_and_restored_with_the_state_dict():
    model = nn.Linear(3, 2)
    optim_wrapper = AmpOptimWrapper(
        optimizer=SGD(model.parameters(), lr=0.1),
        dtype=torch.float16,
        loss_scale=dict(init_scale=2.0**4, growth_interval=1),
    )
    assert isinstance(optim_wrapper.loss_scaler, torch.amp.GradScaler)
    with optim_wrapper.optim_context(model):
        out = model(torch.randn(4, 3))
    assert out.dtype == torch.float16
    optim_wrapper.update_params(out.float().mean())
    state = optim_wrapper.state_dict()
    assert state["loss_scaler"]["scale"] == 2.0**5  # grew after one finite step

    restored = AmpOptimWrapper(optimizer=SGD(model.parameters(), lr=0.1), dtype="float16")
    restored.load_state_dict(state)
    assert restored.loss_scaler.get_scale() == 2.0**5
    assert "loss_scaler" in state


def test_fp16_static_loss_scale_stays_fixed_and_grads_are_unscaled_before_clipping():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    reference = copy.deepcopy(model)
    data = torch.randn(4, 3)
    optim_wrapper = AmpOptimWrapper(
        optimizer=SGD(model.parameters(), lr=0.0),
        dtype="float16",
        loss_scale=8.0,
        clip_grad=dict(max_norm=100.0),
    )
    for _ in range(2):
        with optim_wrapper.optim_context(model):
            loss = model(data).float().mean()
        optim_wrapper.update_params(loss)
        assert optim_wrapper.loss_scaler.get_scale() == 8.0
    reference(data).mean().backward()
    expected = torch.linalg.vector_norm(
        torch.cat([p.grad.flatten() for p in reference.parameters()])
    )
    assert optim_wrapper.last_grad_norm == pytest.approx(float(expected), rel=1e-2)


def test_use_fsdp_selects_the_sharded_grad_scaler():
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    optim_wrapper = AmpOptimWrapper(
        optimizer=SGD(nn.Linear(1, 1).parameters(), lr=0.1), dtype="float16", use_fsdp=True
    )
    assert isinstance(optim_wrapper.loss_scaler, ShardedGradScaler)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(dtype="fp16"), ValueError, "'float16', 'bfloat16'"),
        (dict(dtype=torch.int8), ValueError, "'float16', 'bfloat16'"),
        (dict(loss_scale="static"), ValueError, "'dynamic'"),
        (dict(loss_scale=-1.0), ValueError, "must be > 0"),
        (dict(loss_scale=[512.0]), TypeError, "loss_scale must be"),
        (dict(loss_scale=dict(scale=2.0)), ValueError, "unknown keys \\['scale'\\]"),
    ],
)
def test_amp_bad_dtype_or_loss_scale_is_rejected(kwargs, error, match):
    with pytest.raises(error, match=match):
        AmpOptimWrapper(optimizer=SGD([_scalar_param()], lr=0.1), **kwargs)


# ---------------------------------------------------------------------- OptimWrapperDict


def _gan_wrappers() -> tuple[OptimWrapperDict, nn.Module, nn.Module]:
    gen, disc = nn.Linear(2, 2), nn.Linear(2, 1)
    wrappers = OptimWrapperDict(
        generator=OptimWrapper(Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.999))),
        discriminator=OptimWrapper(SGD(disc.parameters(), lr=0.1, momentum=0.9)),
    )
    return wrappers, gen, disc


def test_optim_wrapper_dict_gives_dict_access_and_prefixed_hyper_parameters():
    wrappers, _, _ = _gan_wrappers()
    assert list(wrappers.keys()) == ["generator", "discriminator"]
    assert len(wrappers) == 2 and "generator" in wrappers and "critic" not in wrappers
    assert [name for name, _ in wrappers.items()] == list(wrappers)
    assert all(isinstance(w, OptimWrapper) for w in wrappers.values())
    assert wrappers["generator"].get_lr() == {"lr": [1e-3]}
    assert wrappers.get_lr() == {"generator.lr": [1e-3], "discriminator.lr": [0.1]}
    assert wrappers.get_momentum() == {"generator.momentum": [0.5], "discriminator.momentum": [0.9]}
    assert set(wrappers.param_groups) == {"generator", "discriminator"}
    assert "name: generator" in repr(wrappers)
    with pytest.raises(KeyError, match="critic"):
        wrappers["critic"]


def test_optim_wrapper_dict_state_dict_is_per_name():
    wrappers, gen, _ = _gan_wrappers()
    wrappers["generator"].update_params(gen(torch.ones(1, 2)).sum())
    state = wrappers.state_dict()
    assert set(state) == {"generator", "discriminator"} and state["generator"]["state"]
    fresh, _, _ = _gan_wrappers()
    fresh.load_state_dict(state)
    assert (
        fresh["generator"].optimizer.state_dict()["state"].keys()
        == state["generator"]["state"].keys()
    )
    with pytest.raises(KeyError, match="critic"):
        fresh.load_state_dict({"critic": state["generator"]})


def test_optim_wrapper_dict_leaves_updating_to_each_wrapper():
    wrappers, gen, disc = _gan_wrappers()
    loss = gen(torch.ones(1, 2)).sum()
    for call in (
        lambda: wrappers.update_params(loss),
        lambda: wrappers.backward(loss),
        lambda: wrappers.step(),
    ):
        with pytest.raises(NotImplementedError, match="generator"):
            call()
    with pytest.raises(NotImplementedError), wrappers.optim_context(gen):
        pass
    loss.backward()
    disc(torch.ones(1, 2)).sum().backward()
    wrappers.zero_grad()
    assert gen.weight.grad is None and disc.weight.grad is None
    wrappers.initialize_count_status(gen, 0, 10)
    assert [w.max_counts for w in wrappers.values()] == [10, 10]


def test_optim_wrapper_dict_accepts_only_optim_wrappers():
    with pytest.raises(TypeError, match="OptimWrapper"):
        OptimWrapperDict(generator=SGD([_scalar_param()], lr=0.1))


# ---------------------------------------------------------------------- two real ranks


def _ddp_skips_sync_on_accumulation_steps() -> list[bool]:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    ddp = DistributedDataParallel(model)
    optim_wrapper = OptimWrapper(SGD(ddp.parameters(), lr=0.0), accumulative_counts=2)
    inputs = torch.full((1, 2), float(rank + 1))

    def grads_equal_across_ranks() -> bool:
        grads = [torch.zeros_like(model.weight.grad) for _ in range(2)]
        dist.all_gather(grads, model.weight.grad)
        return torch.equal(grads[0], grads[1])

    equal = []
    for _ in range(2):
        with optim_wrapper.optim_context(ddp):
            loss = ddp(inputs).sum()
        optim_wrapper.backward(optim_wrapper.scale_loss(loss))  # no step: inspect the grads
        equal.append(grads_equal_across_ranks())
    return equal


def test_ddp_grads_are_not_all_reduced_on_a_non_update_step():
    results = run_distributed(_ddp_skips_sync_on_accumulation_steps, 2, init_pg=True)
    assert results == [[False, True], [False, True]]


def _fsdp2_clip_and_accumulate() -> dict[str, object]:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    reference = copy.deepcopy(model)
    mixed, mixed_reference = copy.deepcopy(model), copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (2,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    fully_shard(mixed[0], mesh=mesh)  # DTensor grads in layer 0, plain grads in layer 2
    result: dict[str, object] = {}

    # Clipping sharded grads: same data on both ranks, compare with the unsharded model.
    data = torch.randn(5, 4)
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.0), clip_grad=dict(max_norm=0.1))
    ref_wrapper = OptimWrapper(SGD(reference.parameters(), lr=0.0), clip_grad=dict(max_norm=0.1))
    for m, w in ((model, optim_wrapper), (reference, ref_wrapper)):
        m(data).pow(2).sum().backward()
        w.step()
    result["norm"] = optim_wrapper.last_grad_norm
    result["ref_norm"] = ref_wrapper.last_grad_norm
    result["clipped_grads_match"] = all(
        torch.allclose(p.grad.full_tensor(), q.grad, atol=1e-6)
        for p, q in zip(model.parameters(), reference.parameters())
    )
    optim_wrapper.zero_grad()
    ref_wrapper.zero_grad()
    for m in (mixed, mixed_reference):
        m(data).pow(2).sum().backward()
    result["mixed_norm"] = float(clip_grad_norm_(list(mixed.parameters()), 0.1))
    result["mixed_ref_norm"] = float(clip_grad_norm_(list(mixed_reference.parameters()), 0.1))

    # Accumulating 2 iterations: no reduce-scatter on the first, the right mean on the second.
    optim_wrapper = OptimWrapper(SGD(model.parameters(), lr=0.0), accumulative_counts=2)
    batches = torch.randn(2, 2, 3, 4)  # [iteration, rank, batch, features]
    has_grads = []
    for it in range(2):
        with optim_wrapper.optim_context(model):
            loss = model(batches[it, rank]).sum()
        optim_wrapper.backward(optim_wrapper.scale_loss(loss))
        has_grads.append(any(p.grad is not None for p in model.parameters()))
    for it in range(2):
        for r in range(2):
            (reference(batches[it, r]).sum() / 2 / 2).backward()  # / accumulation / ranks
    result["has_grads_after_each_backward"] = has_grads
    result["accumulated_grads_match"] = all(
        torch.allclose(p.grad.full_tensor(), q.grad, atol=1e-5)
        for p, q in zip(model.parameters(), reference.parameters())
    )
    optim_wrapper.zero_grad()

    # fp16 with the sharded grad scaler: unscale, clip and step on DTensor grads.
    optim_wrapper = AmpOptimWrapper(
        optimizer=SGD(model.parameters(), lr=0.1),
        dtype="float16",
        use_fsdp=True,
        loss_scale=dict(init_scale=4.0),
        clip_grad=dict(max_norm=0.5),
    )
    before = [p.full_tensor().clone() for p in model.parameters()]
    with optim_wrapper.optim_context(model):
        out = model(data)
    optim_wrapper.update_params(out.float().mean())
    result["fp16_out_dtype"] = out.dtype
    result["fp16_steps_taken"] = optim_wrapper.state_dict()["loss_scaler"]["_growth_tracker"]
    result["fp16_params_changed"] = all(
        not torch.equal(b, p.full_tensor()) for b, p in zip(before, model.parameters())
    )
    return result


def test_fsdp2_sharded_grads_clip_to_the_global_norm_skip_sync_and_scale_in_fp16():
    for result in run_distributed(_fsdp2_clip_and_accumulate, 2, init_pg=True):
        assert result["norm"] == pytest.approx(result["ref_norm"], rel=1e-5)
        assert result["norm"] > 0.1  # clipping did act
        assert result["clipped_grads_match"]
        assert result["mixed_norm"] == pytest.approx(result["mixed_ref_norm"], rel=1e-5)
        assert result["has_grads_after_each_backward"] == [False, True]
        assert result["accumulated_grads_match"]
        assert result["fp16_out_dtype"] == torch.float16
        assert result["fp16_steps_taken"] == 1 and result["fp16_params_changed"]
