"""BaseStrategy: where and how a model trains, and what goes into its checkpoints.

A strategy sets up the environment (launcher, process group, randomness, logger), turns
configs into a model, an optimizer wrapper and parameter schedulers (:meth:`prepare`), and
saves and loads checkpoints. Subclasses vary only how a model is placed and wrapped
(:meth:`_wrap_model`) and, for sharded training, how state is gathered and stored.

Example::

    >>> strategy = SingleDeviceStrategy(work_dir='work_dirs/demo')
    >>> model, optim_wrapper = strategy.prepare(
    ...     torch.nn.Linear(2, 1), optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)))
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions

from shardwise import dist
from shardwise.checkpoint.agreement import on_every_rank
from shardwise.checkpoint.checkpointer import Checkpointer, Layout
from shardwise.checkpoint.formats import FULL
from shardwise.checkpoint.memory import attach_memory_tier, parse_memory_checkpoint
from shardwise.checkpoint.retention import check_max_keep_ckpts
from shardwise.checkpoint.storage import ObjectURL, check_storage, location
from shardwise.env import collect_env, set_random_seed
from shardwise.logging import get_logger
from shardwise.optim import OptimWrapper, OptimWrapperDict
from shardwise.optim.parts import SINGLE, optim_wrapper_parts
from shardwise.optim.scheduler import _ParamScheduler

from .building import (
    build_model,
    build_schedulers,
    build_wrapper_part,
    check_auto_scale_lr,
    check_base_kwargs,
    check_flags,
    check_keywords,
    check_prepare_args,
    compile_model,
    scale_lr,
    set_up_environment,
)
from .checkpoints import StrategyCheckpoints
from .matching import unwrap_model

__all__ = ["BaseStrategy", "local_log_root"]

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def local_log_root(url: str) -> Path:
    """Where a run whose work_dir is the URL ``url`` keeps its logs (each run in a timestamped
    folder below): ``./work_dirs/<protocol>/<the rest of the URL>``, so that
    ``s3://bucket/gpt`` does not log into the ``work_dirs/gpt`` of a local run (nor mix its
    curves into that run's ``shardwise plot``)."""
    protocol, _, rest = str(url).partition("://")
    parts = [part for part in rest.split("/") if part not in ("", ".", "..")]
    return Path("work_dirs", protocol, *parts).absolute()


class BaseStrategy(StrategyCheckpoints):
    """Base class of the strategies; see the module docstring.

    Args:
        work_dir: where checkpoints, logs and ``last_checkpoint`` go; an object-store URL
            (``s3://bucket/run``, any fsspec URL) keeps the checkpoints and
            ``last_checkpoint`` there and the logs in ``work_dirs/<protocol>/<bucket>/<path>``
            (:func:`local_log_root`; checked on every rank before anything else: the
            protocol's package, the credentials and the bucket).
        experiment_name: defaults to the timestamp of this run.
        env_kwargs: ``launcher`` (inferred when absent), ``cudnn_benchmark``, ``mp_cfg``,
            ``dist_cfg`` (``backend``, ``timeout``), ``resource_limit`` (``RLIMIT_NOFILE``
            target), ``randomness=dict(seed, diff_rank_seed, deterministic)``.
        log_kwargs: ``log_level`` and ``log_file`` for the logger.
        auto_scale_lr: ``dict(enable=True, base_batch_size=N)`` scales every LR by
            ``world_size * train_micro_batch_size_per_gpu / N``.
        async_save: the default of :meth:`save_checkpoint`'s ``async_save``: write
            checkpoints in the background, training blocked only while the state is copied
            to host memory.
        max_keep_ckpts: the default of :meth:`save_checkpoint`'s ``max_keep_ckpts``: keep
            only the newest N checkpoints saved with a limit (-1: keep all).
        verify_checksums: the default of :meth:`load_checkpoint`'s and :meth:`resume`'s
            ``verify_checksums``: compare a checkpoint's files with the checksums recorded
            when it was saved before loading it.
        memory_checkpoint: a snapshot of the whole state in node-local memory every few
            iterations, replicated to peers on other nodes and recovered from them on a
            restart (``dict(interval=1, replicas=1, dir='/dev/shm/shardwise',
            failure_domain='node')``; :mod:`shardwise.checkpoint.memory`).
    """

    model: nn.Module
    optim_wrapper: OptimWrapper
    param_schedulers: list[_ParamScheduler] | dict[str, list[_ParamScheduler]]

    def __init__(
        self,
        *,
        work_dir: str | os.PathLike[str] = "work_dirs",
        experiment_name: str | None = None,
        env_kwargs: Mapping[str, Any] | None = None,
        log_kwargs: Mapping[str, Any] | None = None,
        auto_scale_lr: Mapping[str, Any] | None = None,
        async_save: bool = False,
        max_keep_ckpts: int = -1,
        verify_checksums: bool = True,
        memory_checkpoint: Mapping[str, Any] | bool | None = None,
        **unknown: Any,
    ) -> None:
        check_keywords(type(self), unknown)
        self._memory_checkpoint = parse_memory_checkpoint(memory_checkpoint)
        check_flags(async_save=async_save, verify_checksums=verify_checksums)
        check_max_keep_ckpts(max_keep_ckpts)
        self._auto_scale_lr = check_auto_scale_lr(auto_scale_lr)
        self._env_kwargs = dict(env_kwargs or {})
        self._work_dir = location(work_dir)
        if isinstance(self._work_dir, Path):
            self._work_dir = self._work_dir.absolute()
        self._setup_env(**self._env_kwargs)
        self._experiment_name = experiment_name or self._timestamp
        local_dir = self._work_dir
        if isinstance(local_dir, ObjectURL):  # refused on every rank, or on none
            on_every_rank(lambda: check_storage(self.work_dir), f"checking work_dir={work_dir}")
            local_dir = local_log_root(local_dir)
        self._log_dir = local_dir / self._timestamp
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self.logger = self.build_logger(**(log_kwargs or {}))
        self._checkpointer = Checkpointer(
            self._work_dir,
            async_save=async_save,
            max_keep_ckpts=max_keep_ckpts,
            verify_checksums=verify_checksums,
            logger=self.logger,
            run_label=str(self._log_dir),
        )
        self.dispatch_kwargs: dict[str, Any] = {}
        self._prepared = False

    @classmethod
    def check_config(
        cls, cfg: Mapping[str, Any], *, world_size: int = 1, local_world_size: int | None = None
    ) -> None:
        """Refuse a config of this strategy (``dict(type=..., **kwargs)``) that its
        constructor would refuse, without building anything: no process group, no files.
        ``shardwise train`` calls it before any worker starts; ``world_size`` and
        ``local_world_size`` (default: the world) are those of the run to be launched.
        Raises TypeError, ValueError or KeyError naming the keyword, the value and what fits.
        """
        kwargs = {k: v for k, v in cfg.items() if k != "type"}
        check_keywords(cls, kwargs)
        cls._check_kwargs(kwargs, world_size, local_world_size or world_size)

    @classmethod
    def _check_kwargs(cls, kwargs: Mapping[str, Any], world_size: int, local_size: int) -> None:
        """The checks of :meth:`check_config` (subclasses add theirs)."""
        check_base_kwargs(kwargs)

    # ------------------------------------------------------------------ environment
    def _setup_env(self, *, randomness: Mapping[str, Any] | None = None, **env: Any) -> None:
        """Launcher, process group, multiprocessing, cuDNN, file limit
        (:func:`~shardwise.strategies.building.set_up_environment`), then randomness."""
        self._launcher, self._distributed, self._timestamp = set_up_environment(**env)
        self._set_randomness(**(randomness or {}))

    def _set_randomness(
        self, seed: int | None = None, diff_rank_seed: bool = False, deterministic: bool = False
    ) -> None:
        seed = set_random_seed(seed, deterministic=deterministic, diff_rank_seed=diff_rank_seed)
        self._randomness = dict(
            seed=seed, diff_rank_seed=diff_rank_seed, deterministic=deterministic
        )

    def build_logger(self, log_level: str | int = "INFO", log_file: str | None = None):
        """The run's logger: rank 0 on the console, every rank into ``log_dir``."""
        log_file = log_file or str(self._log_dir / f"{self._timestamp}.log")
        return get_logger("shardwise", log_file=log_file, log_level=log_level)

    @property
    def work_dir(self) -> str:
        return str(self._work_dir)

    @property
    def log_dir(self) -> str:
        return str(self._log_dir)

    @property
    def experiment_name(self) -> str:
        return self._experiment_name

    @property
    def launcher(self) -> str:
        return self._launcher

    @property
    def distributed(self) -> bool:
        return self._distributed

    @property
    def seed(self) -> int:
        return self._randomness["seed"]

    @property
    def rank(self) -> int:
        return dist.get_rank()

    @property
    def world_size(self) -> int:
        return dist.get_world_size()

    @property
    def data_parallel_rank(self) -> int:
        """Which share of the data this rank reads (tensor-parallel peers read the same)."""
        return self.rank

    @property
    def data_parallel_size(self) -> int:
        return self.world_size

    @property
    def timestamp(self) -> str:
        return self._timestamp

    @property
    def randomness(self) -> dict[str, Any]:
        return dict(self._randomness)

    @property
    def device(self) -> torch.device:
        """The device this rank trains on: its CUDA device when CUDA is available, else CPU."""
        return dist.get_device()

    def collect_env(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(system_env, runtime_env)``: the machine, and how this strategy set it up."""
        runtime_env = {
            **self._env_kwargs,
            **self._randomness,
            "Distributed launcher": self.launcher,
            "Distributed training": self.distributed,
            "World size": self.world_size,
            "Strategy": type(self).__name__,
        }
        return collect_env(), runtime_env

    # ------------------------------------------------------------------ prepare
    def prepare(
        self,
        model: nn.Module | Mapping[str, Any],
        *,
        optim_wrapper: Any = None,
        param_scheduler: Any = None,
        compile: bool | Mapping[str, Any] = False,
        dispatch_kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        """Build, initialise, wrap and compile the model; build its optimizer wrapper and
        schedulers. Returns ``model``, ``[model, optim_wrapper]`` or
        ``[model, optim_wrapper, param_schedulers]``. Calling it again returns the same
        objects.

        ``dispatch_kwargs`` carries what the training loop knows: ``max_iters``,
        ``max_epochs``, ``epoch_length``, ``train_micro_batch_size_per_gpu``.
        """
        if self._prepared:
            return self._prepared_components()
        self._check_prepare_args(model, optim_wrapper, param_scheduler, dispatch_kwargs)
        self.dispatch_kwargs.update(dispatch_kwargs or {})
        model = self.build_model(model)
        model = self._init_model_weights(model)
        model = self._wrap_model(model, compile)
        self.model = model
        if optim_wrapper is not None:
            self.optim_wrapper = self.build_optim_wrapper(optim_wrapper, model)
            self._scale_lr()
            self._initialize_accumulation()
        if param_scheduler is not None:
            self.param_schedulers = self.build_param_scheduler(param_scheduler, self.optim_wrapper)
        self._register_states()
        if self._memory_checkpoint is not None:
            attach_memory_tier(self._checkpointer, self._memory_checkpoint, self.world_size)
        self._prepared = True
        return self._prepared_components()

    def _check_prepare_args(
        self,
        model: Any,
        optim_wrapper: Any,
        param_scheduler: Any,
        dispatch_kwargs: Mapping[str, Any] | None,
    ) -> None:
        """Refuse bad input before anything is built (sharding strategies add theirs)."""
        dispatch = {**self.dispatch_kwargs, **(dispatch_kwargs or {})}
        check_prepare_args(model, optim_wrapper, param_scheduler, dispatch, self._auto_scale_lr)

    def _prepared_components(self) -> Any:
        items: list[Any] = [self.model]
        if hasattr(self, "optim_wrapper"):
            items.append(self.optim_wrapper)
        if hasattr(self, "param_schedulers"):
            items.append(self.param_schedulers)
        return items[0] if len(items) == 1 else items

    def build_model(self, model: nn.Module | Mapping[str, Any]) -> nn.Module:
        """Return ``model`` itself, or build it from a config through ``MODELS``."""
        return build_model(model)

    def compile_model(self, model: nn.Module, compile: bool | Mapping[str, Any] = False):
        """``torch.compile`` the model's ``target`` method (``forward`` by default):
        ``compile=True`` with torch's defaults, or a dict of ``target`` and the keyword
        arguments of ``torch.compile`` (``backend``, ``mode``, ``dynamic``, ...)."""
        return compile_model(model, compile, self.logger)

    def _init_model_weights(self, model: nn.Module) -> nn.Module:
        """Run ``init_weights()`` when the model has it; then every rank takes rank 0's
        parameters and buffers so that all ranks start from the same weights."""
        if hasattr(model, "init_weights") and self.dispatch_kwargs.get(
            "init_weights_for_test_or_val", True
        ):
            model.init_weights()
        if self.world_size > 1:
            for tensor in model.state_dict().values():
                dist.broadcast(tensor, src=0)
        return model

    def _wrap_model(self, model: nn.Module, compile: Any = False) -> nn.Module:
        """Place, wrap and compile (:meth:`compile_model`) the model for this strategy."""
        raise NotImplementedError

    def build_optim_wrapper(self, optim_wrapper: Any, model: nn.Module | None = None) -> Any:
        """Build an optimizer wrapper from an object or a config.

        Accepted: an ``OptimWrapper``/``OptimWrapperDict``; a ``torch.optim.Optimizer``;
        ``dict(optimizer=...)`` (``type`` defaults to ``'OptimWrapper'``; ``constructor`` and
        ``paramwise_cfg`` as in mmengine); or a multi-optimizer dict whose values are
        optimizer wrappers, or configs built against the submodule of the same name
        (``dict(generator=dict(optimizer=...), discriminator=dict(optimizer=...))``).
        ``model`` defaults to the prepared model; built wrappers and optimizers need none, so a
        dict of built wrappers gives an ``OptimWrapperDict`` before ``prepare`` too.

        Examples:
            >>> strategy.build_optim_wrapper(dict(type='OptimWrapper',
            ...                                   optimizer=dict(type='SGD', lr=0.01)), model)
            >>> strategy.build_optim_wrapper(dict(optimizer=dict(type='SGD', lr=0.01)), model)
            >>> strategy.build_optim_wrapper(dict(generator=OptimWrapper(gen_optimizer),
            ...                                   discriminator=OptimWrapper(disc_optimizer)))
        """
        if model is None:  # before prepare there is no model: built wrappers need none
            model = getattr(self, "model", None)
        model = None if model is None else unwrap_model(model)
        if isinstance(optim_wrapper, OptimWrapper | OptimWrapperDict):
            return optim_wrapper
        built = {
            name: build_wrapper_part(name, part, model)
            for name, part in optim_wrapper_parts(optim_wrapper).items()
        }
        return built[SINGLE] if SINGLE in built else OptimWrapperDict(**built)

    def _wrappers(self) -> dict[str, OptimWrapper]:
        return optim_wrapper_parts(self.optim_wrapper)

    def _scale_lr(self) -> None:
        """``auto_scale_lr``: every LR times data-parallel size x batch per rank / base."""
        if self._auto_scale_lr and self._auto_scale_lr.get("enable", False):
            real = self.data_parallel_size * self.dispatch_kwargs["train_micro_batch_size_per_gpu"]
            base = self._auto_scale_lr["base_batch_size"]
            scale_lr(self._wrappers(), base, real, self.logger)

    def _initialize_accumulation(self, cur_iter: int = 0, max_iters: int | None = None) -> None:
        """Tell wrappers that accumulate gradients where the run is (``max_iters``: from
        ``dispatch_kwargs`` by default), so that the last, incomplete window is scaled."""
        for wrapper in self._wrappers().values():
            if getattr(wrapper, "_accumulative_counts", 1) > 1:
                total = self.dispatch_kwargs["max_iters"] if max_iters is None else max_iters
                wrapper.initialize_count_status(self.model, cur_iter, total)

    def build_param_scheduler(
        self, scheduler: Any, optim_wrapper: Any = None, default_args: Mapping | None = None
    ) -> list[_ParamScheduler] | dict[str, list[_ParamScheduler]]:
        """Build parameter schedulers: a list for one optimizer, a dict of lists (one per
        optimizer name) for an ``OptimWrapperDict``.

        ``default_args`` (mmengine's): ``max_epochs`` / ``max_iters`` end a config without
        ``end`` (``by_epoch=True`` / ``False``), ``epoch_length`` converts a config with
        ``convert_to_iter_based=True``, and any other entry is a default argument of every
        scheduler built. None takes the first three from ``dispatch_kwargs``. Pre-built
        scheduler objects are kept as they are.

        Examples:
            >>> strategy.build_param_scheduler(dict(type='MultiStepLR', milestones=[1, 2]))
            >>> strategy.build_param_scheduler([dict(type='MultiStepLR', milestones=[1, 2]),
            ...                                 dict(type='StepLR', step_size=1)])
            >>> strategy.build_param_scheduler(
            ...     dict(type='LinearLR', by_epoch=True, convert_to_iter_based=True),
            ...     strategy.optim_wrapper, default_args=dict(max_epochs=2, epoch_length=10))
        """
        if optim_wrapper is None:
            optim_wrapper = getattr(self, "optim_wrapper", None)
        if optim_wrapper is None:
            raise RuntimeError(
                "build_param_scheduler needs an optimizer wrapper: build it first with "
                "build_optim_wrapper() or pass optim_wrapper to prepare()"
            )
        if default_args is None:
            keys = ("max_epochs", "max_iters", "epoch_length")
            default_args = {k: self.dispatch_kwargs[k] for k in keys if k in self.dispatch_kwargs}
        return build_schedulers(scheduler, optim_wrapper, default_args, self._adopt_scheduler)

    def _adopt_scheduler(self, scheduler: _ParamScheduler, optim_wrapper: Any) -> _ParamScheduler:
        """A pre-built scheduler as kept (a sharding strategy rebinds it to its optimizer)."""
        return scheduler

    # ------------------------------------------------------------------ state
    def _state_dict_options(self, **overrides: Any) -> StateDictOptions:
        """How this strategy's state is taken: here full tensors on the CPU."""
        return StateDictOptions(**{**_FULL.__dict__, **overrides})

    def _load_options(self, state: Any) -> StateDictOptions:
        """How ``state`` (model or per-parameter optimizer state) is put back."""
        return self._state_dict_options()

    def _offload(self, state: Any) -> Any:
        """What is done to a state dict once taken (here nothing)."""
        return state

    def _checkpoint_layout(self) -> Layout:
        """What the Checkpointer is told: the format saves write (here :data:`FULL`), read
        whole onto plain tensors."""
        return Layout(FULL, device=self.device, rank=self.rank)
