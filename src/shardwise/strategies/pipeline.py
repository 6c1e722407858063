"""Pipeline parallelism: a model split into stages by module names, run by torch's schedules.

``FSDPStrategy(parallelism=dict(pp=2, ...), pipeline=dict(...))`` splits the model into
``pp × stages_per_rank`` stages along the mesh's outermost dimension ``pp``; each stage is then
parallelised as a whole model is (TP → AC → compile → ``fully_shard`` on the stage's sub-mesh),
except that with pp alone (a data-parallel degree of 1, no tensor parallelism) a stage stays a
plain module: plain parameters and optimizer, no FSDP hooks (``model_wrapper``'s mixed precision,
CPU offload or buffer dtype keep ``fully_shard`` over the mesh of size 1).
The machinery is torchtitan's: a stage is a deep copy of the model with the modules of other
stages deleted, so its parameters keep the unsplit model's names (a checkpoint written by the
stages is the unsplit model's), and torch's ``torch.distributed.pipelining`` runs the schedule.

``pipeline=dict(...)`` (every key optional):

- ``split_points``: module names where a new stage starts, in model order, e.g.
  ``['blocks.2', 'blocks.4']`` (three stages). Each names a layer: a child of a
  ``ModuleList``/``ModuleDict``. Without them: ``split_fn(model, n_stages) -> split points``,
  else the model's own ``pipeline_split_points`` attribute, else the layers of the model's
  longest ``ModuleList``/``ModuleDict`` split evenly.
- ``schedule``: a name of torch's (:data:`SCHEDULE_NAMES`, case-insensitive), default
  ``'1F1B'``: ``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``LoopedBFS``, and the zero-bubble
  ones (``InterleavedZeroBubble``, ``ZBVZeroBubble``, ``DualPipeV``) where the stages stay plain
  modules (pp alone): on ``fully_shard``-ed stages their split backward gives wrong gradients
  (torch 2.13), so there they are refused (:func:`check_split_backward`).
- ``n_microbatches``: how many microbatches a batch is cut into (default: the number of
  stages); it must divide the batch.
- ``stages_per_rank``: 1 for ``GPipe``/``1F1B``, default 2 for the multi-stage schedules
  (``Interleaved1F1B``, ``LoopedBFS``, ``InterleavedZeroBubble``; exactly 2 for the V-shaped
  ``ZBVZeroBubble``/``DualPipeV``).
- ``loss_fn``: ``loss_fn(outputs, targets) -> loss`` computed on the last stage (a callable or
  a name in ``FUNCTIONS``); default: the model's ``pipeline_loss(outputs, targets)``.

What the split model must do: its ``forward`` runs the modules it still has and skips those set
to ``None`` (``h = self.tok(idx) if self.tok is not None else idx``), iterating its layer
containers (``for block in self.blocks.values()`` or ``for block in self.blocks``; layers of
other stages are deleted, the remaining ones keep their names). The first stage gets the
model's inputs, every later one the previous stage's output; the last stage returns what
``loss_fn`` takes. Parameters of the root (and of modules on the way to the layer containers)
stay with the first stage; their buffers stay with every stage.

Example::

    >>> strategy = FSDPStrategy(parallelism=dict(pp=2, dp_shard=-1),
    ...                         pipeline=dict(split_points=['blocks.4'], schedule='GPipe',
    ...                                       n_microbatches=4, loss_fn=cross_entropy))
    >>> model, optim_wrapper = strategy.prepare(model, optim_wrapper=...)
    >>> log_vars = strategy.pipeline.train_step((inputs, targets), optim_wrapper)
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.nn as nn

from shardwise.registry import FUNCTIONS

__all__ = [
    "SCHEDULE_NAMES",
    "Pipeline",
    "PipelineConfig",
    "PipelinePlan",
    "build_schedule",
    "check_microbatches",
    "parse_pipeline",
    "plan_pipeline",
    "adopt_stage_parameters",
    "split_model",
    "stage_ids_of_rank",
]

#: The schedules of ``torch.distributed.pipelining`` by name, single-stage ones first.
SCHEDULE_NAMES = (
    "GPipe",
    "1F1B",
    "Interleaved1F1B",
    "LoopedBFS",
    "InterleavedZeroBubble",
    "ZBVZeroBubble",
    "DualPipeV",
)
_SINGLE = frozenset({"GPipe", "1F1B"})
_V_SHAPED = frozenset({"ZBVZeroBubble", "DualPipeV"})
#: Schedules that split the backward into input and weight passes: on stages sharded with
#: ``fully_shard`` (torch 2.13) their gradients differ from one device's (some are never
#: reduced), while GPipe, 1F1B, Interleaved1F1B and LoopedBFS match to 1e-14.
_SPLIT_BACKWARD = frozenset({"InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"})
_KEYS = ("split_points", "split_fn", "schedule", "n_microbatches", "stages_per_rank", "loss_fn")
_EXAMPLE = "pipeline=dict(split_points=['blocks.2'], schedule='1F1B', n_microbatches=4)"
_CONTAINERS = (nn.ModuleList, nn.ModuleDict)


# ---------------------------------------------------------------------------- configuration
@dataclass(frozen=True)
class PipelineConfig:
    """``pipeline=dict(...)`` checked (see the module's docstring)."""

    split_points: tuple[str, ...] | None = None
    split_fn: Callable[[nn.Module, int], Sequence[str]] | None = None
    schedule: str = "1F1B"
    n_microbatches: int | None = None
    stages_per_rank: int = 1
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None

    @property
    def v_shaped(self) -> bool:
        return self.schedule in _V_SHAPED


def _schedule_name(value: Any) -> str:
    names = {name.lower(): name for name in SCHEDULE_NAMES}
    if not isinstance(value, str) or value.lower() not in names:
        raise ValueError(
            f"pipeline schedule {value!r} does not exist; the schedules are "
            f"{list(SCHEDULE_NAMES)} (e.g. {_EXAMPLE})"
        )
    return names[value.lower()]


def check_split_backward(config: PipelineConfig, sharded_because: Sequence[str]) -> None:
    """Refuse a zero-bubble schedule (split backward) when the stages are ``fully_shard``-ed
    (``sharded_because``: why; empty when they stay plain modules)."""
    if config.schedule in _SPLIT_BACKWARD and sharded_because:
        supported = [n for n in SCHEDULE_NAMES if n not in _SPLIT_BACKWARD]
        raise ValueError(
            f"pipeline schedule {config.schedule!r} splits the backward into input and weight "
            "passes, whose gradients on fully_shard-ed stages differ from one device's (torch "
            f"{torch.__version__.split('+')[0]}); the stages are sharded because of "
            f"{', '.join(sharded_because)}: use one of {supported}, or run the zero-bubble "
            "schedules with pp alone (no data or tensor parallelism, no FSDP-only settings)"
        )


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"pipeline {name} must be a positive int, got {value!r}; e.g. {_EXAMPLE}")
    return value


def parse_pipeline(value: Any) -> PipelineConfig:
    """Check ``pipeline=dict(...)`` (``None``: the defaults); raises one line naming the
    bad value and what is accepted."""
    if value is None:
        return PipelineConfig()
    if isinstance(value, PipelineConfig):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(
            f"pipeline must be a dict, got {type(value).__name__}: {value!r}; e.g. {_EXAMPLE}"
        )
    unknown = sorted(set(value) - set(_KEYS))
    if unknown:
        raise ValueError(f"pipeline has unknown keys {unknown}; accepted: {list(_KEYS)}")
    schedule = _schedule_name(value.get("schedule", "1F1B"))
    points = value.get("split_points")
    if points is not None:
        if isinstance(points, str) or not all(isinstance(p, str) for p in points):
            raise TypeError(
                f"pipeline split_points must be a list of module names, got {points!r}; "
                f"e.g. {_EXAMPLE}"
            )
        points = tuple(points)
    split_fn = value.get("split_fn")
    if split_fn is not None and points is not None:
        raise ValueError("pipeline gives both split_points and split_fn; give one of them")
    if split_fn is not None and not callable(split_fn):
        raise TypeError(
            f"pipeline split_fn must be a callable split_fn(model, n_stages) -> split points, "
            f"got {split_fn!r}"
        )
    n_microbatches = value.get("n_microbatches")
    if n_microbatches is not None:
        _positive("n_microbatches", n_microbatches)
    default_stages = 1 if schedule in _SINGLE else 2
    stages_per_rank = _positive("stages_per_rank", value.get("stages_per_rank", default_stages))
    if schedule in _SINGLE and stages_per_rank != 1:
        raise ValueError(
            f"pipeline schedule {schedule!r} runs one stage per rank, but stages_per_rank="
            f"{stages_per_rank}; use 'Interleaved1F1B' for several stages per rank"
        )
    if schedule in _V_SHAPED and stages_per_rank != 2:
        raise ValueError(
            f"pipeline schedule {schedule!r} runs exactly 2 stages per rank (a V), but "
            f"stages_per_rank={stages_per_rank}"
        )
    loss_fn = value.get("loss_fn")
    if isinstance(loss_fn, str):
        found = FUNCTIONS.get(loss_fn)
        if found is None:
            raise ValueError(
                f"pipeline loss_fn={loss_fn!r} is not a function registered in FUNCTIONS; "
                "give a callable loss_fn(outputs, targets) or register it"
            )
        loss_fn = found
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"pipeline loss_fn must be callable(outputs, targets), got {loss_fn!r}")
    return PipelineConfig(points, split_fn, schedule, n_microbatches, stages_per_rank, loss_fn)


# ---------------------------------------------------------------------------- the split
@dataclass(frozen=True)
class PipelinePlan:
    """A checked split: the modules of each stage (``units[s]``, unsplit names), the
    schedule's settings and which stages run on which pipeline rank."""

    config: PipelineConfig
    units: tuple[tuple[str, ...], ...]
    pp: int
    n_microbatches: int

    @property
    def n_stages(self) -> int:
        return len(self.units)

    def stage_ids(self, pp_rank: int) -> tuple[int, ...]:
        return stage_ids_of_rank(
            pp_rank, self.pp, self.config.stages_per_rank, self.config.v_shaped
        )

    def rank_of_stage(self, stage: int) -> int:
        return next(r for r in range(self.pp) if stage in self.stage_ids(r))


def stage_ids_of_rank(
    pp_rank: int, pp: int, stages_per_rank: int, v_shaped: bool
) -> tuple[int, ...]:
    """The stages pipeline rank ``pp_rank`` runs: ``pp_rank, pp_rank + pp, ...`` (looped), or
    ``pp_rank`` and ``2 pp - 1 - pp_rank`` for the V-shaped schedules."""
    if v_shaped:
        return (pp_rank, 2 * pp - 1 - pp_rank)
    return tuple(pp_rank + k * pp for k in range(stages_per_rank))


def _layer_containers(model: nn.Module) -> dict[str, nn.Module]:
    return {name: m for name, m in model.named_modules() if name and isinstance(m, _CONTAINERS)}


def _units(model: nn.Module, containers: set[str]) -> list[str]:
    """The model's modules in order, the given layer containers expanded into their layers."""
    units: list[str] = []

    def walk(module: nn.Module, prefix: str) -> None:
        for name, child in module._modules.items():
            if child is None:
                continue
            full = prefix + name
            if full in containers:
                units.extend(f"{full}.{key}" for key, c in child._modules.items() if c is not None)
            elif any(c.startswith(full + ".") for c in containers):
                walk(child, full + ".")
            else:
                units.append(full)

    walk(model, "")
    return units


def _auto_split_points(model: nn.Module, n_stages: int) -> list[str]:
    containers = _layer_containers(model)
    if not containers:
        raise ValueError(
            f"{type(model).__name__} has no ModuleList/ModuleDict of layers to split into "
            f"{n_stages} pipeline stages; give pipeline=dict(split_points=[...]) naming the "
            "modules where stages start"
        )
    name = max(containers, key=lambda n: len(containers[n]))
    layers = list(containers[name]._modules)
    if n_stages > len(layers):
        raise ValueError(
            f"{n_stages} pipeline stages need at least {n_stages} layers, but "
            f"{type(model).__name__}.{name} has {len(layers)}; lower pp or stages_per_rank"
        )
    return [f"{name}.{layers[round(i * len(layers) / n_stages)]}" for i in range(1, n_stages)]


def _split_points(model: nn.Module, config: PipelineConfig, n_stages: int) -> list[str]:
    if config.split_points is not None:
        return list(config.split_points)
    if config.split_fn is not None:
        return list(config.split_fn(model, n_stages))
    declared = getattr(model, "pipeline_split_points", None)
    if callable(declared):
        declared = declared(n_stages)
    if declared is not None:
        return list(declared)
    return _auto_split_points(model, n_stages)


def plan_pipeline(
    model: nn.Module, config: PipelineConfig, pp: int, batch_size: int | None = None
) -> PipelinePlan:
    """Check and resolve the split of ``model`` into ``pp × stages_per_rank`` stages. Every
    bad input is one line, raised alike on every rank before anything is split: split points
    that name no module (with the nearest names), that are not layers or not in model order,
    more stages than layers, ``n_microbatches`` not dividing ``batch_size`` (when known), no
    loss function."""
    n_stages = pp * config.stages_per_rank
    points = _split_points(model, config, n_stages)
    if len(points) != n_stages - 1:
        raise ValueError(
            f"pp={pp} × stages_per_rank={config.stages_per_rank} = {n_stages} pipeline stages "
            f"need {n_stages - 1} split point(s), got {len(points)}: {points}"
        )
    modules = dict(model.named_modules())
    for point in points:
        if point not in modules:
            near = difflib.get_close_matches(point, [n for n in modules if n], n=3, cutoff=0.5)
            raise ValueError(
                f"pipeline split point {point!r} names no module of {type(model).__name__}"
                + (f"; nearest names: {near}" if near else "")
                + "; split points name layers, e.g. 'blocks.2'"
            )
        parent = point.rpartition(".")[0]
        if not parent or not isinstance(modules[parent], _CONTAINERS):
            raise ValueError(
                f"pipeline split point {point!r} is not a layer (a child of a ModuleList or "
                f"ModuleDict) of {type(model).__name__}; name one, e.g. 'blocks.2'"
            )
    containers = {p.rpartition(".")[0] for p in points}
    n_layers = sum(len(modules[c]) for c in containers)
    if n_stages > n_layers:
        raise ValueError(
            f"{n_stages} pipeline stages need at least {n_stages} layers, but the split "
            f"points' containers {sorted(containers)} hold {n_layers}; lower pp or "
            "stages_per_rank"
        )
    units = _units(model, containers)
    starts = [units.index(p) for p in points]
    if starts != sorted(set(starts)) or starts[0] == 0:
        raise ValueError(
            f"pipeline split points {points} must be distinct layers in model order, after "
            "the first module, so that every stage has modules"
        )
    bounds = [0, *starts, len(units)]
    stage_units = tuple(tuple(units[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    n_microbatches = config.n_microbatches or n_stages
    if batch_size is not None:
        check_microbatches(batch_size, n_microbatches)
    if config.loss_fn is None and not callable(getattr(model, "pipeline_loss", None)):
        raise ValueError(
            f"pipeline parallelism computes the loss on the last stage, but "
            f"{type(model).__name__} has no pipeline_loss(outputs, targets) and pipeline has no "
            "loss_fn; give pipeline=dict(loss_fn=...) or define pipeline_loss on the model"
        )
    return PipelinePlan(config, stage_units, pp, n_microbatches)


def check_microbatches(batch_size: int, n_microbatches: int) -> None:
    """Refuse a batch that ``n_microbatches`` does not divide."""
    if batch_size % n_microbatches:
        raise ValueError(
            f"pipeline n_microbatches={n_microbatches} does not divide the batch of "
            f"{batch_size}; give a batch size that is a multiple of it, or an n_microbatches "
            f"that divides {batch_size}"
        )


def _drop(model: nn.Module, name: str) -> None:
    parent_name, _, leaf = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    if isinstance(parent, _CONTAINERS):
        del parent._modules[leaf]  # the other layers keep their names (indices)
    else:
        setattr(parent, leaf, None)


def split_model(
    model: nn.Module, plan: PipelinePlan, stage_ids: Sequence[int]
) -> tuple[nn.Module, list[nn.Module]]:
    """This rank's part of ``model`` and its stage modules.

    The part is a deep copy of ``model`` without the other ranks' modules: its parameter
    names are the unsplit model's (what optimizers and checkpoints see). With one stage per
    rank it is the stage module; with several, each stage is a view of it that shares its
    modules and lacks the other stages' (its own containers and hooks, so that each stage is
    parallelised and run apart); :func:`adopt_stage_parameters` brings back the root's
    parameters once the stages are parallelised. The root's own parameters (and those of
    modules on the way to the layer containers) stay with stage 0.
    """
    all_units = [u for units in plan.units for u in units]
    containers = {u.rpartition(".")[0] for u in all_units}
    ancestors = {".".join(c.split(".")[:i]) for c in containers for i in range(1, c.count(".") + 1)}
    part = copy.deepcopy(model)
    keep = {u for s in stage_ids for u in plan.units[s]}
    for unit in all_units:
        if unit not in keep:
            _drop(part, unit)
    if 0 not in stage_ids:
        _drop_own_parameters(part, ancestors)
    if len(stage_ids) == 1:
        return part, [part]
    views = []
    for stage in stage_ids:
        view = _view(part, "", set(plan.units[stage]), set(all_units), containers, ancestors)
        if stage != 0:
            _drop_own_parameters(view, ancestors)
        views.append(view)
    return part, views


def _drop_own_parameters(module: nn.Module, ancestors: set[str]) -> None:
    for name in {"", *ancestors}:
        owner = module.get_submodule(name) if name else module
        for key in list(owner._parameters):
            owner._parameters[key] = None


def _shallow(module: nn.Module) -> nn.Module:
    """A copy of ``module`` sharing its parameters, buffers and children, with dicts (children,
    parameters, hooks) of its own."""
    view = copy.copy(module)
    for key, value in list(vars(view).items()):
        if isinstance(value, dict):
            vars(view)[key] = type(value)(value)
    return view


def _view(
    module: nn.Module,
    prefix: str,
    keep: set[str],
    units: set[str],
    containers: set[str],
    ancestors: set[str],
) -> nn.Module:
    view = _shallow(module)
    for name, child in list(view._modules.items()):
        full = prefix + name
        if child is None:
            continue
        if full in containers:
            inner = _shallow(child)
            inner._modules = {k: m for k, m in inner._modules.items() if f"{full}.{k}" in keep}
            view._modules[name] = inner
        elif full in ancestors:
            view._modules[name] = _view(child, full + ".", keep, units, containers, ancestors)
        elif full in units and full not in keep:
            view._modules[name] = None
    return view


def adopt_stage_parameters(part: nn.Module, stages: Sequence[nn.Module]) -> None:
    """After the stage views are parallelised: the part takes their own parameters (the root's
    and its ancestors', which ``fully_shard`` may have replaced in the views only), so that its
    parameters are the ones the stages train."""
    if len(stages) == 1 and stages[0] is part:
        return

    def adopt(target: nn.Module, view: nn.Module) -> None:
        for key, param in view._parameters.items():
            if param is not None:
                target._parameters[key] = param
        for name, child in view._modules.items():
            own = target._modules.get(name)
            if child is not None and own is not None and child is not own:
                adopt(own, child)

    for view in stages:
        adopt(part, view)


# ---------------------------------------------------------------------------- the schedule
def build_schedule(
    stages: Sequence[Any], plan: PipelinePlan, loss_fn: Callable[..., torch.Tensor]
) -> Any:
    """torch's schedule of ``plan.config.schedule`` over this rank's ``PipelineStage`` s.

    Gradients are not scaled by the schedule (``scale_grads=False``: it would divide the
    gradients accumulated over earlier steps too); ``loss_fn`` divides by the number of
    microbatches itself."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    cls = get_schedule_class(plan.config.schedule)
    first = stages[0] if plan.config.schedule in _SINGLE else list(stages)
    return cls(first, n_microbatches=plan.n_microbatches, loss_fn=loss_fn, scale_grads=False)


class Pipeline:
    """This rank's stages and the schedule that runs them; :meth:`train_step` is the pipelined
    model's optimisation step.

    Args:
        stages: this rank's stage modules (parallelised), in the order of ``stage_ids``.
        plan: the checked split (:func:`plan_pipeline`).
        pp_rank: this rank's pipeline rank.
        pp_group: the process group of the ``pp`` mesh dimension.
        device: where the inputs go.
        loss_fn: ``loss_fn(outputs, targets)``, computed on the last stage.
    """

    def __init__(
        self,
        stages: Sequence[nn.Module],
        plan: PipelinePlan,
        pp_rank: int,
        pp_group: Any,
        device: torch.device,
        loss_fn: Callable[..., torch.Tensor],
    ) -> None:
        from torch.distributed.pipelining import PipelineStage

        self.plan, self.pp_group, self.device = plan, pp_group, device
        self.stage_ids = plan.stage_ids(pp_rank)
        self.modules = list(stages)
        self.has_first = 0 in self.stage_ids
        self.has_last = plan.n_stages - 1 in self.stage_ids
        self._last_rank = plan.rank_of_stage(plan.n_stages - 1)
        self._loss_fn, self._loss_scale = loss_fn, 1.0
        self.stages = [
            PipelineStage(module, sid, plan.n_stages, device, group=pp_group)
            for module, sid in zip(self.modules, self.stage_ids, strict=True)
        ]
        self.schedule = build_schedule(self.stages, plan, self._scaled_loss)

    def _scaled_loss(self, outputs: Any, targets: Any) -> torch.Tensor:
        return self._loss_fn(outputs, targets) * self._loss_scale

    def train_step(self, data: Any, optim_wrapper: Any) -> dict[str, torch.Tensor]:
        """One pipelined optimisation step on ``data`` (``(inputs, targets)`` or a dict with
        ``inputs`` and ``targets``): the schedule's forward and backward of every microbatch,
        then, when the optimizer wrapper's accumulation window ends, clipping by the global
        norm (every stage, every mesh dimension), the optimizer step and zeroing.

        Gradient accumulation is as without stages: the loss is divided by the window's size
        (``optim_wrapper.scale_loss``); each step's gradients are reduced over the data-parallel
        dimensions when its last microbatch ends (the stage does that itself) and add up in the
        sharded gradients. Returns ``dict(loss=...)``: the mean of the microbatches' losses,
        computed on the last stage and broadcast to every pipeline rank.
        """
        from shardwise.optim import AmpOptimWrapper, OptimWrapperDict

        if isinstance(optim_wrapper, OptimWrapperDict):
            raise TypeError(
                "a pipelined train step updates one optimizer, but optim_wrapper holds several "
                f"({sorted(optim_wrapper.keys())}); give one optimizer"
            )
        if isinstance(optim_wrapper, AmpOptimWrapper):
            raise TypeError(
                "pipeline parallelism does not support AmpOptimWrapper's loss scaling yet; use "
                "OptimWrapper with FSDP's mixed_precision (bf16) instead"
            )
        inputs, targets = _inputs_and_targets(data)
        inputs = _to(inputs, self.device)
        targets = _to(targets, self.device)
        check_microbatches(_batch_size(inputs), self.plan.n_microbatches)
        window = float(optim_wrapper.scale_loss(torch.ones((), dtype=torch.float64)))
        self._loss_scale = window / self.plan.n_microbatches
        losses: list[torch.Tensor] = []
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        target = targets if self.has_last else None
        if self.has_first:
            self.schedule.step(*args, target=target, losses=losses, return_outputs=False)
        else:
            self.schedule.step(target=target, losses=losses, return_outputs=False)
        loss = torch.zeros((), dtype=torch.float64, device=self.device)
        if self.has_last:
            loss += torch.stack([x.detach().double() for x in losses]).mean() / self._loss_scale
        # waited for after the step: the last stage steps while the first finishes its backward
        sent = torch_dist.broadcast(
            loss, group=self.pp_group, group_src=self._last_rank, async_op=True
        )
        optim_wrapper._after_backward()
        if optim_wrapper.should_update():
            self._step(optim_wrapper)
        sent.wait()
        return {"loss": loss}

    def _step(self, wrapper: Any) -> None:
        """Step (clipping by the norm over every stage: the wrapper's ``clip_group``)."""
        wrapper.clip_group = self.pp_group
        wrapper.step()
        wrapper.zero_grad()


def _inputs_and_targets(data: Any) -> tuple[Any, Any]:
    if isinstance(data, Mapping) and "inputs" in data and "targets" in data:
        return data["inputs"], data["targets"]
    if isinstance(data, list | tuple) and len(data) == 2:
        return data[0], data[1]
    shown = sorted(data) if isinstance(data, Mapping) else type(data).__name__
    raise TypeError(
        f"a pipelined train step takes (inputs, targets) or dict(inputs=..., targets=...), got "
        f"{shown}"
    )


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    return value


def _batch_size(inputs: Any) -> int:
    first = inputs[0] if isinstance(inputs, tuple) else inputs
    return int(first.shape[0])
