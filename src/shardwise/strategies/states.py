"""A strategy's state objects (:mod:`shardwise.checkpoint.states`): the model, the optimizers
(one container for several, as torchtitan's ``OptimizersContainer``), the schedulers, and what
the strategy records about itself in a checkpoint's ``meta``.

Each takes and puts back its state as the strategy says: the ``StateDictOptions`` it is taken
with (full tensors on the CPU, or DTensor shards) and loaded with, and what is done to a state
dict once taken (FSDP's offload of full tensors to the CPU). The mechanics are
:mod:`.state_dicts`'s; whether a saved entry fits is :mod:`.matching`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.tensor import DTensor

from shardwise.checkpoint.checkpointer import DEFAULT_REVISE_KEYS
from shardwise.optim import OptimWrapper
from shardwise.optim.parts import SINGLE
from shardwise.tree import map_tensors

from .matching import (
    model_mismatches,
    optimizer_mismatches,
    optimizer_states_by_name,
    regroup_scheduler_states,
    revise_state_dict_keys,
    scheduler_mismatches,
    unwrap_model,
)
from .state_dicts import (
    fitting_model_state,
    get_optim_state,
    load_model_state,
    load_optim_states,
    load_scheduler_states,
    map_schedulers,
    model_state,
    saved_layout,
)

__all__ = ["ModelState", "OptimizersState", "RunInfo", "SchedulersState"]

_Options = Callable[[], StateDictOptions]
_LoadOptions = Callable[[Any], StateDictOptions]


def _same(state: Any) -> Any:
    return state


#: How a local state (:meth:`ModelState.local_state_dict`) is taken: this rank's shards.
_LOCAL = StateDictOptions(full_state_dict=False, cpu_offload=False)


def _to_local(state: Any) -> Any:
    """``state`` with every DTensor replaced by this rank's shard (a plain tensor)."""
    return map_tensors(lambda t: t.to_local() if isinstance(t, DTensor) else t, state)


def _like(local: Any, ref: Any) -> Any:
    """``local`` (a peer rank's shard) as a DTensor laid out as ``ref`` when ``ref`` is one
    whose shard has ``local``'s shape; else ``local`` itself."""
    if (
        isinstance(ref, DTensor)
        and isinstance(local, torch.Tensor)
        and local.shape == ref.to_local().shape
    ):
        return DTensor.from_local(
            local.to(ref.device),
            ref.device_mesh,
            ref.placements,
            run_check=False,
            shape=ref.shape,
            stride=ref.stride(),
        )
    return local


def _check_local_keys(what: str, got: Any, here: Any) -> None:
    if set(got) != set(here):
        raise KeyError(
            f"the peer's local {what} state has keys {sorted(got)[:8]}..., this rank's has "
            f"{sorted(here)[:8]}...; both replicas must build the same model and optimizers"
        )


class ModelState:
    """The model's weights, keyed as the plain module's keys.

    Args:
        model: the prepared (wrapped, maybe sharded) model.
        options: the options its state is taken with.
        load_options: the options a given state is loaded with.
        logger: where skipped keys are reported.
        post: applied to the state once taken (e.g. an offload to the CPU).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        options: _Options,
        load_options: _LoadOptions,
        logger: Any,
        post: Callable[[Any], Any] = _same,
    ) -> None:
        self.model = model
        self._options, self._load_options, self._logger, self._post = (
            options,
            load_options,
            logger,
            post,
        )

    def state_dict(self) -> dict[str, Any]:
        return self._post(model_state(self.model, self._options()))

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = False) -> None:
        """Load a model state dict (keys as the plain module's: see
        :func:`~.matching.revise_state_dict_keys`). With ``strict`` any missing or unexpected
        key is an error naming them, raised before anything is loaded; otherwise they, and
        tensors whose shape differs from the model's, are skipped with a warning."""
        usable = fitting_model_state(state_dict, unwrap_model(self.model), strict, (), self._logger)
        load_model_state(self.model, usable, self._load_options(usable))

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's shards of the weights (plain tensors; no collective), for a peer
        rank of the same mesh (:meth:`load_local_state_dict`)."""
        return _to_local(model_state(self.model, _LOCAL))

    def load_local_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a peer rank's :meth:`local_state_dict` into this rank's shards (no
        collective; the same mesh and placements on both sides)."""
        here = model_state(self.model, _LOCAL)
        _check_local_keys("model", state_dict, here)
        load_model_state(self.model, {k: _like(v, here[k]) for k, v in state_dict.items()}, _LOCAL)

    def fit_state_dict(self, saved: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The saved keys revised (a ``module.`` prefix dropped), and what keeps them from
        resuming this model (missing, unexpected, differently shaped)."""
        revised = revise_state_dict_keys(saved, DEFAULT_REVISE_KEYS)
        return revised, model_mismatches(revised, unwrap_model(self.model))

    def register_pre_change_hook(self, fn: Callable[[], None]) -> None:
        """A forward may update persistent buffers (BatchNorm's statistics): ``fn`` first."""
        if _has_persistent_buffers(self.model):
            self.model.register_forward_pre_hook(lambda *_: fn())


class OptimizersState:
    """Every optimizer's state keyed by parameter name, with its wrapper's own state (a loss
    scaler); the state of a single optimizer is the dict itself, several are keyed by name.

    Args:
        model: the prepared model (parameter names).
        wrappers: the optimizer wrappers by name (``''`` for a single one).
        options, load_options, post: as :class:`ModelState`'s.
    """

    def __init__(
        self,
        model: nn.Module,
        wrappers: Callable[[], Mapping[str, OptimWrapper]],
        *,
        options: _Options,
        load_options: _LoadOptions,
        post: Callable[[Any], Any] = _same,
    ) -> None:
        self.model = model
        self._wrappers, self._options, self._load_options, self._post = (
            wrappers,
            options,
            load_options,
            post,
        )
        #: How the last fitted checkpoint's parameter groups were regrouped, by optimizer name
        #: (for each group here, the saved group it came from); the schedulers follow it.
        self.group_mappings: dict[str, list[int]] = {}

    @property
    def wrappers(self) -> Mapping[str, OptimWrapper]:
        return self._wrappers()

    def state_dict(self) -> dict[str, Any]:
        options = self._options()
        states = {n: get_optim_state(self.model, w, options) for n, w in self.wrappers.items()}
        return self._post(states[SINGLE] if SINGLE in states else states)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        load_optim_states(self.model, self.wrappers, state_dict, self._load_options)

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's shards of every optimizer's state (plain tensors; no collective)."""
        states = {n: get_optim_state(self.model, w, _LOCAL) for n, w in self.wrappers.items()}
        return _to_local(states[SINGLE] if SINGLE in states else states)

    def load_local_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a peer rank's :meth:`local_state_dict` (no collective): each per-parameter
        tensor shaped as the parameter's shard becomes a DTensor laid out as it."""
        params = model_state(self.model, _LOCAL)

        def rebuilt(state: Mapping[str, Any]) -> dict[str, Any]:
            per_param = {
                name: {k: _like(v, params.get(name)) for k, v in entry.items()}
                for name, entry in state["state"].items()
            }
            return {**state, "state": per_param}

        if SINGLE in self.wrappers:
            state = rebuilt(state_dict)
        else:
            _check_local_keys("optimizers", state_dict, self.wrappers)
            state = {name: rebuilt(s) for name, s in state_dict.items()}
        load_optim_states(self.model, self.wrappers, state, lambda _: _LOCAL)

    def fit_state_dict(self, saved: Mapping[str, Any]) -> tuple[Any, list[str]]:
        """The saved state keyed by parameter name where the checkpoint numbers them
        (mmengine's), and what keeps it from resuming these optimizers."""
        optimizers = {key: wrapper.optimizer for key, wrapper in self.wrappers.items()}
        model = unwrap_model(self.model)
        self.group_mappings = {}
        by_name = optimizer_states_by_name(saved, optimizers, model, self.group_mappings)
        return by_name.get(SINGLE, by_name), optimizer_mismatches(by_name, optimizers, model)

    def register_pre_change_hook(self, fn: Callable[[], None]) -> None:
        """Every optimizer step changes the state in place: ``fn`` first."""
        for wrapper in self.wrappers.values():
            wrapper.optimizer.register_step_pre_hook(lambda *_: fn())


class SchedulersState:
    """Each parameter scheduler's state, in order (a dict of lists by optimizer name for
    several optimizers). ``group_mappings()``: how the optimizers' saved parameter groups were
    regrouped when they were fitted (:attr:`OptimizersState.group_mappings`); each scheduler's
    per-group values follow."""

    def __init__(
        self,
        schedulers: Callable[[], Any],
        group_mappings: Callable[[], Mapping[str, list[int]]] = dict,
    ) -> None:
        self._schedulers, self._group_mappings = schedulers, group_mappings

    def state_dict(self) -> Any:
        return map_schedulers(lambda s: s.state_dict(), self._schedulers())

    def load_state_dict(self, state_dict: Any) -> None:
        load_scheduler_states(self._schedulers(), state_dict)

    def fit_state_dict(self, saved: Any) -> tuple[Any, list[str]]:
        for name, mapping in self._group_mappings().items():
            if name == SINGLE and isinstance(saved, list):
                saved = regroup_scheduler_states(saved, mapping)
            elif isinstance(saved, Mapping) and isinstance(saved.get(name), list):
                saved = {**saved, name: regroup_scheduler_states(saved[name], mapping)}
        return saved, scheduler_mismatches(self._schedulers(), saved)


class RunInfo:
    """What a checkpoint's ``meta`` records about the run that saved it (nothing is loaded
    back): its timestamp, experiment name, world size, strategy, and its mesh and placements
    (:func:`~.state_dicts.saved_layout`)."""

    def __init__(self, strategy: Any) -> None:
        self._strategy = strategy

    def state_dict(self) -> dict[str, Any]:
        s = self._strategy
        return dict(
            timestamp=s.timestamp,
            experiment_name=s.experiment_name,
            world_size=s.world_size,
            strategy=type(s).__name__,
            **saved_layout(s),
        )

    def load_state_dict(self, state_dict: Any) -> None:
        """Nothing to restore: the saving run's facts stay in ``meta``."""


def _has_persistent_buffers(model: nn.Module) -> bool:
    """Whether the model's state dict holds buffers (which forward may update)."""
    return any(
        buffer is not None and name not in module._non_persistent_buffers_set
        for module in model.modules()
        for name, buffer in module._buffers.items()
    )
