"""Parameter schedulers: change one hyper-parameter of every param group as training advances.

A scheduler changes ``param_groups[i][param_name]`` (``'lr'``, ``'momentum'``,
``'weight_decay'`` or any other param-group key) on each :meth:`~_ParamScheduler.step`, only
while its step counter lies in ``[begin, end)``. The value it writes is computed from the
group's *current* value (the "chainable" form), so schedulers given as a list compose: a
warm-up for the first steps, then a decay, or two schedulers whose windows overlap and whose
effects multiply. Semantics and names follow mmengine's ``mmengine.optim.scheduler``.

Example::

    >>> import torch
    >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    >>> sched = StepParamScheduler(opt, 'lr', step_size=2, gamma=0.5)
    >>> lrs = []
    >>> for _ in range(5):
    ...     lrs.append(opt.param_groups[0]['lr'])
    ...     opt.step()
    ...     sched.step()
    >>> lrs
    [0.1, 0.1, 0.05, 0.05, 0.025]
"""

from __future__ import annotations

import copy
import logging
import math
import reprlib
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeAlias

from torch.optim import Optimizer

from shardwise.registry import PARAM_SCHEDULERS

__all__ = [
    "INF",
    "_ParamScheduler",
    "ConstantParamScheduler",
    "CosineAnnealingParamScheduler",
    "CosineRestartParamScheduler",
    "ExponentialParamScheduler",
    "LinearParamScheduler",
    "MultiStepParamScheduler",
    "OneCycleParamScheduler",
    "PolyParamScheduler",
    "ReduceOnPlateauParamScheduler",
    "StepParamScheduler",
    "watch_first_step",
]

INF = int(1e9)
"""``end`` of a scheduler that never stops (mmengine's value)."""

logger = logging.getLogger(__name__)

_ORDER_DOC = "https://pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate"


class HasOptimizer(Protocol):
    """An optimizer wrapper (mmengine's ``OptimWrapper`` and its kind): has ``.optimizer``."""

    optimizer: Optimizer


OptimizerType: TypeAlias = "Optimizer | HasOptimizer"


def unwrap_optimizer(optimizer: Any) -> Optimizer:
    """Return the :class:`torch.optim.Optimizer` that ``optimizer`` is or wraps.

    Raises:
        TypeError: ``optimizer`` is neither an Optimizer nor an object whose ``.optimizer`` is one.
    """
    if isinstance(optimizer, Optimizer):
        return optimizer
    inner = getattr(optimizer, "optimizer", None)
    if isinstance(inner, Optimizer):
        return inner
    raise TypeError(
        f"optimizer must be a torch.optim.Optimizer or an optimizer wrapper with an "
        f"`.optimizer` attribute holding one (e.g. an OptimWrapper), got "
        f"{type(optimizer).__name__}: {reprlib.repr(optimizer)} is not an Optimizer. Build the "
        f"optimizer first (e.g. torch.optim.SGD(model.parameters(), lr=0.01)) and pass it."
    )


def _scheduled_groups_owner(optimizer: Any) -> Any:
    """What a scheduler keeps as ``.optimizer``: a wrapper that exposes ``param_groups`` is kept
    (as mmengine does, so that its extra groups, e.g. ``base_param_settings``, are scheduled
    too); otherwise the torch optimizer it wraps."""
    torch_optimizer = unwrap_optimizer(optimizer)
    return optimizer if hasattr(optimizer, "param_groups") else torch_optimizer


def _per_group(name: str, value: Any, optimizer: Any) -> list[Any]:
    """``value`` repeated for every scheduled param group, or a per-group sequence checked.

    A sequence with one entry per torch param group is extended with its last entry for the
    extra groups a wrapper schedules (mmengine's rule for ``base_param_settings``).
    """
    n_all = len(_scheduled_groups_owner(optimizer).param_groups)
    if not isinstance(value, Sequence):
        return [value] * n_all
    values = list(value)
    n_torch = len(unwrap_optimizer(optimizer).param_groups)
    if len(values) == n_torch < n_all:
        values += [values[-1]] * (n_all - n_torch)
    if len(values) != n_all:
        raise ValueError(
            f"expected {n_torch} values for {name} (one per param group), got {len(values)}: "
            f"{list(value)!r}"
        )
    return values


_STEPPED = "_shardwise_stepped"
"""Attribute of a torch optimizer: whether it has stepped since a scheduler was last built on
it (mmengine keeps a step counter on the optimizer for the same check)."""


def _mark_stepped(optimizer: Optimizer, *_: Any) -> None:
    setattr(optimizer, _STEPPED, True)


def watch_first_step(optimizer: Optimizer) -> None:
    """Record on ``optimizer`` whether it steps from now on, so that a scheduler that steps
    first is warned about (every scheduler built on it calls this; so does code that moves a
    scheduler onto a new optimizer). One step hook per optimizer, however many schedulers."""
    if not hasattr(optimizer, _STEPPED):
        optimizer.register_step_post_hook(_mark_stepped)
    setattr(optimizer, _STEPPED, False)


def _scale(value: Any, factor: int) -> Any:
    """``value * factor`` for a number, element-wise for a sequence; ``None`` stays ``None``."""
    if value is None:
        return None
    if isinstance(value, Sequence):
        return [v * factor for v in value]
    return value * factor


class _ParamScheduler:
    """Base class of the parameter schedulers; subclasses implement :meth:`_get_value`.

    Args:
        optimizer: a :class:`torch.optim.Optimizer`, or a wrapper with an ``.optimizer``
            attribute holding one (an ``OptimWrapper``). The groups scheduled are the wrapper's
            ``param_groups`` when it has them (an ``OptimWrapper``'s include
            ``base_param_settings``, as in mmengine), else the torch optimizer's.
        param_name: the param-group key to schedule (``'lr'``, ``'momentum'``, ...).
        begin: first step at which the scheduler acts.
        end: step at which it stops acting (exclusive).
        last_step: index of the last step taken; ``-1`` starts afresh. Any other value resumes
            without a state dict and needs ``initial_{param_name}`` in every param group.
        by_epoch: whether :meth:`step` is called once per epoch (``True``) or per iteration;
            read by the training loop, not by the scheduler.
        verbose: log every value the scheduler sets.

    Construction records ``initial_{param_name}`` in every param group (unless present) and
    takes the first step (step 0), as mmengine does.
    """

    #: whether ``step`` needs validation metrics (a runner hook reads this).
    need_val_args: ClassVar[bool] = False
    #: keyword arguments measured in steps, multiplied by ``epoch_length`` when an epoch-based
    #: config is converted to an iteration-based scheduler.
    _step_count_args: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        self.optimizer = _scheduled_groups_owner(optimizer)
        if end <= begin:
            raise ValueError(
                f"end should be larger than begin, but got begin={begin}, end={end}: a "
                f"scheduler acts on steps [begin, end). Give an end after begin, or leave end out "
                f"to never stop."
            )
        if not isinstance(last_step, int) or last_step < -1:
            raise ValueError(
                f"last_step must be an int >= -1 (-1 means a fresh start), got {last_step!r}"
            )
        self.param_name = param_name
        self.begin = begin
        self.end = end
        self.by_epoch = by_epoch
        self.verbose = verbose
        self.last_step = last_step
        self._prepare_param_groups()
        self.base_values = self._record_initial_values()
        self._global_step = -1
        watch_first_step(unwrap_optimizer(self.optimizer))
        self._first_step()

    # -- construction helpers ------------------------------------------------------------------

    def _prepare_param_groups(self) -> None:
        """Put in the param groups what this scheduler needs before values are recorded."""

    def _record_initial_values(self) -> list[Any]:
        groups = self.optimizer.param_groups
        key, initial = self.param_name, f"initial_{self.param_name}"
        missing = [i for i, group in enumerate(groups) if key not in group]
        if missing:
            available = sorted({k for group in groups for k in group if k != "params"})
            raise KeyError(
                f"param_name {key!r} is not in param_groups{missing} of "
                f"{type(unwrap_optimizer(self.optimizer)).__name__}; keys available: "
                f"{available}. Schedule one of those (momentum on Adam-type optimizers: use a "
                f"*Momentum scheduler, which maps it to betas[0])."
            )
        if self.last_step == -1:
            for group in groups:
                group.setdefault(initial, group[key])
        else:
            for i, group in enumerate(groups):
                if initial not in group:
                    raise KeyError(
                        f"param {initial!r} is not specified in param_groups[{i}] when resuming "
                        f"an optimizer (last_step={self.last_step}); load the optimizer's state "
                        f"dict from the checkpoint first, or use last_step=-1 and "
                        f"load_state_dict() to resume the scheduler."
                    )
        return [group[initial] for group in groups]

    def _first_step(self) -> None:
        """Take step 0 (construction sets the values of the first step, as in mmengine)."""
        self.step()

    # -- public API ------------------------------------------------------------------------------

    @classmethod
    def build_iter_from_epoch(
        cls,
        *args: Any,
        begin: int = 0,
        end: int = INF,
        by_epoch: bool = True,
        epoch_length: int | None = None,
        **kwargs: Any,
    ) -> _ParamScheduler:
        """Build an iteration-based scheduler from an epoch-based config.

        ``begin``, ``end`` (unless :data:`INF`) and the arguments that count steps
        (``step_size``, ``milestones``, ``T_max``, ``periods``, ``total_steps``; give them by
        keyword) are multiplied by ``epoch_length``, the number of iterations in an epoch.
        """
        if not by_epoch:
            raise ValueError(
                f"only an epoch-based config (by_epoch=True) can be converted to iteration-based, "
                f"got by_epoch={by_epoch!r} for {cls.__name__}; drop convert_to_iter_based or "
                f"by_epoch=False"
            )
        if not isinstance(epoch_length, int) or isinstance(epoch_length, bool) or epoch_length <= 0:
            raise ValueError(
                f"`epoch_length` must be a positive integer, but got {epoch_length!r}; converting "
                f"{cls.__name__} to iteration-based needs the number of iterations per epoch "
                f"(len(train_dataloader))"
            )
        for name in cls._step_count_args:
            if name in kwargs:
                kwargs[name] = _scale(kwargs[name], epoch_length)
        begin = int(begin * epoch_length)
        if end != INF:
            end = int(end * epoch_length)
        return cls(*args, begin=begin, end=end, by_epoch=False, **kwargs)

    def step(self) -> None:
        """Advance one step; inside ``[begin, end)`` set the next value in every param group."""
        # an optimizer no scheduler watches (e.g. rebuilt after the scheduler) is not checked
        stepped = getattr(unwrap_optimizer(self.optimizer), _STEPPED, True)
        if self._global_step == 0 and not stepped:
            warnings.warn(
                "Detected call of `scheduler.step()` before `optimizer.step()`: call "
                "`optimizer.step()` first, or the first value of the schedule is skipped. See "
                f"{_ORDER_DOC}",
                UserWarning,
                stacklevel=2,
            )
        self._global_step += 1
        if self.begin <= self._global_step < self.end:
            self.last_step += 1
            values = self._get_value()
            for i, (group, value) in enumerate(zip(self.optimizer.param_groups, values)):
                group[self.param_name] = value
                self.print_value(self.verbose, i, value)
        self._last_value = self._current_values()

    def get_last_value(self) -> list[Any]:
        """The value of ``param_name`` in every param group after the last step."""
        return self._last_value

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's state (a copy): every attribute except the optimizer."""
        return copy.deepcopy({k: v for k, v in self.__dict__.items() if k != "optimizer"})

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore the state returned by :meth:`state_dict` (mmengine's included)."""
        self.__dict__.update(
            copy.deepcopy({k: v for k, v in state_dict.items() if k != "optimizer"})
        )

    def print_value(self, is_verbose: bool, group: int, value: float) -> None:
        """Log the value set in param group ``group`` when ``is_verbose``."""
        if is_verbose:
            logger.info("Adjusting parameter value of group %d to %.4e.", group, value)

    # -- for subclasses ---------------------------------------------------------------------------

    def _current_values(self) -> list[Any]:
        return [group[self.param_name] for group in self.optimizer.param_groups]

    def _get_value(self) -> list[Any]:
        """The values for step ``self.last_step``, one per param group (chainable form)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _get_value()")


def _check_factor(name: str, value: float) -> None:
    if not 0 <= value <= 1.0:
        raise ValueError(f"{name} should be in [0, 1] (a multiplicative factor), got {value!r}")


def _check_eta_min(eta_min: float | None, eta_min_ratio: float | None, cls: str) -> None:
    if eta_min is not None and eta_min_ratio is not None:
        raise ValueError(
            f"{cls} got both eta_min={eta_min!r} and eta_min_ratio={eta_min_ratio!r}; give one: "
            f"eta_min is an absolute minimum, eta_min_ratio a fraction of the initial value"
        )


@PARAM_SCHEDULERS.register_module()
class StepParamScheduler(_ParamScheduler):
    """Multiply the value by ``gamma`` every ``step_size`` steps."""

    _step_count_args = ("step_size",)

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        step_size: int,
        gamma: float = 0.1,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        if step_size <= 0:
            raise ValueError(f"step_size must be a positive number of steps, got {step_size!r}")
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        values = self._current_values()
        if self.last_step == 0 or self.last_step % self.step_size != 0:
            return values
        return [v * self.gamma for v in values]


@PARAM_SCHEDULERS.register_module()
class MultiStepParamScheduler(_ParamScheduler):
    """Multiply the value by ``gamma`` at each of the ``milestones`` (steps, increasing)."""

    _step_count_args = ("milestones",)

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        milestones: Sequence[int],
        gamma: float = 0.1,
        last_step: int = -1,
        begin: int = 0,
        end: int = INF,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        # A plain dict (milestone -> count), so the state loads with torch.load(weights_only=True).
        self.milestones = dict(Counter(milestones))
        self.gamma = gamma
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        values = self._current_values()
        count = self.milestones.get(self.last_step, 0)
        if count == 0:
            return values
        return [v * self.gamma**count for v in values]


@PARAM_SCHEDULERS.register_module()
class ConstantParamScheduler(_ParamScheduler):
    """Multiply the value by ``factor`` from ``begin`` until ``end - 1``, then restore it."""

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        factor: float = 1.0 / 3,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        _check_factor("factor", factor)
        self.factor = factor
        self.total_iters = end - begin - 1
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        values = self._current_values()
        if self.last_step == 0:
            return [v * self.factor for v in values]
        if self.last_step == self.total_iters:
            return [v / self.factor for v in values]
        return values


@PARAM_SCHEDULERS.register_module()
class ExponentialParamScheduler(_ParamScheduler):
    """Multiply the value by ``gamma`` every step."""

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        gamma: float,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        self.gamma = gamma
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        values = self._current_values()
        if self.last_step == 0:
            return values
        return [v * self.gamma for v in values]


@PARAM_SCHEDULERS.register_module()
class CosineAnnealingParamScheduler(_ParamScheduler):
    r"""Anneal the value from its initial value to ``eta_min`` along a half cosine.

    Alone, :math:`\eta_t = \eta_{min} + \frac{1}{2}(\eta_{max} - \eta_{min})
    (1 + \cos(\pi t / T_{max}))`, with :math:`\eta_{max}` the value at ``begin``.

    Args:
        T_max: steps of the half period; defaults to ``end - begin``.
        eta_min: the minimum value (default 0 when ``eta_min_ratio`` is not given).
        eta_min_ratio: the minimum as a fraction of the initial value; exclusive with
            ``eta_min``.
    """

    _step_count_args = ("T_max",)

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        T_max: int | None = None,
        eta_min: float | None = None,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
        eta_min_ratio: float | None = None,
    ) -> None:
        _check_eta_min(eta_min, eta_min_ratio, type(self).__name__)
        if eta_min is None and eta_min_ratio is None:
            eta_min = 0.0
        self.T_max = T_max or (end - begin)
        self.eta_min = eta_min
        self.eta_min_ratio = eta_min_ratio
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _eta_min(self, base_value: float) -> float:
        if self.eta_min_ratio is None:
            return self.eta_min  # type: ignore[return-value]
        return base_value * self.eta_min_ratio

    def _get_value(self) -> list[Any]:
        values = self._current_values()
        t, t_max = self.last_step, self.T_max
        if t == 0:
            return values
        if (t - 1 - t_max) % (2 * t_max) == 0:
            return [
                v + (base - self._eta_min(base)) * (1 - math.cos(math.pi / t_max)) / 2
                for v, base in zip(values, self.base_values)
            ]
        ratio = (1 + math.cos(math.pi * t / t_max)) / (1 + math.cos(math.pi * (t - 1) / t_max))
        return [
            ratio * (v - self._eta_min(base)) + self._eta_min(base)
            for v, base in zip(values, self.base_values)
        ]


@PARAM_SCHEDULERS.register_module()
class LinearParamScheduler(_ParamScheduler):
    """Scale the value by a factor going linearly from ``start_factor`` (at ``begin``) to
    ``end_factor`` (at ``end - 1``); the usual warm-up.

    With ``start_factor=0`` the value is 0 at ``begin``; the next step has no value to scale,
    so it sets ``initial value * factor`` (mmengine accepts 0 and then divides by zero).
    """

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        _check_factor("start_factor", start_factor)
        _check_factor("end_factor", end_factor)
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = end - begin - 1
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        values = self._current_values()
        if self.last_step == 0:
            return [v * self.start_factor for v in values]
        delta = self.end_factor - self.start_factor
        # total_iters * (the factor of the previous step): 0 only after start_factor=0
        previous = self.total_iters * self.start_factor + (self.last_step - 1) * delta
        if previous == 0:
            factor = self.start_factor + delta * self.last_step / self.total_iters
            return [base * factor for base in self.base_values]
        return [v * (1.0 + delta / previous) for v in values]


@PARAM_SCHEDULERS.register_module()
class PolyParamScheduler(_ParamScheduler):
    """Decay the value polynomially (``power``) to ``eta_min`` at ``end - 1``."""

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        eta_min: float = 0,
        power: float = 1.0,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        self.eta_min = eta_min
        self.power = power
        self.total_iters = end - begin - 1
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _get_value(self) -> list[Any]:
        values = self._current_values()
        if self.last_step == 0:
            return values
        scale = (1 - 1 / (self.total_iters - self.last_step + 1)) ** self.power
        return [(v - self.eta_min) * scale + self.eta_min for v in values]


@PARAM_SCHEDULERS.register_module()
class OneCycleParamScheduler(_ParamScheduler):
    """The 1cycle policy: rise from ``eta_max / div_factor`` to ``eta_max``, then anneal to
    ``eta_max / div_factor / final_div_factor`` (not chainable; learning rate only).

    Args:
        eta_max: the peak value, or one per param group.
        total_steps: steps in the cycle; defaults to ``end - begin``.
        pct_start: fraction of the cycle spent rising.
        anneal_strategy: ``'cos'`` or ``'linear'``.
        three_phase: fall back to the initial value symmetrically before annihilating, as in
            the original paper, instead of annealing straight to the minimum.
    """

    _step_count_args = ("total_steps",)

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        eta_max: float | Sequence[float] = 0,
        total_steps: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        if param_name != "lr":
            raise ValueError(
                f"OneCycle only works for learning rate updating, but got param_name="
                f"{param_name!r}; use OneCycleLR (param_name='lr')"
            )
        if total_steps is None:
            total_steps = end - begin
        if not isinstance(total_steps, int) or total_steps <= 0:
            raise ValueError(f"Expected positive integer total_steps, but got {total_steps!r}")
        if not 0 <= pct_start <= 1:
            raise ValueError(f"Expected float between 0 and 1 pct_start, but got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(
                f"anneal_strategy must be one of 'cos' or 'linear', instead got {anneal_strategy!r}"
            )
        self._eta_maxes = _per_group("eta_max", eta_max, optimizer)
        self.eta_max = eta_max
        self.total_steps = total_steps
        self.pct_start = pct_start
        self.anneal_strategy = anneal_strategy
        self.div_factor = div_factor
        self.final_div_factor = final_div_factor
        self.three_phase = three_phase
        rise_end = float(pct_start * total_steps) - 1
        if three_phase:
            phases = [
                (rise_end, "initial", "max"),
                (float(2 * pct_start * total_steps) - 2, "max", "initial"),
                (total_steps - 1, "initial", "min"),
            ]
        else:
            phases = [(rise_end, "initial", "max"), (total_steps - 1, "max", "min")]
        # mmengine's layout (its state dicts load here): the phase's last step and the group
        # keys holding the values it starts from and ends at
        self._schedule_phases = [
            {
                "end_step": end_step,
                f"start_{param_name}": f"{start}_{param_name}",
                f"end_{param_name}": f"{stop}_{param_name}",
            }
            for end_step, start, stop in phases
        ]
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _prepare_param_groups(self) -> None:
        super()._prepare_param_groups()
        if self.last_step != -1:
            return
        name = self.param_name
        for group, peak in zip(self.optimizer.param_groups, self._eta_maxes):
            group[f"initial_{name}"] = peak / self.div_factor
            group[f"max_{name}"] = peak
            group[f"min_{name}"] = group[f"initial_{name}"] / self.final_div_factor

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.anneal_strategy == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def _get_value(self) -> list[Any]:
        step = self.last_step
        if step > self.total_steps:
            raise ValueError(
                f"Tried to step {step + 1} times. The specified number of total steps is "
                f"{self.total_steps}; raise total_steps (or end) to cover the whole run"
            )
        values = []
        for group in self.optimizer.param_groups:
            phase_start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                phase_end = phase["end_step"]
                if step <= phase_end or i == len(self._schedule_phases) - 1:
                    pct = (step - phase_start) / (phase_end - phase_start)
                    start = group[phase[f"start_{self.param_name}"]]
                    end = group[phase[f"end_{self.param_name}"]]
                    values.append(self._anneal(start, end, pct))
                    break
                phase_start = phase_end
        return values


@PARAM_SCHEDULERS.register_module()
class CosineRestartParamScheduler(_ParamScheduler):
    """Cosine annealing with restarts: anneal over each of ``periods`` in turn, restarting
    each period from the initial value times its ``restart_weights`` entry.

    Give exactly one of ``eta_min`` (absolute minimum) and ``eta_min_ratio`` (a fraction of
    the initial value).
    """

    _step_count_args = ("periods",)

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        periods: Sequence[int],
        restart_weights: Sequence[float] = (1,),
        eta_min: float | None = None,
        eta_min_ratio: float | None = None,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        cls = type(self).__name__
        _check_eta_min(eta_min, eta_min_ratio, cls)
        if eta_min is None and eta_min_ratio is None:
            raise ValueError(f"{cls} needs eta_min or eta_min_ratio (one of them), got neither")
        if len(periods) != len(restart_weights):
            raise ValueError(
                f"periods and restart_weights should have the same length, got periods="
                f"{list(periods)!r} and restart_weights={list(restart_weights)!r}"
            )
        self.periods = list(periods)
        self.restart_weights = list(restart_weights)
        self.eta_min = eta_min
        self.eta_min_ratio = eta_min_ratio
        self.cumulative_periods = [sum(self.periods[: i + 1]) for i in range(len(self.periods))]
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    @staticmethod
    def get_position_from_periods(iteration: int, cumulative_periods: list[int]) -> int | None:
        """Index of the first cumulative period ending after ``iteration``; ``None`` if none."""
        for i, period in enumerate(cumulative_periods):
            if iteration < period:
                return i
        return None

    def _get_value(self) -> list[Any]:
        values = self._current_values()
        idx = self.get_position_from_periods(self.last_step, self.cumulative_periods)
        if idx is None:  # past the last period: leave the value alone
            return values
        period = self.periods[idx]
        step = self.last_step - (0 if idx == 0 else self.cumulative_periods[idx - 1])
        new = []
        for v, base in zip(values, self.base_values):
            eta_min = self.eta_min if self.eta_min_ratio is None else base * self.eta_min_ratio
            if step == 0:
                new.append(base * self.restart_weights[idx])
            else:
                ratio = (1 + math.cos(math.pi * step / period)) / (
                    1 + math.cos(math.pi * (step - 1) / period)
                )
                new.append(ratio * (v - eta_min) + eta_min)
        return new


@PARAM_SCHEDULERS.register_module()
class ReduceOnPlateauParamScheduler(_ParamScheduler):
    """Multiply the value by ``factor`` when the ``monitor`` metric stops improving.

    ``step()`` (no argument) counts a training epoch; ``step(metrics)`` (a dict of validation
    results) judges ``metrics[monitor]``. After more than ``patience`` judged steps without an
    improvement (by ``threshold``, ``threshold_rule`` ``'rel'``/``'abs'``, ``rule``
    ``'less'``/``'greater'``), the value is reduced, never below ``min_value``, then nothing
    is counted for ``cooldown`` steps. Epoch-based only.
    """

    need_val_args = True

    def __init__(
        self,
        optimizer: OptimizerType,
        param_name: str,
        monitor: str = "loss",
        rule: str = "less",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_rule: str = "rel",
        cooldown: int = 0,
        min_value: float | Sequence[float] = 0.0,
        eps: float = 1e-8,
        begin: int = 0,
        end: int = INF,
        last_step: int = -1,
        by_epoch: bool = True,
        verbose: bool = False,
    ) -> None:
        cls = type(self).__name__
        if not by_epoch:
            raise ValueError(f"{cls} only supports by_epoch=True, got by_epoch={by_epoch!r}")
        if factor >= 1.0:
            raise ValueError(
                f"Factor should be < 1.0 (the value is multiplied by it), got {factor}"
            )
        if threshold < 0:
            raise ValueError(f"threshold {threshold} should be >= 0.")
        if rule not in ("less", "greater"):
            raise ValueError(f"rule must be 'less' or 'greater', got {rule!r}")
        if threshold_rule not in ("rel", "abs"):
            raise ValueError(f"threshold_rule must be 'rel' or 'abs', got {threshold_rule!r}")
        self.min_values = _per_group("min_value", min_value, optimizer)
        self.monitor = monitor
        self.rule = rule
        self.factor = factor
        self.patience = patience
        self.threshold = threshold
        self.threshold_rule = threshold_rule
        self.cooldown = cooldown
        self.eps = eps
        self.rule_worse = math.inf if rule == "less" else -math.inf
        self.best = self.rule_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0
        super().__init__(optimizer, param_name, begin, end, last_step, by_epoch, verbose)

    def _first_step(self) -> None:
        # No step at construction: the first step comes with the first validation.
        self._global_step = 0
        self._last_value = self._current_values()

    def step(self, metrics: Mapping[str, Any] | None = None) -> None:  # type: ignore[override]
        """Count a training epoch (``metrics=None``), or judge ``metrics[monitor]``."""
        if metrics is None:
            self._global_step += 1
            return
        if not isinstance(metrics, Mapping):
            raise TypeError(f"metrics type should be dict, but got type {type(metrics).__name__}")
        if self.begin <= self._global_step < self.end:
            if self.monitor not in metrics:
                raise KeyError(
                    f"Expected key {self.monitor!r} (monitor) in metrics, got keys "
                    f"{list(metrics)}; set monitor= to one of them"
                )
            self.last_step += 1
            metric = float(metrics[self.monitor])
            if self._is_better(metric, self.best):
                self.best = metric
                self.num_bad_epochs = 0
            else:
                self.num_bad_epochs += 1
            if self.cooldown_counter > 0:
                self.cooldown_counter -= 1
                self.num_bad_epochs = 0  # bad epochs in cooldown do not count
            if self.num_bad_epochs > self.patience:
                groups = self.optimizer.param_groups
                for i, (group, value) in enumerate(zip(groups, self._get_value())):
                    if group[self.param_name] - value > self.eps:
                        group[self.param_name] = value
                        self.print_value(self.verbose, i, value)
                self.cooldown_counter = self.cooldown
                self.num_bad_epochs = 0
        self._last_value = self._current_values()

    def _get_value(self) -> list[Any]:
        return [
            max(float(v) * self.factor, low)
            for v, low in zip(self._current_values(), self.min_values)
        ]

    def _is_better(self, a: float, best: float) -> bool:
        if self.rule == "less":
            if self.threshold_rule == "rel":
                return a < best * (1.0 - self.threshold)
            return a < best - self.threshold
        if self.threshold_rule == "rel":
            return a > best * (1.0 + self.threshold)
        return a > best + self.threshold
