"""The Runner: builds everything a config describes and drives training, validation and
testing.

It is mmengine's ``FlexibleRunner``, trimmed: the strategy owns processes, devices,
wrapping and checkpoints; the runner owns the data, the loops and the hooks. The hooks are
called as mmengine's ``Runner`` calls them: ``before_run``, then the checkpoint is loaded
(``after_load_checkpoint``), then the loop (see :class:`~shardwise.runner.hooks.Hook`).

Example::

    runner = Runner.from_cfg(Config.fromfile('examples/digits_ddp.py'))
    runner.train()

or with objects::

    runner = Runner(
        model=MyNet(),
        work_dir='work_dirs/demo',
        train_dataloader=dict(dataset=dict(type='MyDataset'), batch_size=32),
        optim_wrapper=dict(optimizer=dict(type='AdamW', lr=1e-3)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
    )
    runner.train()

The model's own ``train_step(data, optim_wrapper)``, ``val_step(data)`` and
``test_step(data)`` run when it has them (mmengine's ``BaseModel``: an OpenMMLab package's
model, with its ``data_preprocessor``, found through the config's ``default_scope``; see
:mod:`shardwise.integrations.openmmlab`). Otherwise the default
step calls the model with the batch (``model(*batch)`` for a tuple or list,
``model(**batch)`` for a dict) and, in training, back-propagates the sum of the returned
entries whose key contains ``'loss'``.

``runner.compat`` is the run's compatibility policy, chosen once when the Runner is built
(:func:`~shardwise.integrations.openmmlab_compat.compat_for`): what the Runner does where
mmengine's Runner could differ (collate, worker seeding, evaluator, the random draws where a
DataLoader iterator opens, the config a visualizer records, log hand-over).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn as nn

import shardwise
from shardwise.config import Config, redact_secrets
from shardwise.integrations.openmmlab_compat import PlainRun, compat_for
from shardwise.registry import RUNNERS, init_default_scope
from shardwise.strategies import BaseStrategy
from shardwise.visualization import Visualizer

from .building import (
    build_eval_loop,
    build_log_processor,
    build_strategy,
    build_train_loop,
    build_visualizer,
    dump_config,
    runner_kwargs,
    with_data_preprocessor,
)
from .checkpoints import RunnerCheckpoints
from .checks import check_components, check_config
from .data import build_dataloader
from .hooks import Hook
from .hooks.defaults import DEFAULT_HOOKS, merge_default_hooks
from .hooks.hook_list import HookList
from .log_processor import LogProcessor
from .loops import EpochBasedTrainLoop, IterBasedTrainLoop, TestLoop, ValLoop
from .message_hub import MessageHub
from .priority import Priority
from .run_globals import creating_run_globals, restoring_globals
from .steps import eval_step, parse_losses, train_step

__all__ = ["Runner", "parse_losses", "DEFAULT_HOOKS"]


@RUNNERS.register_module()
class Runner(RunnerCheckpoints):
    """Trains, validates and tests a model under a strategy; see the module docstring.

    Args:
        model: an ``nn.Module`` or a ``MODELS`` config (built by the strategy).
        work_dir: checkpoints, ``last_checkpoint`` and the per-run log directory go here.
        strategy: a strategy or its config; default ``DDPStrategy`` under a launcher or in an
            initialised process group of several ranks, else ``SingleDeviceStrategy``.
        train_dataloader, val_dataloader: ``DataLoader`` objects or configs (see
            :func:`~shardwise.runner.data.build_dataloader`).
        optim_wrapper, param_scheduler: objects or configs, built by the strategy.
        train_cfg: ``dict(by_epoch=True, max_epochs=N)`` or ``dict(by_epoch=False,
            max_iters=N)`` (or a ``type`` from ``LOOPS``), plus ``val_begin``, ``val_interval``.
        val_cfg: ``ValLoop`` options (``fp16``) or a ``type`` from ``LOOPS``; val_evaluator:
            metrics (see :class:`~shardwise.runner.evaluator.Evaluator`).
        test_dataloader, test_cfg, test_evaluator: the same for :meth:`test` (``TestLoop``).
        default_hooks: merged by name into :data:`DEFAULT_HOOKS`; ``None`` removes one.
            (A config's ``preemption=dict(signals=..., requeue=...)`` gives the options of
            the ``preemption`` hook, :class:`~shardwise.runner.hooks.PreemptionHook`.)
        custom_hooks: more hooks (objects or ``HOOKS`` configs).
        load_from: load these weights before training (or resume from them with
            ``resume=True``).
        resume: ``True`` resumes from the latest committed checkpoint in ``work_dir`` (or from
            ``load_from``); a path resumes from that checkpoint.
        launcher, env_cfg, randomness, log_level, auto_scale_lr, experiment_name: passed to
            the strategy (``env_kwargs``, ``log_kwargs``...).
        compile: ``torch.compile`` the model (``True`` or a dict of options).
        cfg: the whole config, recorded in checkpoints and dumped into ``work_dir``.
        visualizer: a :class:`~shardwise.visualization.Visualizer` or its config
            (mmengine's ``dict(type='Visualizer', vis_backends=[...])``): the trackers that
            receive the config and the logged scalars, under ``<log_dir>/vis_data``. Default:
            none (the JSON-lines log and TensorBoard of ``LoggerHook`` only).
        log_processor: a :class:`~shardwise.runner.LogProcessor` or its options
            (mmengine's ``dict(window_size=10, by_epoch=True, custom_cfg=[...])``), as
            ``runner.log_processor``: how ``LoggerHook`` smooths and formats the values.
        default_scope: where unprefixed ``type`` names resolve first, made current (an
            OpenMMLab package's: ``'mmpretrain'``); data_preprocessor: the model config's.
    """

    @creating_run_globals
    def __init__(
        self,
        model: nn.Module | Mapping[str, Any],
        *,
        work_dir: str | os.PathLike[str] = "work_dirs",
        experiment_name: str | None = None,
        strategy: BaseStrategy | Mapping[str, Any] | None = None,
        train_dataloader: Any = None,
        optim_wrapper: Any = None,
        param_scheduler: Any = None,
        train_cfg: Mapping[str, Any] | None = None,
        val_dataloader: Any = None,
        val_cfg: Mapping[str, Any] | None = None,
        val_evaluator: Any = None,
        test_dataloader: Any = None,
        test_cfg: Mapping[str, Any] | None = None,
        test_evaluator: Any = None,
        default_hooks: Mapping[str, Any] | None = None,
        custom_hooks: Sequence[Any] | None = None,
        load_from: str | os.PathLike[str] | None = None,
        resume: bool | str | os.PathLike[str] = False,
        launcher: str | None = None,
        env_cfg: Mapping[str, Any] | None = None,
        log_level: str | int = "INFO",
        randomness: Mapping[str, Any] | None = None,
        auto_scale_lr: Mapping[str, Any] | None = None,
        compile: bool | Mapping[str, Any] = False,
        cfg: Config | Mapping[str, Any] | None = None,
        visualizer: Visualizer | Mapping[str, Any] | None = None,
        log_processor: LogProcessor | Mapping[str, Any] | None = None,
        default_scope: str | None = None,
        data_preprocessor: Mapping[str, Any] | nn.Module | None = None,
    ) -> None:
        if default_scope is not None:
            init_default_scope(default_scope)  # its package's names resolve first
        model = with_data_preprocessor(model, data_preprocessor)
        check_components(
            model=model,
            train_dataloader=train_dataloader,
            optim_wrapper=optim_wrapper,
            train_cfg=train_cfg,
            val_dataloader=val_dataloader,
            val_evaluator=val_evaluator,
            val_cfg=val_cfg,
            test_dataloader=test_dataloader,
            test_evaluator=test_evaluator,
            test_cfg=test_cfg,
            load_from=load_from,
            resume=resume,
        )
        self.compat: PlainRun = compat_for(default_scope)
        self.cfg = cfg if isinstance(cfg, Config) else Config(dict(cfg or {}))
        self._model_cfg = model
        self._train_dataloader_cfg = train_dataloader
        self._optim_wrapper_cfg = optim_wrapper
        self._param_scheduler_cfg = param_scheduler
        self._train_cfg = dict(train_cfg) if train_cfg is not None else None
        self._val_dataloader_cfg = val_dataloader
        self._val_cfg = dict(val_cfg) if val_cfg is not None else None
        self._val_evaluator_cfg = val_evaluator
        self._test_dataloader_cfg = test_dataloader
        self._test_cfg = dict(test_cfg) if test_cfg is not None else None
        self._test_evaluator_cfg = test_evaluator
        self._init_checkpoints(load_from, resume)
        self._compile = compile

        self.strategy = self.build_strategy(
            strategy,
            work_dir=work_dir,
            experiment_name=experiment_name,
            launcher=launcher,
            env_cfg=env_cfg,
            randomness=randomness,
            log_level=log_level,
            auto_scale_lr=auto_scale_lr,
        )
        self.logger = self.strategy.logger
        self.message_hub = MessageHub()
        self.visualizer = self.build_visualizer(visualizer)
        self.log_processor = self.build_log_processor(log_processor)
        self.model: nn.Module | None = None
        self.optim_wrapper: Any = None
        self.param_schedulers: Any = None
        self.train_dataloader: Any = None
        self.val_dataloader: Any = None
        self.test_dataloader: Any = None
        self._train_loop: EpochBasedTrainLoop | IterBasedTrainLoop | None = None
        self.val_loop: ValLoop | None = None
        self.test_loop: TestLoop | None = None
        self._hooks = HookList()
        self.register_hooks(default_hooks, custom_hooks)
        self.logger.info(
            "shardwise %s, torch %s: %s on %d rank(s) (launcher %s, device %s, seed %d); "
            "work_dir %s",
            shardwise.__version__,
            torch.__version__,
            type(self.strategy).__name__,
            self.world_size,
            self.strategy.launcher,
            self.strategy.device,
            self.seed,
            self.work_dir,
        )
        recorded = redact_secrets(self.cfg)  # the config as written anywhere: no secrets
        if self.rank == 0 and len(recorded):
            dump_config(recorded, self.work_dir, self.timestamp)
        if len(recorded):
            self.visualizer.add_config(self.compat.recorded_config(recorded, self.visualizer))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_cfg(cls, cfg: Config | Mapping[str, Any]) -> Runner:
        """Build a runner from a config (mmengine's keys; see the class docstring).

        Bad input (no ``model``, a training loop without ``max_epochs``/``max_iters``, a
        ``val_interval`` without ``val_dataloader``, ``test_dataloader`` without
        ``test_evaluator``...) is refused before anything is built.
        """
        cfg = copy.deepcopy(cfg if isinstance(cfg, Config) else Config(dict(cfg)))
        cls.check_cfg(cfg)
        return cls(**runner_kwargs(cfg))

    #: Refuse a config that cannot train, naming the key, the value, what was expected and the
    #: fix (:func:`~shardwise.runner.checks.check_config`; ``world_size``, ``local_world_size``:
    #: the run's to be launched, ``strict_keys``). Side-effect free: ``shardwise train`` runs it
    #: before launching processes.
    check_cfg = staticmethod(check_config)

    def build_strategy(self, strategy: Any, **runner_settings: Any) -> BaseStrategy:
        """The strategy, or one built from its config with the runner's settings as defaults
        (:func:`~shardwise.runner.building.build_strategy`)."""
        return build_strategy(strategy, **runner_settings)

    def build_log_processor(self, log_processor: Any) -> LogProcessor:
        """The log processor, or one built from its options (``LOG_PROCESSORS``)."""
        return build_log_processor(log_processor)

    def build_visualizer(self, visualizer: Visualizer | Mapping[str, Any] | None) -> Visualizer:
        """The visualizer, or one built from its config (the experiment name and the log
        directory as defaults; :func:`~shardwise.runner.building.build_visualizer`)."""
        return build_visualizer(
            visualizer, name=self.experiment_name, save_dir=self.log_dir, logger=self.logger
        )

    # ------------------------------------------------------------------ hooks
    @property
    def hooks(self) -> list[Hook]:
        """The registered hooks, in the order they are called."""
        return list(self._hooks)

    def register_hook(
        self, hook: Hook | Mapping[str, Any], priority: int | str | Priority | None = None
    ) -> None:
        """Insert a hook (object or ``HOOKS`` config) by priority; among equal priorities,
        hooks run in the order they were registered."""
        self._hooks.add(hook, priority)

    def register_hooks(
        self,
        default_hooks: Mapping[str, Any] | None = None,
        custom_hooks: Sequence[Any] | None = None,
    ) -> None:
        """Register :data:`DEFAULT_HOOKS` merged with ``default_hooks``, then ``custom_hooks``."""
        for hook in [*merge_default_hooks(default_hooks).values(), *(custom_hooks or [])]:
            self._hooks.add(hook)

    def call_hook(self, fn_name: str, **kwargs: Any) -> None:
        """Call ``fn_name(self, **kwargs)`` on every hook that has it, in priority order."""
        self._hooks.call(self, fn_name, **kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def work_dir(self) -> str:
        return self.strategy.work_dir

    @property
    def log_dir(self) -> str:
        return self.strategy.log_dir

    @property
    def timestamp(self) -> str:
        return self.strategy.timestamp

    @property
    def experiment_name(self) -> str:
        return self.strategy.experiment_name

    @property
    def rank(self) -> int:
        return self.strategy.rank

    @property
    def world_size(self) -> int:
        return self.strategy.world_size

    @property
    def seed(self) -> int:
        return self.strategy.seed

    @property
    def train_loop(self) -> EpochBasedTrainLoop | IterBasedTrainLoop | None:
        """The training loop: built (with its dataloader) on first use when the runner has a
        training config, as mmengine's ``Runner.train_loop`` is; None without one. Building
        it starts no collective, so any rank may be the first to ask."""
        if self._train_loop is None and self._train_cfg is not None:
            if self.train_dataloader is None:
                self.train_dataloader = self._build_dataloader(
                    self._train_dataloader_cfg, shuffle=True
                )
            self._train_loop = self.build_train_loop()
        return self._train_loop

    @train_loop.setter
    def train_loop(self, loop: EpochBasedTrainLoop | IterBasedTrainLoop | None) -> None:
        self._train_loop = loop

    @property
    def epoch(self) -> int:
        return self.train_loop.epoch if self.train_loop is not None else 0

    @property
    def iter(self) -> int:
        return self.train_loop.iter if self.train_loop is not None else 0

    @property
    def max_epochs(self) -> int:
        return self.train_loop.max_epochs if self.train_loop is not None else 0

    @property
    def max_iters(self) -> int:
        return self.train_loop.max_iters if self.train_loop is not None else 0

    @property
    def val_evaluator(self) -> Any:
        """The validation loop's evaluator (None before the loop is built)."""
        return getattr(self.val_loop, "evaluator", None)

    @property
    def test_evaluator(self) -> Any:
        """The test loop's evaluator (None before the loop is built)."""
        return getattr(self.test_loop, "evaluator", None)

    # ------------------------------------------------------------------ building the run
    def _build_dataloader(self, cfg: Any, *, shuffle: bool) -> Any:
        """A dataloader whose sampler splits the data over the data-parallel ranks
        (tensor-parallel peers read the same batches)."""
        return build_dataloader(
            cfg,
            seed=self._data_seed(),
            shuffle=shuffle,
            num_replicas=self.strategy.data_parallel_size,
            rank=self.strategy.data_parallel_rank,
            worker_seed=self.seed,
            compat=self.compat,
        )

    def _data_seed(self) -> int:
        """One seed for every rank's sampler: rank 0's, also with ``diff_rank_seed`` (which
        adds the rank to rank 0's seed; computed here, without a collective)."""
        seed = self.seed
        if self.strategy.randomness.get("diff_rank_seed"):
            seed -= self.rank
        return int(seed)

    def build_train_loop(self) -> EpochBasedTrainLoop | IterBasedTrainLoop:
        """The training loop from ``train_cfg`` (``type``, or ``by_epoch`` to choose)."""
        return build_train_loop(self, self._train_cfg, self.train_dataloader)

    def build_val_loop(self) -> ValLoop:
        """The validation loop from ``val_cfg`` and ``val_evaluator``."""
        cfg, evaluator = self._val_cfg, self._val_evaluator_cfg
        return build_eval_loop(self, ValLoop, cfg, self.val_dataloader, evaluator)

    def build_test_loop(self) -> TestLoop:
        """The test loop from ``test_cfg`` and ``test_evaluator``."""
        cfg, evaluator = self._test_cfg, self._test_evaluator_cfg
        return build_eval_loop(self, TestLoop, cfg, self.test_dataloader, evaluator)

    def _build_val(self) -> None:
        if self._val_dataloader_cfg is None or self.val_loop is not None:
            return
        self.val_dataloader = self._build_dataloader(self._val_dataloader_cfg, shuffle=False)
        self.val_loop = self.build_val_loop()

    def _build_test(self) -> None:
        if self.test_loop is not None:
            return
        self.test_dataloader = self._build_dataloader(self._test_dataloader_cfg, shuffle=False)
        self.test_loop = self.build_test_loop()

    def _prepare_model(self) -> None:
        """For ``val()`` and ``test()``: the model, built and wrapped by the strategy (the
        trained one after ``train()``); its ``init_weights()`` runs unless the config sets
        ``init_weights_for_test_or_val=False``."""
        self.compat.hand_over_logs(self.log_dir, self.timestamp, self.logger)
        init_weights = self.cfg.get("init_weights_for_test_or_val", True)
        dispatch = dict(init_weights_for_test_or_val=init_weights)
        prepared = self.strategy.prepare(
            self._model_cfg, compile=self._compile, dispatch_kwargs=dispatch
        )
        self.model = prepared[0] if isinstance(prepared, list) else prepared

    # ------------------------------------------------------------------ train / val / test
    @restoring_globals
    def train(self) -> nn.Module:
        """Train as configured; returns the (wrapped) model."""
        if self._train_cfg is None:
            raise RuntimeError(
                "Runner.train() needs train_dataloader, train_cfg and optim_wrapper; this runner "
                "was built without them"
            )
        loop = self.train_loop  # built here unless a hook or the user has asked for it before
        self._build_val()
        self.compat.hand_over_logs(self.log_dir, self.timestamp, self.logger)
        dispatch = dict(
            max_iters=loop.max_iters,
            max_epochs=loop.max_epochs,
            epoch_length=loop.epoch_length,
        )
        if getattr(self.train_dataloader, "batch_size", None) is not None:
            dispatch["train_micro_batch_size_per_gpu"] = self.train_dataloader.batch_size
        prepared = self.strategy.prepare(
            self.compat.model_to_prepare(self._model_cfg, loop, self.strategy.build_model),
            optim_wrapper=self._optim_wrapper_cfg,
            param_scheduler=self._param_scheduler_cfg,
            compile=self._compile,
            dispatch_kwargs=dispatch,
        )
        if not isinstance(prepared, list):
            raise RuntimeError(
                "Runner.train() after val() or test() on the same runner: the strategy has "
                "prepared the model without its optimizer; train first, or train with a new "
                "Runner"
            )
        self.model, self.optim_wrapper = prepared[0], prepared[1]
        self.param_schedulers = prepared[2] if len(prepared) > 2 else None
        self._run(self._run_train_loop)
        return self.model

    def _run_train_loop(self) -> None:
        self._initialize_accumulation()
        self.train_loop.run()

    @restoring_globals
    def val(self) -> dict[str, Any]:
        """One validation pass (after loading the checkpoint ``load_from`` or ``resume``
        names); returns the metrics."""
        if self._val_dataloader_cfg is None:
            raise RuntimeError(
                "Runner.val() needs val_dataloader and val_evaluator; this runner was built "
                "without them"
            )
        self._build_val()
        self._prepare_model()
        return self._run(self.val_loop.run)

    @restoring_globals
    def test(self) -> dict[str, Any]:
        """One pass over the test data (after loading the checkpoint ``load_from`` or
        ``resume`` names); returns the metrics.

        Example::

            runner = Runner.from_cfg(cfg)   # with test_dataloader, test_evaluator, load_from
            metrics = runner.test()
        """
        if self._test_dataloader_cfg is None:
            raise RuntimeError(
                "Runner.test() needs test_dataloader and test_evaluator; this runner was built "
                "without them"
            )
        self._build_test()
        self._prepare_model()
        return self._run(self.test_loop.run)

    def _run(self, loop: Callable[[], Any]) -> Any:
        """mmengine's frame around a loop: ``before_run``, the checkpoint loaded (its
        ``after_load_checkpoint``), the loop, ``after_run``. On an error the hooks release
        what they hold."""
        self.call_hook("before_run")
        try:
            self.load_or_resume()
            result = loop()
            self.strategy.wait_for_checkpoint()
        except BaseException:
            self._hooks.close(self.visualizer)
            raise
        self.call_hook("after_run")
        self.visualizer.close()
        return result

    def _initialize_accumulation(self) -> None:
        self.strategy._initialize_accumulation(self.iter, self.max_iters)

    # ------------------------------------------------------------------ steps
    def train_step(self, data: Any) -> dict[str, torch.Tensor]:
        """One optimisation step on ``data`` (:func:`~shardwise.runner.steps.train_step`);
        returns the logged values (``loss``...), averaged over ranks, as 0-dim tensors."""
        pipeline = getattr(self.strategy, "pipeline", None)
        return train_step(self.model, self.optim_wrapper, data, self.strategy.device, pipeline)

    def val_step(self, data: Any) -> Any:
        """The model's outputs for one validation batch (its ``val_step`` when it has one)."""
        return eval_step(self.model, "val_step", data, self.strategy.device)

    def test_step(self, data: Any) -> Any:
        """The model's outputs for one test batch (its ``test_step`` when it has one)."""
        return eval_step(self.model, "test_step", data, self.strategy.device)
