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
``test_step(data)`` run when it has them (mmengine's ``BaseModel``). Otherwise the default
step calls the model with the batch (``model(*batch)`` for a tuple or list,
``model(**batch)`` for a dict) and, in training, back-propagates the sum of the returned
entries whose key contains ``'loss'``.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

import shardwise
from shardwise import dist, launch_env
from shardwise.checkpoint import find_last_checkpoint
from shardwise.config import Config
from shardwise.optim import OptimWrapperDict
from shardwise.registry import HOOKS, LOG_PROCESSORS, LOOPS, RUNNERS, STRATEGIES, VISUALIZERS
from shardwise.strategies import BaseStrategy
from shardwise.strategies.base import unwrap_model
from shardwise.visualization import Visualizer

from .checks import check_components, check_config
from .data import build_dataloader
from .evaluator import build_evaluator
from .hooks import Hook
from .hooks.defaults import DEFAULT_HOOKS, merge_default_hooks, with_preemption
from .log_processor import LogProcessor
from .loops import EpochBasedTrainLoop, IterBasedTrainLoop, TestLoop, ValLoop
from .message_hub import MessageHub
from .priority import Priority, get_priority

__all__ = ["Runner", "parse_losses", "DEFAULT_HOOKS"]

logger = logging.getLogger(__name__)


@RUNNERS.register_module()
class Runner:
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
    """

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
    ) -> None:
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
        self._load_from = None if load_from is None else str(load_from)
        self._resume = resume
        self._has_loaded = False
        self._warned_fresh = False  # a run from scratch over committed checkpoints, said once
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
        self._hooks: list[Hook] = []
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
        self._dump_config()
        if len(self.cfg):
            self.visualizer.add_config(self.cfg)

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
        return cls(
            model=cfg["model"],
            work_dir=cfg.get("work_dir", "work_dirs"),
            experiment_name=cfg.get("experiment_name"),
            strategy=cfg.get("strategy"),
            train_dataloader=cfg.get("train_dataloader"),
            optim_wrapper=cfg.get("optim_wrapper"),
            param_scheduler=cfg.get("param_scheduler"),
            train_cfg=cfg.get("train_cfg"),
            val_dataloader=cfg.get("val_dataloader"),
            val_cfg=cfg.get("val_cfg"),
            val_evaluator=cfg.get("val_evaluator"),
            test_dataloader=cfg.get("test_dataloader"),
            test_cfg=cfg.get("test_cfg"),
            test_evaluator=cfg.get("test_evaluator"),
            default_hooks=with_preemption(cfg.get("default_hooks"), cfg.get("preemption")),
            custom_hooks=cfg.get("custom_hooks"),
            load_from=cfg.get("load_from"),
            resume=cfg.get("resume", False),
            launcher=cfg.get("launcher"),
            env_cfg=cfg.get("env_cfg"),
            log_level=cfg.get("log_level", "INFO"),
            randomness=cfg.get("randomness"),
            auto_scale_lr=cfg.get("auto_scale_lr"),
            compile=cfg.get("compile", False),
            cfg=cfg,
            visualizer=cfg.get("visualizer"),
            log_processor=cfg.get("log_processor"),
        )

    @staticmethod
    def check_cfg(
        cfg: Config | Mapping[str, Any],
        *,
        world_size: int | None = None,
        local_world_size: int | None = None,
    ) -> None:
        """Refuse a config that cannot train, naming the key, the value, what was expected
        and the fix (:func:`~shardwise.runner.checks.check_config`; the sizes are those of
        the run to be launched, default this process's).

        Cheap and side-effect free: ``shardwise train`` runs it before launching processes.
        """
        check_config(cfg, world_size=world_size, local_world_size=local_world_size)

    def build_strategy(
        self,
        strategy: BaseStrategy | Mapping[str, Any] | None,
        *,
        work_dir: str | os.PathLike[str],
        experiment_name: str | None,
        launcher: str | None,
        env_cfg: Mapping[str, Any] | None,
        randomness: Mapping[str, Any] | None,
        log_level: str | int,
        auto_scale_lr: Mapping[str, Any] | None,
    ) -> BaseStrategy:
        """The strategy object, or one built from its config with the runner's settings as
        defaults (``work_dir``, ``env_kwargs`` from ``env_cfg``/``launcher``/``randomness``,
        ``log_kwargs``, ``auto_scale_lr``)."""
        if isinstance(strategy, BaseStrategy):
            return strategy
        launcher_name = launcher or launch_env.infer_launcher()
        if strategy is None:
            several = launcher_name != "none" or dist.get_world_size() > 1  # an adopted group
            name = "DDPStrategy" if several else "SingleDeviceStrategy"
            strategy = dict(type=name)
        if not isinstance(strategy, Mapping):
            raise TypeError(
                f"strategy must be a strategy object or a config dict such as "
                f"dict(type='DDPStrategy'), got {type(strategy).__name__}: {strategy!r}"
            )
        cfg = dict(strategy)
        env, note = dist.env_kwargs_from_cfg(env_cfg)
        if randomness is not None:
            env["randomness"] = dict(randomness)
        if launcher is not None:
            env["launcher"] = launcher
        cfg["env_kwargs"] = {**env, **dict(cfg.get("env_kwargs") or {})}
        cfg.setdefault("work_dir", str(work_dir))
        if experiment_name is not None:
            cfg.setdefault("experiment_name", experiment_name)
        cfg.setdefault("log_kwargs", dict(log_level=log_level))
        if auto_scale_lr is not None:
            cfg.setdefault("auto_scale_lr", auto_scale_lr)
        built = STRATEGIES.build(cfg)
        if note:
            built.logger.warning(note)
        return built

    def build_log_processor(
        self, log_processor: LogProcessor | Mapping[str, Any] | None
    ) -> LogProcessor:
        """The log processor object, or one built from its options (``type`` optional, from
        ``LOG_PROCESSORS``; default ``LogProcessor``)."""
        if isinstance(log_processor, LogProcessor):
            return log_processor
        if log_processor is not None and not isinstance(log_processor, Mapping):
            raise TypeError(
                "log_processor must be a LogProcessor or its options such as "
                f"dict(window_size=10, by_epoch=True), got {type(log_processor).__name__}: "
                f"{log_processor!r}"
            )
        cfg = {"type": "LogProcessor", **dict(log_processor or {})}
        return LOG_PROCESSORS.build(cfg)

    def build_visualizer(self, visualizer: Visualizer | Mapping[str, Any] | None) -> Visualizer:
        """The visualizer object, or one built from its config with ``name`` (the experiment
        name) and ``save_dir`` (the log directory) as defaults; None: one without trackers.
        A ``type`` shardwise does not have (a task library's ``DetLocalVisualizer``...) is
        warned about and its ``vis_backends`` go to shardwise's ``Visualizer``."""
        if isinstance(visualizer, Visualizer):
            return visualizer
        if visualizer is None:
            return Visualizer(name=self.experiment_name)
        if not isinstance(visualizer, Mapping):
            raise TypeError(
                f"visualizer must be a Visualizer or a config such as dict(type='Visualizer', "
                f"vis_backends=[dict(type='LocalVisBackend')]), got {visualizer!r}"
            )
        cfg = dict(visualizer)
        cfg.setdefault("name", self.experiment_name)
        cfg.setdefault("save_dir", self.log_dir)
        kind = cfg.pop("type", "Visualizer")
        cls = VISUALIZERS.get(kind)
        if cls is None:
            self.logger.warning(
                "visualizer.type=%r is not in shardwise's VISUALIZERS (%s): its vis_backends "
                "go to shardwise's Visualizer, which records scalars and the config (no drawing)",
                kind,
                ", ".join(sorted(VISUALIZERS.module_dict)),
            )
            cls = Visualizer
        return cls(**cfg)

    def _dump_config(self) -> None:
        if self.rank != 0 or not len(self.cfg):
            return
        name = Path(self.cfg.filename).name if self.cfg.filename else f"{self.timestamp}.py"
        path = Path(self.work_dir) / name
        try:
            self.cfg.dump(path)
        except (TypeError, ValueError):  # objects in the config: keep a readable copy
            path.write_text(self.cfg.pretty_text, encoding="utf-8")

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
        if isinstance(hook, Mapping):
            cfg = dict(hook)
            priority = cfg.pop("priority", None) if priority is None else priority
            hook = HOOKS.build(cfg)
        elif not isinstance(hook, Hook):
            raise TypeError(
                f"a hook must be a Hook or a config dict with 'type', got {type(hook).__name__}"
            )
        if priority is not None:
            hook.priority = priority
        value = get_priority(hook.priority)
        index = len(self._hooks)
        while index > 0 and get_priority(self._hooks[index - 1].priority) > value:
            index -= 1
        self._hooks.insert(index, hook)

    def register_hooks(
        self,
        default_hooks: Mapping[str, Any] | None = None,
        custom_hooks: Sequence[Any] | None = None,
    ) -> None:
        """Register :data:`DEFAULT_HOOKS` merged with ``default_hooks``, then ``custom_hooks``."""
        for hook in merge_default_hooks(default_hooks).values():
            self.register_hook(hook)
        for hook in custom_hooks or []:
            self.register_hook(hook)

    def _close_hooks(self) -> None:
        """After a failure: let hooks release what they hold (files, progress bars), and end
        the trackers' runs."""
        for hook in [*self._hooks, self.visualizer]:
            close = getattr(hook, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - the original error matters more
                    logger.exception("closing %r failed", hook)

    def call_hook(self, fn_name: str, **kwargs: Any) -> None:
        """Call ``fn_name(self, **kwargs)`` on every hook that has it, in priority order
        (a ``TypeError`` names the hook: mostly a method whose signature is not the
        stage's)."""
        for hook in self._hooks:
            method = getattr(hook, fn_name, None)
            if method is None:
                continue
            try:
                method(self, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{exc} in {hook!r}.{fn_name}") from exc

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
        cfg = dict(self._train_cfg or {})
        loop_type = cfg.pop("type", None)
        by_epoch = cfg.pop("by_epoch", "max_epochs" in cfg)
        cfg.pop("dynamic_intervals", None)
        args = dict(runner=self, dataloader=self.train_dataloader)
        if loop_type is not None:
            return LOOPS.build({"type": loop_type, **cfg}, default_args=args)
        cls = EpochBasedTrainLoop if by_epoch else IterBasedTrainLoop
        return cls(**args, **cfg)

    def build_val_loop(self) -> ValLoop:
        """The validation loop from ``val_cfg`` and ``val_evaluator``."""
        return self._build_eval_loop(
            ValLoop, self._val_cfg, self.val_dataloader, self._val_evaluator_cfg
        )

    def build_test_loop(self) -> TestLoop:
        """The test loop from ``test_cfg`` and ``test_evaluator``."""
        return self._build_eval_loop(
            TestLoop, self._test_cfg, self.test_dataloader, self._test_evaluator_cfg
        )

    def _build_eval_loop(
        self, default: type, loop_cfg: Mapping[str, Any] | None, dataloader: Any, evaluator: Any
    ) -> Any:
        """A ``type`` from ``LOOPS`` named by ``loop_cfg``, else ``default``, with its
        options."""
        cfg = dict(loop_cfg or {})
        args = dict(runner=self, dataloader=dataloader, evaluator=build_evaluator(evaluator))
        if "type" in cfg:
            return LOOPS.build(cfg, default_args=args)
        return default(**args, **cfg)

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
        init_weights = self.cfg.get("init_weights_for_test_or_val", True)
        dispatch = dict(init_weights_for_test_or_val=init_weights)
        prepared = self.strategy.prepare(
            self._model_cfg, compile=self._compile, dispatch_kwargs=dispatch
        )
        self.model = prepared[0] if isinstance(prepared, list) else prepared

    # ------------------------------------------------------------------ train / val / test
    def train(self) -> nn.Module:
        """Train as configured; returns the (wrapped) model."""
        if self._train_cfg is None:
            raise RuntimeError(
                "Runner.train() needs train_dataloader, train_cfg and optim_wrapper; this runner "
                "was built without them"
            )
        loop = self.train_loop  # built here unless a hook or the user has asked for it before
        self._build_val()
        dispatch = dict(
            max_iters=loop.max_iters,
            max_epochs=loop.max_epochs,
            epoch_length=loop.epoch_length,
        )
        if getattr(self.train_dataloader, "batch_size", None) is not None:
            dispatch["train_micro_batch_size_per_gpu"] = self.train_dataloader.batch_size
        prepared = self.strategy.prepare(
            self._model_cfg,
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
            self._close_hooks()
            raise
        self.call_hook("after_run")
        self.visualizer.close()
        return result

    def _initialize_accumulation(self) -> None:
        self.strategy._initialize_accumulation(self.iter, self.max_iters)

    # ------------------------------------------------------------------ steps
    def train_step(self, data: Any) -> dict[str, torch.Tensor]:
        """One optimisation step on ``data``; returns the logged values (``loss``...),
        averaged over ranks, as 0-dim tensors."""
        own = _own_method(self.model, "train_step")
        if own is not None:
            outputs = own(data, optim_wrapper=self.optim_wrapper)
            log_vars = _check_log_vars(outputs)
        else:
            if isinstance(self.optim_wrapper, OptimWrapperDict):
                raise TypeError(
                    "the default train step updates one optimizer, but optim_wrapper holds "
                    f"several ({sorted(self.optim_wrapper.keys())}); define "
                    "train_step(data, optim_wrapper) on the model to update them"
                )
            data = _to_device(data, self.strategy.device)
            with self.optim_wrapper.optim_context(self.model):
                outputs = _call_model(self.model, data)
            loss, log_vars = parse_losses(outputs)
            self.optim_wrapper.update_params(loss)
        log_vars.update(self.optim_wrapper.get_log_vars())
        return _mean_over_ranks(log_vars)

    def val_step(self, data: Any) -> Any:
        """The model's outputs for one validation batch (its ``val_step`` when it has one)."""
        return self._eval_step("val_step", data)

    def test_step(self, data: Any) -> Any:
        """The model's outputs for one test batch (its ``test_step`` when it has one)."""
        return self._eval_step("test_step", data)

    def _eval_step(self, name: str, data: Any) -> Any:
        own = _own_method(self.model, name)
        if own is not None:
            return own(data)
        return _call_model(self.model, _to_device(data, self.strategy.device))

    # ------------------------------------------------------------------ checkpoints
    def _register_states(self) -> None:
        """Hand the runner's own state objects to the strategy's Checkpointer, after the
        strategy's (a resume restores the random state before the loop reseeds its sampler):
        the training loop's position (``meta``'s ``epoch``, ``iter``, ``epoch_length``; the
        data position follows from it) and the message hub."""
        checkpointer = self.strategy.checkpointer
        if self.optim_wrapper is not None:  # in train()
            checkpointer.register("loop", self.train_loop, meta=True)
        checkpointer.register("message_hub", self.message_hub, required=False)

    def load_or_resume(self) -> dict[str, Any] | None:
        """Resume or load weights as ``resume`` and ``load_from`` say (mmengine's rules),
        once per runner. Without a training loop (``val()``, ``test()``) the checkpoint a
        resume would pick gives its weights only."""
        if self._has_loaded:
            return None
        checkpoint = self.strategy.checkpointer.load_or_resume(
            load_from=self._load_from,
            resume=self._resume,
            weights_only=self.optim_wrapper is None,
            resume_with=self.resume,
            load_with=self.load_checkpoint,
        )
        self._has_loaded = checkpoint is not None
        if checkpoint is None and self.optim_wrapper is not None:
            self._warn_of_committed_checkpoints()
        return checkpoint

    def _warn_of_committed_checkpoints(self) -> None:
        """A run from scratch (no ``resume``, no ``load_from``) in a work_dir that holds
        committed checkpoints: one warning, on rank 0, naming the newest and ``--resume``."""
        if self._warned_fresh or self._resume or self._load_from is not None or self.rank != 0:
            return
        self._warned_fresh = True
        newest = find_last_checkpoint(self.work_dir)
        if newest is not None:
            self.logger.warning(
                "%s holds committed checkpoints (the newest: %s) and this run starts from "
                "scratch: pass --resume (resume=True) to continue from the newest, --load-from "
                "(load_from) for its weights only, or another work_dir",
                self.work_dir,
                newest,
            )

    def resume(self, filename: str | os.PathLike[str]) -> dict[str, Any]:
        """Restore model, optimizer, schedulers, RNG states, the loop position and the
        message hub from a checkpoint."""
        self._register_states()
        return self.strategy.checkpointer.resume(filename, callback=self._after_load_callback())

    def load_checkpoint(self, filename: str | os.PathLike[str], **kwargs: Any) -> dict[str, Any]:
        """Load the model weights of a checkpoint (``strict``, ``revise_keys``,
        ``map_location`` as the strategy's ``load_checkpoint``)."""
        return self.strategy.checkpointer.load(
            filename, callback=self._after_load_callback(), **kwargs
        )

    def _before_save_callback(self, checkpoint: dict[str, Any]) -> None:
        self.call_hook("before_save_checkpoint", checkpoint=checkpoint)

    def _after_load_callback(self) -> Callable[[dict[str, Any]], None]:
        return lambda checkpoint: self.call_hook("after_load_checkpoint", checkpoint=checkpoint)

    def save_checkpoint(
        self,
        filename: str | os.PathLike[str],
        *,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        meta: Mapping[str, Any] | None = None,
        by_epoch: bool = True,
        async_save: bool | None = None,
        max_keep_ckpts: int | None = None,
        series: str = "periodic",
    ) -> Any:
        """Save a checkpoint with the loop position and the message hub.

        ``by_epoch=True`` is for a save at the end of an epoch (the epoch is complete),
        ``False`` for one after an iteration, as mmengine's ``CheckpointHook`` calls it;
        ``meta`` entries are added to (and may override) the recorded position.
        ``async_save``, ``max_keep_ckpts`` and ``series`` go to the strategy's
        ``save_checkpoint`` (None: its defaults).
        Returns what the strategy returns: a future for a save written in the background,
        else None.
        """
        if by_epoch:
            position = dict(epoch=self.epoch + 1, iter=self.iter)
        else:
            position = dict(epoch=self.epoch, iter=self.iter + 1)
        full_meta = {**position, **dict(meta or {})}
        full_meta.update(cfg=self.cfg.pretty_text, experiment_name=self.experiment_name)
        self._register_states()
        return self.strategy.checkpointer.save(
            filename,
            save_optimizer=save_optimizer,
            save_param_scheduler=save_param_scheduler,
            extra_ckpt=dict(meta=full_meta),
            callback=self._before_save_callback,
            async_save=async_save,
            max_keep_ckpts=max_keep_ckpts,
            series=series,
        )


# ----------------------------------------------------------------------------- steps


def _own_method(model: nn.Module, name: str) -> Callable[..., Any] | None:
    """``model.name`` when the user's module defines ``name`` (called through the wrapper
    when the wrapper routes it, e.g. DDP's ``train_step``), else None."""
    module = unwrap_model(model)
    if not callable(getattr(module, name, None)):
        return None
    wrapped = getattr(model, name, None)
    return wrapped if callable(wrapped) else getattr(module, name)


def _to_device(data: Any, device: torch.device) -> Any:
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True) if data.device != device else data
    if isinstance(data, Mapping):
        return type(data)({k: _to_device(v, device) for k, v in data.items()})  # type: ignore[call-arg]
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # a namedtuple
        return type(data)(*(_to_device(v, device) for v in data))
    if isinstance(data, list | tuple):
        return type(data)(_to_device(v, device) for v in data)
    return data


def _call_model(model: nn.Module, data: Any) -> Any:
    if isinstance(data, Mapping):
        return model(**data)
    if isinstance(data, list | tuple):
        return model(*data)
    return model(data)


def parse_losses(outputs: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss to back-propagate and the values to log, from what ``forward`` returned.

    A dict: the entries whose key contains ``'loss'`` (a tensor, averaged if not a scalar,
    or a list of tensors) are summed; each is logged, and the sum as ``loss``. A scalar
    tensor is the loss itself. Anything else is an error that says what to return.
    """
    if isinstance(outputs, torch.Tensor) and outputs.dim() == 0:
        return outputs, {"loss": outputs.detach()}
    if not isinstance(outputs, Mapping):
        shown = (
            f"a Tensor of shape {tuple(outputs.shape)}"
            if isinstance(outputs, torch.Tensor)
            else f"a {type(outputs).__name__}"
        )
        raise TypeError(
            f"the model's forward returned {shown}, and the default train step needs the loss: "
            "return a dict such as dict(loss=F.cross_entropy(logits, labels)) (entries whose "
            "key contains 'loss' are summed), a scalar loss tensor, or define "
            "train_step(data, optim_wrapper) on the model"
        )
    losses: dict[str, torch.Tensor] = {}
    for key, value in outputs.items():
        if "loss" not in key:
            continue
        if isinstance(value, torch.Tensor):
            losses[key] = value.mean()
        elif isinstance(value, list | tuple) and all(isinstance(v, torch.Tensor) for v in value):
            losses[key] = sum(v.mean() for v in value)
        else:
            raise TypeError(f"loss entry {key!r} is a {type(value).__name__}, not a tensor")
    if not losses:
        raise ValueError(
            f"the model's forward returned a dict with keys {sorted(outputs)}, none of which "
            "contains 'loss': the default train step back-propagates the sum of the entries "
            "whose key contains 'loss'. Return e.g. dict(loss=...), or define "
            "train_step(data, optim_wrapper) on the model"
        )
    loss = sum(losses.values())
    log_vars = {"loss": loss.detach()}
    if list(losses) != ["loss"]:
        log_vars.update({k: v.detach() for k, v in losses.items()})
    return loss, log_vars  # type: ignore[return-value]


def _check_log_vars(outputs: Any) -> dict[str, Any]:
    if not isinstance(outputs, Mapping) or not any("loss" in str(k) for k in outputs):
        shown = sorted(outputs) if isinstance(outputs, Mapping) else type(outputs).__name__
        raise ValueError(
            f"the model's train_step returned {shown}; it must return a dict of logged values "
            "with a 'loss' entry (mmengine's BaseModel.train_step returns parse_losses' "
            "log_vars), e.g. return dict(loss=loss.detach())"
        )
    return dict(outputs)


def _mean_over_ranks(log_vars: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Logged values as 0-dim float64 tensors on the CPU (what hooks written for mmengine
    expect: ``outputs['loss'].item()``), averaged over the ranks (one copy to the host, one
    collective)."""
    names, values = [], []
    for key, value in log_vars.items():
        if isinstance(value, torch.Tensor):
            values.append(value.detach().float().mean())
        elif isinstance(value, int | float) and not isinstance(value, bool):
            values.append(torch.tensor(float(value)))
        else:
            continue
        names.append(key)
    if not values:
        return {}
    device = next((v.device for v in values if v.device.type != "cpu"), torch.device("cpu"))
    stacked = torch.stack([v.to(device) for v in values]).double()
    if dist.get_world_size() > 1:
        dist.all_reduce(stacked, op="mean")
    return dict(zip(names, stacked.cpu().unbind()))
