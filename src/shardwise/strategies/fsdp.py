"""FSDPStrategy: fully sharded data parallel training on FSDP2 (``fully_shard``, DTensor).

Every rank holds a shard of each parameter, gradient and optimizer state; parameters are
all-gathered for forward and backward and gradients reduce-scattered, on CPU (gloo) and CUDA
(NCCL) alike. The configuration keeps mmengine's and FSDP1's vocabulary (``model_wrapper``,
``state_dict_cfg``; see :mod:`shardwise.strategies.fsdp_config`).

Example::

    >>> # torchrun --nproc-per-node 8 train.py
    >>> strategy = FSDPStrategy(
    ...     model_wrapper=dict(auto_wrap_policy={'TransformerBlock'},
    ...                        mixed_precision=dict(param_dtype='bf16', reduce_dtype='fp32')),
    ...     skip_init_weights=True, state_dict_cfg='sharded')
    >>> model, optim_wrapper = strategy.prepare(
    ...     dict(type='GPT', n_layer=48), optim_wrapper=dict(optimizer=dict(type='AdamW', lr=3e-4)))
    >>> strategy.load_checkpoint('pretrained.pth')  # full, sharded or local: detected from disk
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from shardwise import dist
from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.agreement import on_every_rank, on_rank0
from shardwise.checkpoint.checkpointer import Layout
from shardwise.optim.parts import optim_wrapper_parts, part_optimizer
from shardwise.optim.scheduler import _ParamScheduler
from shardwise.registry import MODEL_WRAPPERS, STRATEGIES
from shardwise.tree import contains, map_tensors

from .base import BaseStrategy
from .fault_tolerance import FaultTolerance, check_fault_tolerance
from .fsdp_config import (
    DEFAULT_SHARDER_NAMES,
    FSDP1_ONLY_KEYS,
    FSDPConfig,
    parse_activation_checkpointing,
    parse_model_wrapper,
    parse_state_dict_cfg,
    parse_wrap_policy,
)
from .fsdp_optim import OptimizerRebinder, rebuild_optimizer
from .mesh import Degrees, build_device_mesh, data_parallel_mesh, resolve_degrees
from .parallelize import (
    apply_activation_checkpointing,
    clean_name,
    has_meta_tensors,
    materialize_model,
    select_modules_to_shard,
)
from .pipeline import (
    Pipeline,
    PipelinePlan,
    adopt_stage_parameters,
    check_split_backward,
    parse_pipeline,
    plan_pipeline,
    split_model,
)
from .pipeline_checkpoint import PipelineShardedFormat, StagePart
from .tensor_parallel import (
    TensorParallelPlan,
    apply_tensor_parallel,
    parse_tp_plan,
    resolve_styles,
)

__all__ = ["FSDPStrategy", "fully_shard_model", "rebuild_optimizer"]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- the sharder
def _shard_model(model: nn.Module, mesh: DeviceMesh, config: FSDPConfig) -> nn.Module:
    """Apply ``fully_shard`` to ``model`` as ``config`` says: to the submodules its wrap
    policy selects (or the model's ``_no_split_modules``; children before parents), then to
    the root.

    ``reshard_after_forward`` applies to the submodules; the root keeps its parameters
    gathered from forward to backward (torch's default for it, and FSDP1's): resharding it
    would gather them again as soon as backward starts. Works on a model on the meta device:
    the shards are meta too until :func:`~.parallelize.materialize_model`. Warns when the
    policy names module classes the model does not have, or selects nothing.
    """
    policy, named = config.wrap_policy, config.wrap_policy is not None
    no_split = getattr(model, "_no_split_modules", None)
    if policy is None and no_split:
        policy = parse_wrap_policy(set(no_split), "_no_split_modules")
    modules = select_modules_to_shard(model, policy, config.ignored_modules)
    if named:
        _warn_if_selection_misses(model, policy, modules, "auto_wrap_policy")
    if config.buffer_dtype is not None:
        for buffer in model.buffers():
            if buffer.is_floating_point():
                buffer.data = buffer.data.to(config.buffer_dtype)
    offload = config.offload_policy
    if isinstance(offload, CPUOffloadPolicy) and mesh.device_type == "cpu":
        logger.info("cpu_offload has nothing to do on a CPU mesh: the shards are on the CPU")
        offload = None
    kwargs: dict[str, Any] = dict(
        mesh=mesh,
        reshard_after_forward=config.reshard_after_forward,
        mp_policy=config.mp_policy or MixedPrecisionPolicy(),
        offload_policy=offload or OffloadPolicy(),
    )
    ignored = {p for m in config.ignored_modules for p in m.parameters()}
    if ignored:
        kwargs["ignored_params"] = ignored
    for module in modules:
        fully_shard(module, **kwargs)
    fully_shard(model, **{**kwargs, "reshard_after_forward": None})
    return model


@MODEL_WRAPPERS.register_module(name=sorted(DEFAULT_SHARDER_NAMES))
def fully_shard_model(module: nn.Module, *, mesh: DeviceMesh, **model_wrapper: Any) -> nn.Module:
    """The default sharder, built from ``model_wrapper`` through ``MODEL_WRAPPERS`` (also as
    mmengine's ``'MMFullyShardedDataParallel'`` and ``'FullyShardedDataParallel'``).

    A custom sharder is any callable registered in ``MODEL_WRAPPERS`` with this signature:
    ``sharder(module, *, mesh, **its_config) -> nn.Module``.

    Example::

        >>> model = fully_shard_model(model, mesh=mesh, auto_wrap_policy={'Block'},
        ...                           sharding_strategy='SHARD_GRAD_OP')
    """
    return _shard_model(module, mesh, parse_model_wrapper(model_wrapper))


def _warn_if_selection_misses(
    model: nn.Module, selector: Any, selected: Sequence[nn.Module], what: str
) -> None:
    """Warn when ``selector`` (a wrap policy or a module selector) names module classes the
    model does not have, or selects nothing."""
    present = sorted({type(m).__name__ for m in model.modules()})
    classes, names = getattr(selector, "module_classes", ((), frozenset()))
    missing = [c.__name__ for c in classes if not any(isinstance(m, c) for m in model.modules())]
    missing += sorted(n for n in names if n not in present)
    if missing:
        logger.warning(
            "%s names %s, which match no module of %s; its module classes are %s",
            what,
            missing,
            type(model).__name__,
            present,
        )
    elif not selected:
        logger.warning(
            "%s selected no submodule of %s; its module classes are %s",
            what,
            type(model).__name__,
            present,
        )


# ---------------------------------------------------------------------------- the strategy
@STRATEGIES.register_module()
class FSDPStrategy(BaseStrategy):
    """Fully sharded data parallel training with FSDP2, on CPU (gloo) or CUDA (NCCL).

    Args:
        model_wrapper: how ``fully_shard`` is applied. ``type`` (default: the built-in sharder,
            also named ``'MMFullyShardedDataParallel'``/``'FullyShardedDataParallel'``) or a
            custom sharder from ``MODEL_WRAPPERS``; the built-in one takes
            ``auto_wrap_policy``, ``sharding_strategy``, ``replicate_size``, ``mixed_precision``,
            ``cpu_offload``, ``reshard_after_forward``, ``ignored_modules`` and FSDP1's keys
            (see :func:`~shardwise.strategies.fsdp_config.parse_model_wrapper`).
        skip_init_weights: build a model config on the meta device (no memory, no
            initialisation) and materialise it shard by shard after sharding; a built model
            keeps its weights (``init_weights()`` is not run). Build your own model inside
            :meth:`init_module` to get the same.
        state_dict_cfg: the checkpoint format :meth:`save_checkpoint` writes: ``'sharded'``
            (DCP directory, reshardable), ``'full'`` (one file by rank 0), ``'local'``
            (``rank{i}.pth`` per rank), or mmengine's dict form. Loading detects the format.
        activation_checkpointing: ``dict(check_fn=..., **checkpoint_wrapper_kwargs)``, applied
            before sharding; ``check_fn`` is a registered function name, ``dict(type=...)``,
            a callable ``(module) -> bool`` or a list of module classes (or their names).
        train_micro_batch_size_per_gpu: the batch size of one rank, for ``auto_scale_lr``.
        parallelism: the parallel degrees, ``dict(dp_replicate=1, dp_shard=-1, tp=1)`` (every
            key optional; ``-1``: the rest of the world; see :mod:`~shardwise.strategies.mesh`).
            Their product is the world size; the mesh has one named dimension per degree.
            ``sharding_strategy`` may set the data-parallel ones instead (HYBRID_SHARD:
            ``dp_replicate=replicate_size``; NO_SHARD: ``dp_shard=1``).
        tp_plan: how tensor parallelism splits the model when ``tp > 1``: ``'auto'`` (the
            model's own plan, e.g. a Hugging Face model's), a dict of module-name patterns to
            styles, or ``parallelize_fn(model, mesh)`` (see
            :mod:`~shardwise.strategies.tensor_parallel`).
        pipeline: how the model is split into stages when ``pp > 1``:
            ``dict(split_points=[...], schedule='1F1B', n_microbatches=..., stages_per_rank=...,
            loss_fn=...)`` (see :mod:`~shardwise.strategies.pipeline`); each stage is then
            parallelised as a whole model is (with ``pp`` alone it stays a plain module:
            nothing to shard), and :attr:`pipeline` runs the train step.
        fault_tolerance: this launch is one replica group of FT-HSDP (:mod:`.fault_tolerance`).
        **kwargs: :class:`~shardwise.strategies.BaseStrategy` arguments.
    """

    def __init__(
        self,
        *,
        model_wrapper: Mapping[str, Any] | None = None,
        skip_init_weights: bool = False,
        state_dict_cfg: str | Mapping[str, Any] = "sharded",
        activation_checkpointing: Mapping[str, Any] | None = None,
        train_micro_batch_size_per_gpu: int | None = None,
        parallelism: Mapping[str, int] | None = None,
        tp_plan: Any = None,
        pipeline: Mapping[str, Any] | None = None,
        fault_tolerance: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        _check_own_flags(skip_init_weights, train_micro_batch_size_per_gpu)
        self._tp_plan = parse_tp_plan(tp_plan)
        self._pipeline_cfg = parse_pipeline(pipeline)
        self.pipeline: Pipeline | None = None
        self._state_dict = parse_state_dict_cfg(state_dict_cfg)
        self._sharder_cfg, self._fsdp_config = self._parse_model_wrapper(model_wrapper)
        self._activation_checkpointing = parse_activation_checkpointing(activation_checkpointing)
        self.skip_init_weights = skip_init_weights
        super().__init__(**kwargs)
        if train_micro_batch_size_per_gpu is not None:
            self.dispatch_kwargs["train_micro_batch_size_per_gpu"] = train_micro_batch_size_per_gpu
        self.degrees = _degrees(
            self._fsdp_config, parallelism, self._tp_plan, self.world_size, dist.get_local_size()
        )
        if self._tp_plan is not None and self.degrees.tp == 1:
            self.logger.info("tp_plan is not applied: parallelism has tp=1")
        _check_pipeline_format(self.degrees, self._state_dict.format.name)
        #: The checked ``fault_tolerance`` config (None without one), known before ``prepare``.
        self.fault_tolerance_cfg = _check_ft(self.degrees, fault_tolerance)
        self.fault_tolerance: FaultTolerance | None = None
        if pipeline is not None and self.degrees.pp == 1:
            self.logger.info("pipeline is not applied: parallelism has pp=1")
        if self.degrees.pp > 1:
            check_split_backward(self._pipeline_cfg, self._stage_sharding())
        ignored = self._fsdp_config.ignored_fsdp1_keys
        if ignored:
            self.logger.info(
                "model_wrapper keys %s are FSDP1 options that FSDP2 needs no equivalent for; "
                "they are ignored (%s)",
                list(ignored),
                "; ".join(f"{k}: {FSDP1_ONLY_KEYS[k]}" for k in ignored if k in FSDP1_ONLY_KEYS)
                or "mixed precision details FSDP2 handles itself",
            )
        self.mesh: DeviceMesh | None = None
        self._rebinder = OptimizerRebinder()

    # ------------------------------------------------------------------ configuration
    @staticmethod
    def _parse_model_wrapper(cfg: Any) -> tuple[dict[str, Any] | None, FSDPConfig]:
        """The custom sharder's config (None for the built-in one) and the FSDP settings."""
        if cfg is not None and not isinstance(cfg, Mapping):
            raise TypeError(
                f"model_wrapper must be a dict such as dict(auto_wrap_policy={{'Block'}}), got "
                f"{type(cfg).__name__}: {cfg!r}"
            )
        cfg = dict(cfg or {})
        sharder = MODEL_WRAPPERS.resolve(cfg.get("type", "fully_shard_model"))
        if sharder is fully_shard_model:
            cfg.pop("type", None)
            return None, parse_model_wrapper(cfg)
        return cfg, FSDPConfig()

    @classmethod
    def _check_kwargs(cls, kwargs: Mapping[str, Any], world_size: int, local_size: int) -> None:
        super()._check_kwargs(kwargs, world_size, local_size)
        _check_own_flags(
            kwargs.get("skip_init_weights", False), kwargs.get("train_micro_batch_size_per_gpu")
        )
        parse_state_dict_cfg(kwargs.get("state_dict_cfg", "sharded"))
        _, fsdp_config = cls._parse_model_wrapper(kwargs.get("model_wrapper"))
        parse_activation_checkpointing(kwargs.get("activation_checkpointing"))
        plan = parse_tp_plan(kwargs.get("tp_plan"))
        parse_pipeline(kwargs.get("pipeline"))
        degrees = _degrees(fsdp_config, kwargs.get("parallelism"), plan, world_size, local_size)
        fmt = parse_state_dict_cfg(kwargs.get("state_dict_cfg", "sharded")).format
        _check_pipeline_format(degrees, fmt.name)
        _check_ft(degrees, kwargs.get("fault_tolerance"))

    @property
    def state_dict_type(self) -> Any:
        """mmengine's/FSDP1's ``StateDictType`` of the checkpoint format."""
        return self._state_dict.state_dict_type

    @property
    def state_dict_config(self) -> Any:
        return self._state_dict.state_dict_config

    @property
    def optim_state_dict_config(self) -> Any:
        return self._state_dict.optim_state_dict_config

    @property
    def checkpoint_format(self) -> str:
        """``'sharded'``, ``'full'`` or ``'local'``: what :meth:`save_checkpoint` writes."""
        return self._state_dict.format.name

    # ------------------------------------------------------------------ building the model
    @contextlib.contextmanager
    def init_module(self) -> Iterator[None]:
        """Build the model in this context: on the meta device when ``skip_init_weights`` is
        set (no memory, no initialisation: :meth:`prepare` materialises it shard by shard),
        else as usual.

        Example::

            >>> with strategy.init_module():
            ...     model = GPT(n_layer=48)
            >>> model, optim_wrapper = strategy.prepare(model, optim_wrapper=...)
        """
        if not self.skip_init_weights:
            yield
            return
        with torch.device("meta"):
            yield

    def build_model(self, model: nn.Module | Mapping[str, Any]) -> nn.Module:
        """Build a model config, on the meta device when ``skip_init_weights`` is set."""
        if isinstance(model, Mapping) and self.skip_init_weights:
            with self.init_module():
                return super().build_model(model)
        return super().build_model(model)

    def _init_model_weights(self, model: nn.Module) -> nn.Module:
        if isinstance(model, FSDPModule):
            return model  # sharded by the caller already
        if has_meta_tensors(model):
            return model  # initialised shard by shard once sharded (see _wrap_model)
        if not self.skip_init_weights:
            return super()._init_model_weights(model)
        if self.world_size > 1:  # keep the given weights, the same on every rank
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)
        return model

    def _wrap_model(self, model: nn.Module, compile: Any = False) -> nn.Module:
        """Parallelise the model. The order of operations, in one place (torchtitan's):

        0. (:meth:`build_model`) a config is built on the meta device with
           ``skip_init_weights``, a built model is initialised and equal on every rank;
        1. record parameter names, to rebuild pre-built optimizers by name; with ``pp > 1``
           check the split (:func:`~.pipeline.plan_pipeline`), build the mesh, and split the
           model into this rank's stages (:func:`~.pipeline.split_model`): each stage then
           goes through steps 2-6 on the mesh's other dimensions;
        2. tensor parallelism on the mesh's ``tp`` dimension (``tp_plan``), checked first;
        3. activation checkpointing, so that ``fully_shard`` sees the wrappers;
        4. ``torch.compile`` (``compile``; see :meth:`compile_model`);
        5. ``fully_shard`` the selected submodules, then the root, over the data-parallel
           dimensions (a meta model stays meta: nothing is allocated); a pipeline stage with
           pp alone (data-parallel degree 1, no tensor parallelism) stays a plain module
           (:meth:`_shards_stages`);
        6. materialise a meta model on this rank's device, each rank only its shards, and
           initialise it shard-locally (``init_weights()`` or ``reset_parameters()``); a
           checkpoint loaded afterwards overwrites these weights.
        """
        if isinstance(model, FSDPModule):
            return self.compile_model(model, compile)
        start = time.perf_counter()
        self._rebinder.remember(model)
        on_meta = has_meta_tensors(model)
        tp = self._tp_plan if self.degrees.tp > 1 else None
        styles = resolve_styles(model, tp, self.degrees.tp) if tp is not None else {}
        plan = self._plan_pipeline(model, on_meta) if self.degrees.pp > 1 else None
        self._ensure_process_group()
        self.mesh = build_device_mesh(self.device.type, self.degrees)
        if plan is not None:
            model = self._wrap_stages(model, plan, compile, tp, styles)
        else:
            model = self._parallelize(model, compile, tp, styles, on_meta)
        self.logger.info(
            "Parallelised %s over a %s mesh %s in %.2f s%s%s%s",
            type(model).__name__,
            self.device.type,
            dict(zip(self.degrees.dim_names, self.degrees.shape, strict=True)),
            time.perf_counter() - start,
            f" (tensor parallel: {tp.describe()})" if tp is not None else "",
            f" (pipeline stages {self.pipeline.stage_ids} of {plan.n_stages}, "
            f"{plan.config.schedule})"
            if plan is not None and self.pipeline is not None
            else "",
            " (built on the meta device, initialised shard by shard)" if on_meta else "",
        )
        return model

    def _plan_pipeline(self, model: nn.Module, on_meta: bool) -> PipelinePlan:
        """The checked split of ``model`` into stages (before any collective)."""
        if on_meta:
            raise ValueError(
                "pipeline parallelism (pp > 1) needs a built model: a model on the meta device "
                "cannot be initialised stage by stage yet; drop skip_init_weights"
            )
        batch = self.dispatch_kwargs.get("train_micro_batch_size_per_gpu")
        return plan_pipeline(model, self._pipeline_cfg, self.degrees.pp, batch)

    def _wrap_stages(
        self, model: nn.Module, plan: PipelinePlan, compile: Any, tp: Any, styles: Mapping
    ) -> nn.Module:
        """Split ``model`` into this rank's stages, each parallelised over the stage mesh;
        returns this rank's part of the model (unsplit names; the stage module itself with one
        stage per rank)."""
        assert self.mesh is not None
        pp_rank = self.mesh.get_local_rank("pp")
        part, views = split_model(model, plan, plan.stage_ids(pp_rank))
        shard = self._shards_stages()
        stages = []
        for view in views:
            names = {name for name, _ in view.named_modules()}
            own = {name: style for name, style in styles.items() if name in names}
            stages.append(self._parallelize(view, compile, tp, own, on_meta=False, shard=shard))
        adopt_stage_parameters(part, views)
        loss_fn = plan.config.loss_fn or views[-1].pipeline_loss
        group = self.mesh.get_group("pp")
        self.pipeline = Pipeline(stages, plan, pp_rank, group, self.device, loss_fn)
        return stages[0] if len(stages) == 1 else part

    def _stage_sharding(self) -> list[str]:
        """Why pipeline stages go through ``fully_shard`` (empty: they stay plain modules). Not
        with pp alone (no tensor parallelism, a data-parallel degree of 1): there is nothing to
        shard, and FSDP's hooks, DTensor parameters and DTensor optimizer steps would only cost
        time (torchtitan applies no FSDP at a data-parallel degree of 1). A custom sharder, or
        ``model_wrapper``'s mixed precision, CPU offload or buffer dtype (what only
        ``fully_shard`` carries out), keep it over the mesh of size 1."""
        degrees = {name: getattr(self.degrees, name) for name in ("dp_replicate", "dp_shard", "tp")}
        reasons = [f"{name}={degree}" for name, degree in degrees.items() if degree > 1]
        reasons += [f"model_wrapper's {s}" for s in _fsdp_only_settings(self._fsdp_config)]
        if self._sharder_cfg is not None:
            reasons.append(f"the custom sharder {self._sharder_cfg.get('type')!r}")
        return reasons

    def _shards_stages(self) -> bool:
        """Whether pipeline stages go through ``fully_shard`` (:meth:`_stage_sharding`), logged."""
        reasons = self._stage_sharding()
        if reasons:
            self.logger.info("pipeline stages are fully_shard-ed for %s", ", ".join(reasons))
        else:
            self.logger.info(
                "pipeline stages with a data-parallel degree of 1 stay plain modules (no "
                "fully_shard: nothing to shard)"
            )
        return bool(reasons)

    def _parallelize(
        self,
        model: nn.Module,
        compile: Any,
        tp: Any,
        styles: Mapping,
        on_meta: bool,
        shard: bool = True,
    ) -> nn.Module:
        """TP → AC → compile → ``fully_shard`` (unless not ``shard``) → materialise, of a
        model or a stage."""
        assert self.mesh is not None
        if tp is not None:
            model = apply_tensor_parallel(model, self.mesh, tp, styles)
        if self._activation_checkpointing is not None:
            ac = self._activation_checkpointing
            chosen = [m for m in model.modules() if m is not model and ac.check_fn(m)]
            _warn_if_selection_misses(model, ac.check_fn, chosen, "activation_checkpointing")
            model = apply_activation_checkpointing(model, ac.check_fn, ac.wrapper_kwargs)
        model = self.compile_model(model, compile)
        dp_mesh = data_parallel_mesh(self.mesh, self.degrees)
        if isinstance(model, FSDPModule):
            self.logger.info("parallelize_fn applied fully_shard itself: not sharding again")
        elif not shard:
            pass  # a plain pipeline stage (see _shards_stages)
        elif self._sharder_cfg is None:
            model = _shard_model(model, dp_mesh, self._fsdp_config)
        else:
            model = MODEL_WRAPPERS.build(
                self._sharder_cfg, default_args=dict(module=model, mesh=dp_mesh)
            )
        if on_meta:
            model = materialize_model(model, self.device, seed=self.seed, mesh=self.mesh)
        return model

    @property
    def data_parallel_rank(self) -> int:
        return self.degrees.dp_rank(self.rank)

    @property
    def data_parallel_size(self) -> int:
        return self.degrees.dp_size

    def _ensure_process_group(self) -> None:
        """FSDP2 needs a process group; a run without a launcher gets one of a single rank."""
        if dist.is_distributed():
            return
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        torch_dist.init_process_group(backend, store=torch_dist.HashStore(), rank=0, world_size=1)
        dist.destroy_at_exit()
        self.logger.info("FSDPStrategy without a launcher: started a 1-rank %s group", backend)

    # ------------------------------------------------------------------ optimizers, schedulers
    def _check_prepare_args(
        self,
        model: Any,
        optim_wrapper: Any,
        param_scheduler: Any,
        dispatch_kwargs: Mapping[str, Any] | None,
    ) -> None:
        super()._check_prepare_args(model, optim_wrapper, param_scheduler, dispatch_kwargs)
        parts = optim_wrapper_parts(optim_wrapper).values() if optim_wrapper is not None else ()
        for optimizer in filter(None, map(part_optimizer, parts)):
            if optimizer.state:
                raise ValueError(
                    f"the pre-built {type(optimizer).__name__} already has state for "
                    f"{len(optimizer.state)} parameter(s); FSDPStrategy rebuilds it over the "
                    "sharded parameters and cannot carry that state over. Pass it before its "
                    "first step, or pass a config (optim_wrapper=dict(optimizer=dict(type=...)))"
                    " and restore the state with resume()"
                )
            if not isinstance(model, nn.Module):
                raise ValueError(
                    "a pre-built optimizer needs the built model it optimizes; pass the model "
                    "as an nn.Module, or the optimizer as a config"
                )
            own = {id(p) for p in model.parameters()}
            foreign = [p for g in optimizer.param_groups for p in g["params"] if id(p) not in own]
            if foreign:
                raise ValueError(
                    f"the pre-built {type(optimizer).__name__} holds {len(foreign)} tensor(s) "
                    "that are not parameters of the model passed to prepare(); build it over "
                    "model.parameters()"
                )

    def build_optim_wrapper(self, optim_wrapper: Any, model: nn.Module | None = None) -> Any:
        """As :meth:`BaseStrategy.build_optim_wrapper`, against the sharded parameters.

        A pre-built optimizer (alone, in an ``OptimWrapper`` or in a config) is rebuilt over
        the sharded parameters with the same param groups and hyper-parameters, matched by
        parameter name; an ``AmpOptimWrapper`` gets FSDP's ``ShardedGradScaler``.
        """
        model = model if model is not None else self.model
        rebound = self._rebinder.rebind(optim_wrapper, model, self.device.type)
        built = super().build_optim_wrapper(rebound, model)
        for part in optim_wrapper_parts(built).values():
            _check_steps_dtensors(part_optimizer(part))
        return built

    def _adopt_scheduler(self, scheduler: _ParamScheduler, optim_wrapper: Any) -> _ParamScheduler:
        """Point a pre-built scheduler at the rebuilt optimizer (kept, with its state)."""
        return self._rebinder.adopt(scheduler)

    # ------------------------------------------------------------------ state dicts
    def _state_dict_options(self, **overrides: Any) -> StateDictOptions:
        """Options of :meth:`model_state_dict` and :meth:`optim_state_dict` for the format."""
        if self._state_dict.format.gathered:
            options = dict(full_state_dict=True, cpu_offload=self._state_dict.rank0_only)
        else:
            options = dict(full_state_dict=False, cpu_offload=False)
        return StateDictOptions(**{**options, **overrides})

    def _offload(self, state: Any) -> Any:
        if self._state_dict.format.gathered and self._state_dict.offload_to_cpu:
            return map_tensors(lambda t: t.cpu(), state)
        return state

    def _load_options(self, state: Any) -> StateDictOptions:
        """DTensors load shard to shard. Full tensors are taken from rank 0 (the others may
        hold placeholders), but under pipeline stages every rank holds its own stage's
        (:class:`~.pipeline_checkpoint.StagePart`), loaded as they are or onto the stage's
        shards."""
        if contains(DTensor, state):
            return StateDictOptions(full_state_dict=False)
        if self.pipeline is not None:
            return StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
        return StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)

    # ------------------------------------------------------------------ checkpoints
    def _register_states(self) -> None:
        """As :meth:`BaseStrategy._register_states`; a pipeline stage's model and optimizer
        states take their own part of a checkpoint (:class:`~.pipeline_checkpoint.StagePart`)."""
        super()._register_states()
        _attach_ft(self)
        if self.pipeline is None:
            return
        model = self.model

        def own_names() -> set[str]:
            named = (*model.named_parameters(), *model.named_buffers())
            return {clean_name(name) for name, _ in named}

        for key, state in self._checkpointer.states.items():
            if key in ("state_dict", "optimizer"):
                self._checkpointer.register(key, StagePart(key, state, own_names, self.device))

    def _checkpoint_layout(self) -> Layout:
        """Saves write the configured format (full tensors gathered on rank 0, DTensor shards
        or each rank's own); every format is read onto the sharded model (the format's
        ``read_onto``): a full checkpoint by rank 0 only, a sharded one into DTensor shards
        (DCP reshards to this mesh), a local one as this rank's shards."""
        fmt = self._state_dict.format
        if self.degrees.pp > 1:  # every stage's part in one checkpoint of unsplit names
            fmt = PipelineShardedFormat()
        return Layout(
            fmt,
            placement=lambda path: _Placement(self.model, path),
            device=self.device,
            rank=self.rank,
        )


class _Placement:
    """Where FSDPStrategy's reads put a checkpoint's tensors
    (:class:`~shardwise.checkpoint.formats.Placement`): a DTensor laid out like the parameter
    a tensor belongs to (model weights and per-parameter optimizer state), else a plain
    tensor read whole."""

    on_rank0 = staticmethod(on_rank0)
    on_every_rank = staticmethod(on_every_rank)

    def __init__(self, model: nn.Module, path: Path) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        named = model.named_parameters(remove_duplicate=False)  # a tied weight by every name
        self._params = {clean_name(n): p for n, p in named}
        self._path = path

    def tensor_for(self, path: tuple[str, ...], shape: torch.Size, dtype: torch.dtype) -> Any:
        fqn = _param_name_of(path)
        if fqn is not None and fqn not in self._params:
            fqn = fqn.removeprefix("module.")
        param = self._params.get(fqn) if fqn is not None else None
        if isinstance(param, DTensor) and tuple(param.shape) == tuple(shape):
            return torch.empty_like(param, dtype=dtype, requires_grad=False)
        return torch.empty(shape, dtype=dtype)

    def shard_of(self, name: str, tensor: Any) -> Any:
        param = self._params.get(name)
        if not isinstance(param, DTensor) or not isinstance(tensor, torch.Tensor):
            return tensor
        if tensor.dim() == 0:
            return tensor
        local = param.to_local()
        if tensor.shape != local.shape:
            if tensor.shape == param.shape and tensor.numel() != local.numel():
                return tensor  # a full tensor (e.g. NO_SHARD), loaded as such
            raise CheckpointError(
                f"{self._path}: rank {self.rank}'s shard of {name!r} has shape "
                f"{tuple(tensor.shape)}, but this rank's shard is {tuple(local.shape)}: "
                "the checkpoint was saved with a different sharding. A local checkpoint "
                "loads only with the same model_wrapper and number of ranks; save "
                "'sharded' to reshard"
            )
        return DTensor.from_local(
            tensor.to(local.device),
            param.device_mesh,
            param.placements,
            shape=param.shape,
            stride=param.stride(),
            run_check=False,
        )


#: torch optimizers whose step cannot change a DTensor shard in place (torch 2.13), and why
_NO_DTENSOR_STEP = {
    torch.optim.Rprop: "it assigns through a boolean mask (index_put_)",
    torch.optim.Adafactor: "it raises a factor in place (pow_)",
}


def _check_steps_dtensors(optimizer: torch.optim.Optimizer | None) -> None:
    """Refuse, before the first step, an optimizer that would fail on the first step over
    DTensor parameters (sharded or tensor-parallel), naming why and what to use instead."""
    name = type(optimizer).__name__
    why = _NO_DTENSOR_STEP.get(type(optimizer))
    if why is None or not any(
        isinstance(p, DTensor) for g in optimizer.param_groups for p in g["params"]
    ):
        return
    raise ValueError(
        f"optimizer {name} cannot step the sharded (DTensor) parameters of FSDPStrategy with "
        f"torch {torch.__version__}: {why}, which DTensor does not support in place. Use "
        "another optimizer (AdamW, SGD, RMSprop, Adagrad, ...), or DDPStrategy (plain "
        "parameters)"
    )


def _fsdp_only_settings(config: FSDPConfig) -> list[str]:
    """The ``model_wrapper`` settings given that only ``fully_shard`` carries out."""
    settings = []
    if config.mp_policy != MixedPrecisionPolicy():
        settings.append("mixed_precision")
    if isinstance(config.offload_policy, CPUOffloadPolicy):
        settings.append("cpu_offload")
    if config.buffer_dtype is not None:
        settings.append("buffer_dtype")
    return settings


def _check_own_flags(skip_init_weights: Any, micro_batch: Any) -> None:
    if not isinstance(skip_init_weights, bool):
        raise TypeError(
            f"skip_init_weights must be True or False, got {type(skip_init_weights).__name__}"
            f": {skip_init_weights!r}"
        )
    if micro_batch is not None and (
        isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch <= 0
    ):
        raise ValueError(
            "train_micro_batch_size_per_gpu must be a positive int (the batch size of one "
            f"rank), got {micro_batch!r}"
        )


def _degrees(
    cfg: FSDPConfig,
    parallelism: Any,
    plan: TensorParallelPlan | None,
    world_size: int,
    local_size: int,
) -> Degrees:
    """The run's parallel degrees (``parallelism`` and ``sharding_strategy``); refuses
    ``tp > 1`` without a ``tp_plan``."""
    degrees = resolve_degrees(
        parallelism,
        mesh_kind=cfg.mesh_kind,
        replicate_size=cfg.replicate_size,
        world_size=world_size,
        local_size=local_size,
    )
    if degrees.tp > 1 and plan is None:
        raise ValueError(
            f"parallelism has tp={degrees.tp}, but no tp_plan says how to split the model; "
            "give tp_plan='auto' (the model's own plan, e.g. a Hugging Face model's), a dict "
            "such as tp_plan={'blocks.*.attn.q': 'colwise', 'blocks.*.attn.proj': 'rowwise'}, "
            "or a callable parallelize_fn(model, mesh)"
        )
    return degrees


def _check_ft(degrees: Degrees, cfg: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The checked ``fault_tolerance`` config (None without one). FT-HSDP: the replica
    dimension is torchft's, so the mesh has none (and no pipeline stages)."""
    if cfg is None:
        return None
    ft = check_fault_tolerance(cfg)
    if degrees.dp_replicate > 1 or degrees.pp > 1:
        raise ValueError(
            f"fault_tolerance with parallelism dp_replicate={degrees.dp_replicate}, "
            f"pp={degrees.pp}: the replica dimension is torchft's (num_replica_groups="
            f"{ft['num_replica_groups']}, each its own launch) and pipeline stages are not "
            "supported; use dp_replicate=1 and pp=1 (dp_shard, tp inside a replica group)"
        )
    return ft


def _attach_ft(strategy: FSDPStrategy) -> None:
    """Start this replica group's torchft Manager (its ranks FSDP2 over the group's own
    mesh) once prepared; heal through the strategy's Checkpointer, each rank its own shards,
    and average the gradient shards across the live replica groups before each step."""
    cfg = strategy.fault_tolerance_cfg
    if cfg is not None and strategy.fault_tolerance is None:
        strategy.fault_tolerance = FaultTolerance(
            cfg, logger=strategy.logger, multi_rank=True, device=strategy.device
        )
    if strategy.fault_tolerance is not None:
        strategy.fault_tolerance.attach(
            strategy.checkpointer,
            strategy._wrappers(),
            params=strategy.model.parameters,
            model=strategy.model,
        )


def _check_pipeline_format(degrees: Degrees, fmt: str) -> None:
    if degrees.pp > 1 and fmt != "sharded":
        raise ValueError(
            f"pipeline parallelism (pp={degrees.pp}) saves the 'sharded' format only (each "
            f"stage writes its part of one checkpoint), but state_dict_cfg is {fmt!r}; use "
            "state_dict_cfg='sharded' (convert it to a full checkpoint offline afterwards)"
        )


def _param_name_of(path: tuple[str, ...]) -> str | None:
    """The parameter a tensor of a checkpoint belongs to, from its path in the checkpoint:
    ``('state_dict', name)`` or ``('optimizer', [optimizer name,] 'state', name, key)``."""
    if len(path) > 1 and path[0] == "state_dict":
        return path[1]
    if path and path[0] == "optimizer" and "state" in path[:-2]:
        return path[path.index("state") + 1]
    return None
