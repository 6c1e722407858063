"""Parameter schedulers: value sequences, windows, composition, conversion, state, bad input.

Expected values are closed forms (as in mmengine's tests) and, where torch has the same
schedule, the values of ``torch.optim.lr_scheduler`` run side by side.
"""

from __future__ import annotations

import io
import logging
import math
import warnings
from collections.abc import Callable

import pytest
import torch
from torch.optim import lr_scheduler as torch_sched

from shardwise.optim import scheduler as sched
from shardwise.optim.scheduler import (
    ConstantLR,
    CosineAnnealingLR,
    CosineAnnealingMomentum,
    CosineAnnealingParamScheduler,
    CosineRestartLR,
    CosineRestartParamScheduler,
    ExponentialLR,
    LinearLR,
    MultiStepLR,
    MultiStepParamScheduler,
    OneCycleLR,
    OneCycleParamScheduler,
    PolyLR,
    ReduceOnPlateauLR,
    ReduceOnPlateauMomentum,
    StepLR,
    StepMomentum,
    StepParamScheduler,
    _ParamScheduler,
    build_param_scheduler,
)
from shardwise.registry import PARAM_SCHEDULERS

BASE_LRS = [0.05, 0.5]
LOSSES = [1.0, 0.9, 0.95, 0.96, 0.97, 0.8, 0.81, 0.82, 0.83, 0.84, 0.85, 0.7, 0.71, 0.72, 0.73]


def make_sgd() -> torch.optim.SGD:
    """Two param groups: lr 0.05 / 0.5, momentum 0.01 / 0.1, weight decay 5e-4 / 5e-3."""
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD(
        [{"params": [a]}, {"params": [b], "lr": 0.5, "momentum": 0.1, "weight_decay": 5e-3}],
        lr=0.05,
        momentum=0.01,
        weight_decay=5e-4,
    )


def make_adam() -> torch.optim.Adam:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.Adam(
        [{"params": [a]}, {"params": [b], "betas": (0.8, 0.99)}], lr=0.05, betas=(0.9, 0.999)
    )


def advance(schedulers: list, i: int) -> None:
    """One epoch/iteration of a training loop: a plateau scheduler also sees a validation."""
    for s in schedulers:
        if getattr(s, "need_val_args", False):  # mmengine: only on ReduceOnPlateau
            s.step()
            s.step({"loss": LOSSES[i % len(LOSSES)]})
        else:
            s.step()


def trace(opt, schedulers, steps: int, key: str = "lr", start: int = 0) -> list[list]:
    """The value of ``key`` in every group before each step (optimizer first, then schedulers)."""
    out = []
    for i in range(start, start + steps):
        out.append([group[key] for group in opt.param_groups])
        opt.step()
        advance(schedulers, i)
    return out


def trace_torch(opt, torch_scheduler, steps: int) -> list[list[float]]:
    out = []
    for _ in range(steps):
        out.append([group["lr"] for group in opt.param_groups])
        opt.step()
        torch_scheduler.step()
    return out


def per_group(single: list[float], bases=BASE_LRS) -> list[list[float]]:
    """Expected values of both groups from a schedule of factors on the base value."""
    return [[f * base for base in bases] for f in single]


def assert_values(actual, expected) -> None:
    assert len(actual) == len(expected)
    for step, (a, e) in enumerate(zip(actual, expected)):
        assert a == pytest.approx(e, rel=1e-9, abs=1e-12), f"step {step}: {a} != {e}"


# ----------------------------------------------------------------------------- value sequences


def test_step_lr_multiplies_by_gamma_every_step_size():
    opt, ref = make_sgd(), make_sgd()
    actual = trace(opt, [StepLR(opt, step_size=3, gamma=0.1)], 10)
    factors = [1] * 3 + [0.1] * 3 + [0.01] * 3 + [0.001]
    assert_values(actual, per_group(factors))
    assert_values(actual, trace_torch(ref, torch_sched.StepLR(ref, step_size=3, gamma=0.1), 10))


def test_multi_step_lr_multiplies_by_gamma_at_each_milestone():
    opt, ref = make_sgd(), make_sgd()
    actual = trace(opt, [MultiStepLR(opt, milestones=[2, 5, 9], gamma=0.1)], 11)
    factors = [1] * 2 + [0.1] * 3 + [0.01] * 4 + [0.001] * 2
    assert_values(actual, per_group(factors))
    torch_ref = torch_sched.MultiStepLR(ref, milestones=[2, 5, 9], gamma=0.1)
    assert_values(actual, trace_torch(ref, torch_ref, 11))


def test_multi_step_lr_repeated_milestone_applies_gamma_twice():
    opt = make_sgd()
    actual = trace(opt, [MultiStepLR(opt, milestones=[2, 2], gamma=0.5)], 4)
    assert_values(actual, per_group([1, 1, 0.25, 0.25]))


def test_constant_lr_scales_until_end_then_restores():
    opt, ref = make_sgd(), make_sgd()
    actual = trace(opt, [ConstantLR(opt, factor=0.5, end=5)], 10)
    assert_values(actual, per_group([0.5] * 4 + [1.0] * 6))
    torch_ref = torch_sched.ConstantLR(ref, factor=0.5, total_iters=4)
    assert_values(actual, trace_torch(ref, torch_ref, 10))


def test_linear_lr_warms_up_linearly_to_end_factor():
    opt, ref = make_sgd(), make_sgd()
    actual = trace(opt, [LinearLR(opt, start_factor=0.5, end=5)], 10)
    assert_values(actual, per_group([0.5 + 0.5 * t / 4 for t in range(4)] + [1.0] * 6))
    torch_ref = torch_sched.LinearLR(ref, start_factor=0.5, total_iters=4)
    assert_values(actual, trace_torch(ref, torch_ref, 10))


def test_linear_lr_can_decay_to_a_smaller_end_factor():
    opt = make_sgd()
    actual = trace(opt, [LinearLR(opt, start_factor=1.0, end_factor=0.2, end=5)], 7)
    assert_values(actual, per_group([1.0 - 0.8 * t / 4 for t in range(5)] + [0.2] * 2))


def test_linear_lr_can_warm_up_from_zero():
    # mmengine accepts start_factor=0 (and then divides by zero at the next step); torch's
    # LinearLR rejects it. From 0 the next value is the initial value times the factor.
    opt = make_sgd()
    actual = trace(opt, [LinearLR(opt, start_factor=0, end=5)], 7)
    assert_values(actual, per_group([t / 4 for t in range(5)] + [1.0] * 2))


def test_exponential_lr_multiplies_by_gamma_every_step():
    opt, ref = make_sgd(), make_sgd()
    actual = trace(opt, [ExponentialLR(opt, gamma=0.9)], 10)
    assert_values(actual, per_group([0.9**t for t in range(10)]))
    assert_values(actual, trace_torch(ref, torch_sched.ExponentialLR(ref, gamma=0.9), 10))


def test_cosine_annealing_lr_follows_closed_form_and_torch_past_t_max():
    opt, ref = make_sgd(), make_sgd()
    t_max, eta_min, steps = 10, 1e-4, 25  # past T_max: the value rises again, as in torch
    actual = trace(opt, [CosineAnnealingLR(opt, T_max=t_max, eta_min=eta_min)], steps)
    expected = [
        [eta_min + (base - eta_min) * (1 + math.cos(math.pi * t / t_max)) / 2 for base in BASE_LRS]
        for t in range(steps)
    ]
    assert_values(actual, expected)
    torch_ref = torch_sched.CosineAnnealingLR(ref, T_max=t_max, eta_min=eta_min)
    assert_values(actual, trace_torch(ref, torch_ref, steps))


def test_cosine_annealing_eta_min_ratio_is_relative_to_each_groups_initial_value():
    opt = make_sgd()
    actual = trace(opt, [CosineAnnealingLR(opt, eta_min_ratio=0.1, end=11)], 12)
    expected = [
        [
            0.1 * base + 0.9 * base * (1 + math.cos(math.pi * min(t, 10) / 11)) / 2
            for base in BASE_LRS
        ]
        for t in range(12)
    ]
    assert_values(actual, expected)  # T_max defaults to end - begin; frozen after end


def test_poly_lr_decays_polynomially_to_eta_min():
    opt, ref = make_sgd(), make_sgd()
    power, eta_min, total = 2.0, 0.001, 8  # total_iters = end - begin - 1
    actual = trace(opt, [PolyLR(opt, power=power, eta_min=eta_min, end=total + 1)], 11)
    expected = [
        [eta_min + (base - eta_min) * (1 - min(t, total) / total) ** power for base in BASE_LRS]
        for t in range(11)
    ]
    assert_values(actual, expected)
    ref_opt_lr = trace(ref, [PolyLR(ref, power=power, end=total + 1)], 11)
    torch_opt = make_sgd()
    torch_ref = torch_sched.PolynomialLR(torch_opt, total_iters=total, power=power)
    assert_values(ref_opt_lr, trace_torch(torch_opt, torch_ref, 11))


@pytest.mark.parametrize("three_phase", [False, True])
@pytest.mark.parametrize("anneal_strategy", ["cos", "linear"])
def test_one_cycle_lr_matches_torch(three_phase, anneal_strategy):
    opt, ref = make_sgd(), make_sgd()
    kwargs = dict(
        total_steps=20, pct_start=0.3, anneal_strategy=anneal_strategy, div_factor=10.0,
        final_div_factor=100.0, three_phase=three_phase,
    )  # fmt: skip
    actual = trace(opt, [OneCycleLR(opt, eta_max=[0.1, 1.0], by_epoch=False, **kwargs)], 20)
    torch_ref = torch_sched.OneCycleLR(ref, max_lr=[0.1, 1.0], cycle_momentum=False, **kwargs)
    assert_values(actual, trace_torch(ref, torch_ref, 20))
    assert actual[0] == pytest.approx([0.01, 0.1])
    assert max(v[0] for v in actual) == pytest.approx(0.1)


def test_one_cycle_total_steps_defaults_to_window_length():
    opt, ref = make_sgd(), make_sgd()
    actual = trace(opt, [OneCycleLR(opt, eta_max=0.1, begin=0, end=10)], 10)
    torch_ref = torch_sched.OneCycleLR(ref, max_lr=0.1, total_steps=10, cycle_momentum=False)
    assert_values(actual, trace_torch(ref, torch_ref, 10))


def test_cosine_restart_lr_restarts_each_period_at_weighted_initial_value():
    opt = make_sgd()
    periods, weights, eta_min = [4, 6], [1.0, 0.5], 0.001
    actual = trace(
        opt, [CosineRestartLR(opt, periods=periods, restart_weights=weights, eta_min=eta_min)], 12
    )
    expected = []
    for t in range(12):
        idx, s = (0, t) if t < 4 else (1, t - 4)
        if t >= 10:  # past the periods: the value stays where the last period left it
            idx, s = 1, 5
        expected.append(
            [
                eta_min
                + (base * weights[idx] - eta_min) * (1 + math.cos(math.pi * s / periods[idx])) / 2
                for base in BASE_LRS
            ]
        )
    assert_values(actual, expected)


def test_cosine_restart_eta_min_ratio_is_relative_to_initial_value():
    opt = make_sgd()
    actual = trace(opt, [CosineRestartLR(opt, periods=[5], eta_min_ratio=0.2)], 5)
    expected = [
        [0.2 * base + 0.8 * base * (1 + math.cos(math.pi * t / 5)) / 2 for base in BASE_LRS]
        for t in range(5)
    ]
    assert_values(actual, expected)


@pytest.mark.parametrize(
    ("rule", "threshold_rule", "metric_sign"), [("less", "rel", 1), ("greater", "abs", -1)]
)
def test_reduce_on_plateau_lr_matches_torch(rule, threshold_rule, metric_sign):
    opt, ref = make_sgd(), make_sgd()
    kwargs = dict(factor=0.5, patience=1, threshold=1e-3, cooldown=1)
    scheduler = ReduceOnPlateauLR(
        opt, monitor="loss", rule=rule, threshold_rule=threshold_rule, min_value=0.01, **kwargs
    )
    mode = "min" if rule == "less" else "max"
    torch_ref = torch_sched.ReduceLROnPlateau(
        ref, mode=mode, threshold_mode=threshold_rule, min_lr=0.01, **kwargs
    )
    actual, expected = [], []
    for loss in LOSSES:
        opt.step()
        scheduler.step()  # end of a training epoch: only counted
        scheduler.step({"loss": metric_sign * loss, "acc": 0.0})
        actual.append([g["lr"] for g in opt.param_groups])
        ref.step()
        torch_ref.step(metric_sign * loss)
        expected.append([g["lr"] for g in ref.param_groups])
    assert_values(actual, expected)
    assert actual[-1] != actual[0]  # it did reduce
    assert scheduler.get_last_value() == actual[-1]


def test_reduce_on_plateau_takes_metric_tensors_and_checks_its_input():
    opt = make_sgd()
    scheduler = ReduceOnPlateauLR(opt, monitor="loss", patience=0, factor=0.5)
    scheduler.step({"loss": torch.tensor(1.0)})
    scheduler.step({"loss": torch.tensor(2.0)})
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    with pytest.raises(KeyError, match="'loss'.*acc"):
        scheduler.step({"acc": 0.5})
    with pytest.raises(TypeError, match="dict"):
        scheduler.step(0.5)  # type: ignore[arg-type]


# ------------------------------------------------------------------- windows, by_epoch, builder


def test_scheduler_acts_only_within_begin_end():
    opt = make_sgd()
    actual = trace(opt, [LinearLR(opt, start_factor=0.5, begin=1, end=6)], 10)
    factors = [1.0] + [0.5 + 0.5 * t / 4 for t in range(4)] + [1.0] * 5
    assert_values(actual, per_group(factors))


def test_scheduler_leaves_value_alone_outside_its_window():
    opt = make_sgd()
    actual = trace(opt, [StepLR(opt, step_size=1, gamma=0.5, begin=2, end=4)], 7)
    # steps 0-1 untouched, step 2 is the scheduler's step 0, step 3 its step 1 (halves), then frozen
    assert_values(actual, per_group([1, 1, 1, 0.5, 0.5, 0.5, 0.5]))


def test_warmup_then_cosine_composes_into_one_schedule():
    opt = make_sgd()
    schedulers = build_param_scheduler(
        [
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=5),
            dict(type="CosineAnnealingLR", by_epoch=False, begin=5, end=20, eta_min=0.0),
        ],
        opt,
    )
    actual = trace(opt, schedulers, 25)
    factors = [0.1 + 0.9 * t / 4 for t in range(5)]
    factors += [(1 + math.cos(math.pi * k / 15)) / 2 for k in range(15)]
    factors += [factors[-1]] * 5  # frozen after end
    assert_values(actual, per_group(factors))


def test_overlapping_schedulers_multiply_their_effects():
    # mmengine's test_multi_scheduler_with_overlap
    opt = make_sgd()
    schedulers = [
        LinearLR(opt, start_factor=0.5, begin=0, end=5),
        MultiStepLR(opt, gamma=0.1, milestones=[3, 6, 9]),
    ]
    factors = [0.5, 0.625, 0.75, 0.0875] + [0.1] * 2 + [0.01] * 3 + [0.001]
    assert_values(trace(opt, schedulers, 10), per_group(factors))


def test_chained_exponential_then_cosine_starts_from_current_value():
    # mmengine's test_multi_scheduler_without_overlap_exp_cosine
    opt = make_sgd()
    schedulers = [
        ExponentialLR(opt, gamma=0.9, begin=0, end=5),
        CosineAnnealingLR(opt, T_max=5, eta_min=0.0, begin=5, end=10),
    ]
    exp_part = [0.9**t for t in range(5)]
    cos_part = [exp_part[-1] * (1 + math.cos(math.pi * k / 5)) / 2 for k in range(5)]
    assert_values(trace(opt, schedulers, 10), per_group(exp_part + cos_part))


def test_by_epoch_is_recorded_for_the_training_loop():
    opt = make_sgd()
    assert StepLR(opt, step_size=1).by_epoch is True
    assert StepLR(opt, step_size=1, by_epoch=False).by_epoch is False


def test_convert_to_iter_based_multiplies_steps_by_epoch_length():
    opt = make_sgd()
    scheduler = build_param_scheduler(
        dict(type="StepLR", step_size=2, gamma=0.5, begin=1, end=5, convert_to_iter_based=True),
        opt,
        epoch_length=3,
    )
    assert (scheduler.begin, scheduler.end, scheduler.step_size) == (3, 15, 6)
    assert scheduler.by_epoch is False
    actual = trace(opt, [scheduler], 20)
    # iteration i: the scheduler's step i - 3 halves every 6 iterations, frozen from i = 15
    factors = [0.5 ** ((min(i, 14) - 3) // 6) if i >= 3 else 1.0 for i in range(20)]
    assert_values(actual, per_group(factors))


@pytest.mark.parametrize(
    ("cfg", "attr", "expected"),
    [
        (dict(type="MultiStepLR", milestones=[1, 3]), "milestones", {4: 1, 12: 1}),
        (dict(type="CosineAnnealingLR", T_max=2), "T_max", 8),
        (dict(type="CosineAnnealingLR", end=5), "T_max", 20),  # end - begin, in iterations
        (
            dict(type="CosineRestartLR", periods=[1, 2], restart_weights=[1, 1], eta_min=0.0),
            "periods",
            [4, 8],
        ),
        (dict(type="OneCycleLR", eta_max=0.1, total_steps=3), "total_steps", 12),
        (dict(type="LinearLR", start_factor=0.5, end=2), "total_iters", 7),
        (dict(type="ConstantMomentum", factor=0.5, end=2), "end", 8),
    ],
)
def test_convert_to_iter_based_scales_every_step_count(cfg, attr, expected):
    opt = make_sgd()
    scheduler = build_param_scheduler({**cfg, "convert_to_iter_based": True}, opt, epoch_length=4)
    assert getattr(scheduler, attr) == expected
    assert scheduler.by_epoch is False


def test_build_iter_from_epoch_keeps_an_open_end_open():
    scheduler = ExponentialLR.build_iter_from_epoch(make_sgd(), gamma=0.9, epoch_length=10)
    assert (scheduler.begin, scheduler.end) == (0, sched.param_scheduler.INF)


def test_build_param_scheduler_accepts_name_class_dotted_path_and_built_schedulers():
    opt = make_sgd()
    built = StepLR(opt, step_size=1)
    schedulers = build_param_scheduler(
        [
            dict(type="StepLR", step_size=2),
            dict(type=StepLR, step_size=2),
            dict(type="shardwise.optim.scheduler.StepLR", step_size=2),
            dict(type="StepParamScheduler", param_name="weight_decay", step_size=2),
            built,
        ],
        opt,
    )
    assert [type(s) for s in schedulers] == [StepLR] * 3 + [StepParamScheduler, StepLR]
    assert schedulers[-1] is built


def test_every_public_scheduler_is_registered_and_exported_from_shardwise_optim():
    import shardwise.optim

    names = [n for n in sched.__all__ if n not in ("build_param_scheduler", "_ParamScheduler")]
    assert len(names) == 29
    for name in names:
        assert PARAM_SCHEDULERS.get(name) is getattr(sched, name)
        assert getattr(shardwise.optim, name) is getattr(sched, name)
    assert shardwise.optim.build_param_scheduler is build_param_scheduler


# ----------------------------------------------------------- lr / momentum / generic param forms

FORMS = {
    "Constant": dict(factor=0.5, end=4),
    "Linear": dict(start_factor=0.25, end=5),
    "Step": dict(step_size=2, gamma=0.5),
    "MultiStep": dict(milestones=[1, 3], gamma=0.5),
    "Exponential": dict(gamma=0.9),
    "CosineAnnealing": dict(T_max=4, eta_min=0.001),
    "Poly": dict(power=2.0, end=6),
    "CosineRestart": dict(periods=[3, 3], restart_weights=[1, 0.5], eta_min=0.0),
    "ReduceOnPlateau": dict(patience=1, factor=0.5),
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_lr_form_is_the_generic_scheduler_on_lr(form):
    generic_opt, lr_opt = make_sgd(), make_sgd()
    generic = PARAM_SCHEDULERS.get(f"{form}ParamScheduler")(generic_opt, "lr", **FORMS[form])
    lr_form = PARAM_SCHEDULERS.get(f"{form}LR")(lr_opt, **FORMS[form])
    assert lr_form.param_name == "lr"
    assert_values(trace(lr_opt, [lr_form], 8), trace(generic_opt, [generic], 8))


@pytest.mark.parametrize("form", sorted(FORMS))
def test_momentum_form_schedules_sgd_momentum_and_adam_beta1(form):
    generic_opt, sgd, adam = make_sgd(), make_sgd(), make_adam()
    for group, momentum in zip(generic_opt.param_groups, [0.9, 0.8]):
        group["momentum"] = momentum  # the Adam betas[0] values
    for group, momentum in zip(sgd.param_groups, [0.9, 0.8]):
        group["momentum"] = momentum
    cls = PARAM_SCHEDULERS.get(f"{form}Momentum")
    generic = PARAM_SCHEDULERS.get(f"{form}ParamScheduler")(generic_opt, "momentum", **FORMS[form])
    sgd_form, adam_form = cls(sgd, **FORMS[form]), cls(adam, **FORMS[form])
    expected = trace(generic_opt, [generic], 8, key="momentum")
    assert_values(trace(sgd, [sgd_form], 8, key="momentum"), expected)
    betas = trace(adam, [adam_form], 8, key="betas")
    assert_values([[b[0] for b in step] for step in betas], expected)
    assert all(step[0][1] == 0.999 and step[1][1] == 0.99 for step in betas)  # beta2 untouched
    assert adam.param_groups[0]["initial_momentum"] == 0.9


def test_momentum_on_adam_keeps_the_optimizer_working():
    param = torch.nn.Parameter(torch.ones(3))
    adam = torch.optim.AdamW([param], lr=0.1, betas=(0.9, 0.999))
    scheduler = CosineAnnealingMomentum(adam, T_max=4, eta_min=0.5, by_epoch=False)
    for _ in range(4):
        adam.zero_grad()
        (param**2).sum().backward()
        adam.step()
        scheduler.step()
    assert adam.param_groups[0]["betas"][0] == pytest.approx(
        0.5 + 0.4 * (1 + math.cos(math.pi)) / 2
    )
    assert torch.isfinite(param).all()


def test_reduce_on_plateau_momentum_updates_adam_betas():
    adam = make_adam()
    scheduler = ReduceOnPlateauMomentum(adam, patience=0, factor=0.5)
    scheduler.step({"loss": 1.0})
    scheduler.step({"loss": 2.0})
    assert adam.param_groups[0]["betas"] == pytest.approx((0.45, 0.999))


def test_weight_decay_is_scheduled_through_generic_param_name():
    opt = make_sgd()
    scheduler = MultiStepParamScheduler(opt, "weight_decay", milestones=[2, 4], gamma=0.5)
    actual = trace(opt, [scheduler], 6, key="weight_decay")
    assert_values(actual, per_group([1, 1, 0.5, 0.5, 0.25, 0.25], bases=[5e-4, 5e-3]))
    assert [g["initial_weight_decay"] for g in opt.param_groups] == [5e-4, 5e-3]
    assert [g["lr"] for g in opt.param_groups] == BASE_LRS  # other keys untouched


def test_initial_value_is_recorded_once_in_every_param_group():
    opt = make_sgd()
    StepLR(opt, step_size=1, gamma=0.5)
    opt.param_groups[0]["lr"] = 0.001
    second = ExponentialLR(opt, gamma=0.9)
    assert [g["initial_lr"] for g in opt.param_groups] == BASE_LRS
    assert second.base_values == BASE_LRS


def test_generic_param_scheduler_cannot_be_used_without_a_schedule():
    with pytest.raises(NotImplementedError):
        _ParamScheduler(make_sgd(), "lr")


# ----------------------------------------------------------------------- state and resumption


def _plateau(opt):
    return [ReduceOnPlateauLR(opt, patience=1, factor=0.5, cooldown=1)]


ROUND_TRIP_CASES: dict[str, tuple[Callable, Callable]] = {
    "step": (make_sgd, lambda opt: [StepLR(opt, step_size=3, gamma=0.5)]),
    "multi_step": (make_sgd, lambda opt: [MultiStepLR(opt, milestones=[2, 7, 9])]),
    "warmup_cosine": (
        make_sgd,
        lambda opt: [
            LinearLR(opt, start_factor=0.1, end=4, by_epoch=False),
            CosineAnnealingLR(opt, begin=4, end=12, by_epoch=False, eta_min_ratio=0.01),
        ],
    ),
    "one_cycle": (make_sgd, lambda opt: [OneCycleLR(opt, eta_max=0.1, total_steps=12)]),
    "cosine_restart": (
        make_sgd,
        lambda opt: [CosineRestartLR(opt, periods=[4, 8], restart_weights=[1, 0.3], eta_min=0)],
    ),
    "poly_and_constant": (
        make_sgd,
        lambda opt: [ConstantLR(opt, factor=0.5, end=6), PolyLR(opt, power=0.5, end=12)],
    ),
    "plateau": (make_sgd, _plateau),
    "momentum_on_adam": (make_adam, lambda opt: [StepMomentum(opt, step_size=2, gamma=0.9)]),
}


def _snapshot(opt) -> list[float]:
    return [v for g in opt.param_groups for v in (g["lr"], g.get("momentum"), *g.get("betas", ()))]


@pytest.mark.parametrize("case", sorted(ROUND_TRIP_CASES))
def test_state_dict_round_trip_mid_run_continues_identically(case):
    make_opt, make_schedulers = ROUND_TRIP_CASES[case]
    total, stop = 12, 5

    ref_opt = make_opt()
    ref_schedulers = make_schedulers(ref_opt)
    reference = []
    for i in range(total):
        reference.append(_snapshot(ref_opt))
        ref_opt.step()
        advance(ref_schedulers, i)

    opt = make_opt()
    schedulers = make_schedulers(opt)
    resumed = []
    for i in range(stop):
        resumed.append(_snapshot(opt))
        opt.step()
        advance(schedulers, i)
    buffer = io.BytesIO()  # as a checkpoint: plain data, loadable with weights_only=True
    torch.save(
        {"optimizer": opt.state_dict(), "sched": [s.state_dict() for s in schedulers]}, buffer
    )
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)

    new_opt = make_opt()
    new_schedulers = make_schedulers(new_opt)
    new_opt.load_state_dict(checkpoint["optimizer"])
    for scheduler, state in zip(new_schedulers, checkpoint["sched"]):
        scheduler.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ordering warning after a resume
        for i in range(stop, total):
            resumed.append(_snapshot(new_opt))
            new_opt.step()
            advance(new_schedulers, i)
    assert resumed == reference  # bit for bit
    assert len({tuple(step) for step in reference}) > 2  # the schedule did change the values


@pytest.mark.parametrize("case", sorted(ROUND_TRIP_CASES))
def test_a_loaded_scheduler_equals_the_saved_one_attribute_by_attribute(case):
    # mmengine's _check_scheduler_state_dict: a scheduler built with other arguments takes
    # every attribute of the saved one, and nothing else tells them apart
    make_opt, make_schedulers = ROUND_TRIP_CASES[case]
    opt = make_opt()
    schedulers = make_schedulers(opt)
    for i in range(5):
        opt.step()
        advance(schedulers, i)
    fresh = make_schedulers(make_opt())
    for saved, loaded in zip(schedulers, fresh):
        loaded.load_state_dict(saved.state_dict())
        assert vars(loaded).keys() == vars(saved).keys()
        for key in vars(saved).keys() - {"optimizer"}:
            assert getattr(loaded, key) == getattr(saved, key), key


MMENGINE_SCHEDULERS = {
    "StepLR": dict(step_size=2, gamma=0.5),
    "MultiStepLR": dict(milestones=[2, 5, 7], gamma=0.5),
    "LinearLR": dict(start_factor=0.25, end=6),
    "CosineAnnealingLR": dict(T_max=10, eta_min=0.001),
    "PolyLR": dict(power=2.0, eta_min=0.001, end=10),
    "OneCycleLR": dict(eta_max=0.1, total_steps=12),
    "CosineRestartLR": dict(periods=[4, 6], restart_weights=[1, 0.5], eta_min=0.0),
}


@pytest.mark.parametrize("name", sorted(MMENGINE_SCHEDULERS))
def test_an_mmengine_scheduler_state_resumes_in_shardwise(name):
    # a checkpoint of mmengine's Runner holds its schedulers' state_dict(): shardwise's
    # scheduler of the same name loads it and goes on with the values mmengine would set
    mm_sched = pytest.importorskip("mmengine.optim.scheduler")
    kwargs = MMENGINE_SCHEDULERS[name]
    mm_opt = make_sgd()
    mm_scheduler = getattr(mm_sched, name)(mm_opt, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # mmengine's own step-order check
        trace(mm_opt, [mm_scheduler], 4)
        opt = make_sgd()  # a resume: build, then load the optimizer and the scheduler
        scheduler = getattr(sched, name)(opt, **kwargs)
        opt.load_state_dict(mm_opt.state_dict())
        scheduler.load_state_dict(mm_scheduler.state_dict())
        expected = trace(mm_opt, [mm_scheduler], 8, start=4)
    assert trace(opt, [scheduler], 8, start=4) == expected


def test_state_dict_holds_the_schedule_but_not_the_optimizer():
    opt = make_sgd()
    scheduler = StepLR(opt, step_size=3)
    state = scheduler.state_dict()
    assert "optimizer" not in state
    assert {"last_step", "base_values", "step_size", "gamma", "begin", "end"} <= set(state)
    state["step_size"] = 99
    assert scheduler.step_size == 3  # a copy


def test_last_step_resumes_without_state_dict():
    # mmengine's test_resume: a checkpoint taken after 4 scheduler steps, before the 5th; the
    # rebuilt scheduler (optimizer groups restored, last_step=4) takes the 5th on construction
    opt = make_sgd()
    scheduler = ExponentialLR(opt, gamma=0.9)
    values = trace(opt, [scheduler], 4)
    values.append([g["lr"] for g in opt.param_groups])
    resumed = ExponentialLR(opt, gamma=0.9, last_step=4)
    values += trace(opt, [resumed], 5)
    assert_values(values, per_group([0.9**t for t in range(10)]))


def test_get_last_value_is_the_value_after_the_last_step():
    opt = make_sgd()
    scheduler = StepLR(opt, step_size=2, gamma=0.1)
    assert scheduler.get_last_value() == BASE_LRS
    for _ in range(2):
        opt.step()
        scheduler.step()
    assert scheduler.get_last_value() == pytest.approx([0.005, 0.05])
    assert scheduler.last_step == 2


# ------------------------------------------------------------------------ optimizer wrappers


class OnlyOptimizer:
    """The least an optimizer wrapper has: ``.optimizer``."""

    def __init__(self, optimizer):
        self.optimizer = optimizer


class WrapperWithBaseSettings(OnlyOptimizer):
    """Like mmengine's OptimWrapper: ``param_groups`` ends with ``base_param_settings``."""

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self.base_param_settings = {"params": [], **optimizer.defaults}

    @property
    def param_groups(self):
        return self.optimizer.param_groups + [self.base_param_settings]


def test_works_with_an_object_that_has_optimizer():
    opt, ref = make_sgd(), make_sgd()
    wrapper = OnlyOptimizer(opt)
    scheduler = build_param_scheduler(dict(type="StepLR", step_size=3), wrapper)
    assert scheduler.optimizer is opt
    assert_values(trace(opt, [scheduler], 8), trace(ref, [StepLR(ref, step_size=3)], 8))


def test_wrapper_param_groups_are_scheduled_including_base_settings():
    opt = make_sgd()
    wrapper = WrapperWithBaseSettings(opt)
    scheduler = StepLR(wrapper, step_size=1, gamma=0.5)
    assert scheduler.optimizer is wrapper  # as in mmengine
    for _ in range(2):
        opt.step()
        scheduler.step()
    assert [g["lr"] for g in wrapper.param_groups] == pytest.approx([0.0125, 0.125, 0.0125])
    plateau = ReduceOnPlateauLR(wrapper, min_value=[0.01, 0.02], patience=0)
    assert plateau.min_values == [0.01, 0.02, 0.02]


def test_momentum_form_works_through_a_wrapper_on_adam():
    adam = make_adam()
    scheduler = StepMomentum(WrapperWithBaseSettings(adam), step_size=1, gamma=0.5)
    adam.step()
    scheduler.step()
    assert [g["betas"][0] for g in adam.param_groups] == pytest.approx([0.45, 0.4])


# --------------------------------------------------------------------- warnings and logging


def test_warns_when_scheduler_steps_before_optimizer():
    opt = make_sgd()
    scheduler = StepLR(opt, step_size=3)
    with pytest.warns(UserWarning, match="how-to-adjust-learning-rate"):
        scheduler.step()


def test_no_warning_when_optimizer_steps_first():
    opt = make_sgd()
    schedulers = [StepLR(opt, step_size=3), ConstantLR(opt, factor=0.5)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            opt.step()
            for scheduler in schedulers:
                scheduler.step()
    assert len(opt._optimizer_step_post_hooks) == 1  # one ordering watch per optimizer


def test_a_scheduler_built_after_optimizer_steps_watches_again():
    # mmengine restarts the check with every scheduler built on the optimizer
    opt = make_sgd()
    StepLR(opt, step_size=3)
    opt.step()
    scheduler = ConstantLR(opt, factor=0.5)
    with pytest.warns(UserWarning, match="how-to-adjust-learning-rate"):
        scheduler.step()


def test_verbose_logs_each_value(caplog):
    opt = make_sgd()
    with caplog.at_level(logging.INFO, logger="shardwise.optim.scheduler"):
        ExponentialLR(opt, gamma=0.5, verbose=True)
    assert "Adjusting parameter value of group 1 to 5.0000e-01." in caplog.text


# ---------------------------------------------------------------------------------- bad input


def _groups_of(opt) -> list[dict]:
    return [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]


def test_end_not_after_begin_is_rejected_before_touching_the_optimizer():
    opt = make_sgd()
    before = _groups_of(opt)
    with pytest.raises(ValueError, match=r"end should be larger than begin.*begin=10, end=5"):
        StepLR(opt, step_size=3, begin=10, end=5)
    with pytest.raises(ValueError, match="begin=3, end=3"):
        LinearLR(opt, begin=3, end=3)
    assert _groups_of(opt) == before


def test_unknown_param_name_names_it_and_the_available_keys():
    opt = make_sgd()
    before = _groups_of(opt)
    with pytest.raises(KeyError, match=r"'lrr'.*available.*'lr'.*'momentum'.*'weight_decay'"):
        StepParamScheduler(opt, "lrr", step_size=10)
    assert _groups_of(opt) == before


@pytest.mark.parametrize(
    "cls", [CosineAnnealingLR, CosineAnnealingParamScheduler, CosineRestartParamScheduler]
)
def test_eta_min_with_eta_min_ratio_is_rejected(cls):
    args = ("lr",) if cls.__name__.endswith("ParamScheduler") else ()
    extra = {"periods": [5]} if cls is CosineRestartParamScheduler else {}
    with pytest.raises(ValueError, match=r"eta_min=0\.1 and eta_min_ratio=0\.5"):
        cls(make_sgd(), *args, eta_min=0.1, eta_min_ratio=0.5, **extra)


def test_cosine_restart_needs_one_of_eta_min_and_ratio_and_matching_weights():
    with pytest.raises(ValueError, match="eta_min or eta_min_ratio"):
        CosineRestartLR(make_sgd(), periods=[5])
    with pytest.raises(ValueError, match="same length"):
        CosineRestartLR(make_sgd(), periods=[5, 5], restart_weights=[1], eta_min=0)


@pytest.mark.parametrize("bad", ["invalid_optimizer", torch.nn.Linear(1, 1), OnlyOptimizer(None)])
def test_something_that_is_not_an_optimizer_is_rejected(bad):
    with pytest.raises(TypeError, match="is not an Optimizer"):
        StepLR(bad, step_size=1)


def test_convert_to_iter_based_without_epoch_length_is_rejected():
    with pytest.raises(ValueError, match="epoch_length.*len\\(train_dataloader\\)"):
        build_param_scheduler(dict(type="LinearLR", end=2, convert_to_iter_based=True), make_sgd())
    with pytest.raises(ValueError, match="positive integer"):
        LinearLR.build_iter_from_epoch(make_sgd(), end=2, epoch_length=0)
    with pytest.raises(ValueError, match="by_epoch=True"):
        build_param_scheduler(
            dict(type="LinearLR", end=2, by_epoch=False, convert_to_iter_based=True),
            make_sgd(),
            epoch_length=3,
        )


def test_momentum_scheduler_on_optimizer_without_momentum_is_rejected():
    opt = torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(ValueError, match="Adagrad has neither 'momentum' nor 'betas'"):
        StepMomentum(opt, step_size=1)


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda o: ConstantLR(o, factor=99), "factor should be in"),
        (lambda o: LinearLR(o, start_factor=-0.1), "start_factor should be in"),
        (lambda o: LinearLR(o, end_factor=1.001), "end_factor should be in"),
        (lambda o: StepLR(o, step_size=0), "step_size"),
        (lambda o: StepLR(o, step_size=1, last_step=-2), "last_step"),
        (lambda o: OneCycleParamScheduler(o, "momentum", eta_max=0.1), "OneCycleLR"),
        (lambda o: OneCycleLR(o, eta_max=[0.1, 0.2, 0.3], total_steps=5), "eta_max"),
        (lambda o: OneCycleLR(o, eta_max=0.1, anneal_strategy="exp", total_steps=5), "'cos'"),
        (lambda o: ReduceOnPlateauLR(o, factor=1.0), "Factor should be < 1.0"),
        (lambda o: ReduceOnPlateauLR(o, rule="max"), "'less' or 'greater'"),
        (lambda o: ReduceOnPlateauLR(o, by_epoch=False), "by_epoch=True"),
    ],
)
def test_invalid_schedule_arguments_are_rejected(build, match):
    with pytest.raises(ValueError, match=match):
        build(make_sgd())


def test_resuming_with_last_step_needs_initial_values():
    with pytest.raises(KeyError, match="'initial_lr' is not specified in param_groups\\[0\\]"):
        StepLR(make_sgd(), step_size=3, last_step=10)


def test_one_cycle_refuses_to_step_past_total_steps():
    opt = make_sgd()
    scheduler = OneCycleLR(opt, eta_max=0.1, total_steps=3)
    trace(opt, [scheduler], 3)
    with pytest.raises(ValueError, match="Tried to step 5 times"):
        scheduler.step()
