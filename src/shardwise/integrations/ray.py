"""A shardwise config trained by Ray Train: the per-worker loop of ``TorchTrainer``.

Ray Train starts the workers and their process group; in each worker
:func:`train_loop_per_worker` builds a :class:`~shardwise.runner.Runner` from the config, whose
strategy adopts Ray's process group (Ray sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``; the
launcher is ``'pytorch'``), and trains. :class:`RayReportHook` hands every committed periodic
checkpoint to ``ray.train.report(metrics, checkpoint=Checkpoint.from_directory(...))``; a
trial that Ray restarts (``FailureConfig(max_failures=N)``) resumes from
``ray.train.get_checkpoint()``: model, optimizer, schedulers, RNG states, the loop position and
the sampler, so it reproduces the uninterrupted run. :func:`fit` builds the ``TorchTrainer``::

    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from shardwise.integrations.ray import fit

    ray.init(num_cpus=2)
    result = fit(
        'examples/gpt_fsdp.py',                       # or a dict / Config
        scaling_config=ScalingConfig(num_workers=2),  # CPU workers, gloo
        run_config=RunConfig(name='gpt', storage_path='/shared/ray_results',
                             failure_config=FailureConfig(max_failures=3)),
    )
    print(result.metrics['loss'], result.checkpoint)

or with a ``TorchTrainer`` of one's own::

    from ray.train.torch import TorchTrainer
    from shardwise.integrations.ray import train_loop_per_worker

    trainer = TorchTrainer(train_loop_per_worker,
                           train_loop_config=dict(cfg=cfg, work_dir='/shared/work_dirs'),
                           scaling_config=ScalingConfig(num_workers=4, use_gpu=True))
    trainer.fit()

What a worker does:

- ``work_dir`` is ``WORK_DIR/<Ray run name>`` (``WORK_DIR``: the ``work_dir`` handed in, else
  the config's, else ``work_dirs``; :func:`fit` makes it absolute on the driver). Sharded and
  local checkpoints are written by every rank and committed by rank 0, so on several nodes it
  must be on a filesystem every worker shares;
- a checkpoint from ``ray.train.get_checkpoint()`` (a restarted trial, or a run started
  again with the same ``RunConfig(name, storage_path)``) is resumed (``resume=PATH``: the
  committed shardwise checkpoint inside it); without one, the config's ``resume`` and
  ``load_from`` apply;
- after each committed periodic checkpoint (``CheckpointHook``'s saves; an asynchronous save
  is waited for first), every worker calls ``ray.train.report``: rank 0 with the checkpoint
  (a sharded checkpoint's directory as it is; a ``.pth`` file in a directory of its own, with
  its manifest, hard-linked), the other ranks with the metrics only (the directory is shared:
  one upload). The metrics are the latest message-hub scalars (``loss``, ``lr``, ... without
  their ``train/`` prefix, ``val/...`` as they are) with ``epoch``, ``iter`` and
  ``checkpoint`` (the file name); a run that ends without a checkpoint at its last iteration
  reports its final metrics once more, without one.

Ray keeps every reported checkpoint unless ``RunConfig(checkpoint_config=CheckpointConfig(
num_to_keep=N))`` says otherwise; ``max_keep_ckpts`` prunes the copies in ``work_dir``.
Needs ``pip install 'shardwise[ray]'`` (``ray[train]``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shardwise import dist
from shardwise.checkpoint.latest import committed_checkpoints
from shardwise.checkpoint.manifest import is_committed, manifest_path
from shardwise.config import Config
from shardwise.config.reading import import_custom_modules
from shardwise.registry import HOOKS
from shardwise.runner import Hook, Runner

_INSTALL = "pip install 'shardwise[ray]'"

try:
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer
except ImportError as exc:  # ray missing, or ray without its 'train' dependencies
    _missing = getattr(exc, "name", None)
    raise ImportError(
        "shardwise.integrations.ray runs shardwise configs under Ray Train and needs the "
        "package 'ray[train]', but "
        + (f"the package {_missing!r} is not installed" if _missing else f"{exc}")
        + f"; install it with: {_INSTALL}"
    ) from exc

__all__ = [
    "RayReportHook",
    "checkpoint_in",
    "fit",
    "ray_train_loop",
    "train_loop_per_worker",
]

_STAGING = ".ray_report"  # inside work_dir: directories holding one file checkpoint each


# ----------------------------------------------------------------------------- the hook


@HOOKS.register_module()
class RayReportHook(Hook):
    """Report each committed periodic checkpoint, with the latest metrics, to Ray Train.

    Runs after :class:`~shardwise.runner.CheckpointHook` (priority ``'LOWEST'``) and notices
    its saves by the message hub's ``last_ckpt``. Every rank calls ``ray.train.report`` the
    same number of times (Ray requires it); rank 0 attaches the checkpoint. Outside a Ray
    Train worker it does nothing.

    ``report`` returns once the checkpoint is copied to Ray's storage; Ray's controller
    registers it when it next polls the workers (every 2 s by default): a worker lost before
    that restarts the trial from the checkpoint reported before.
    """

    priority = "LOWEST"

    def __init__(self) -> None:
        self._seen: Any = None
        self._reported_iter: int | None = None

    def before_train(self, runner) -> None:
        self._seen = runner.message_hub.get_info("last_ckpt")  # after a resume: an older one
        self._reported_iter = None

    def after_train_iter(
        self, runner, batch_idx: int, data_batch: Any = None, outputs: dict | None = None
    ) -> None:
        self._report_new_checkpoint(runner, epoch=runner.epoch, iter=runner.iter + 1)

    def after_train_epoch(self, runner) -> None:
        self._report_new_checkpoint(runner, epoch=runner.epoch + 1, iter=runner.iter)

    def after_train(self, runner) -> None:
        if _in_ray_worker() and self._reported_iter != runner.iter:
            ray.train.report(_metrics_of(runner, epoch=runner.epoch, iter=runner.iter))
            self._reported_iter = runner.iter

    def _report_new_checkpoint(self, runner, *, epoch: int, iter: int) -> None:
        path = runner.message_hub.get_info("last_ckpt")
        if path is None or path == self._seen or not _in_ray_worker():
            return
        self._seen = path
        runner.strategy.wait_for_checkpoint()  # an asynchronous save: committed, or raises
        metrics = {**_metrics_of(runner, epoch=epoch, iter=iter), "checkpoint": Path(path).name}
        if runner.rank != 0:
            ray.train.report(metrics)
        else:
            with _as_ray_directory(path) as directory:
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))
        self._reported_iter = iter


def _metrics_of(runner, *, epoch: int, iter: int) -> dict[str, float | int]:
    """The latest value of each message-hub scalar (``train/`` dropped from the names), with
    the epochs and iterations done."""
    metrics: dict[str, float | int] = {}
    for key, history in runner.message_hub.log_scalars.items():
        if len(history):
            metrics[key.removeprefix("train/")] = float(history.current())
    metrics.update(epoch=epoch, iter=iter)
    return metrics


@contextlib.contextmanager
def _as_ray_directory(path: str):
    """A directory that holds the committed checkpoint ``path`` and nothing else: ``path``
    itself when it is a directory, else a staging directory in ``work_dir`` with the file
    and its manifest hard-linked (copied across filesystems), removed afterwards."""
    checkpoint = Path(path)
    if checkpoint.is_dir():
        yield str(checkpoint)
        return
    staging = checkpoint.parent / _STAGING / checkpoint.name
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for source in (checkpoint, manifest_path(checkpoint)):
            target = staging / source.name
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
        yield str(staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        with contextlib.suppress(OSError):
            staging.parent.rmdir()  # when empty


def _in_ray_worker() -> bool:
    try:
        ray.train.get_context()
    except Exception:  # noqa: BLE001 - Ray raises different errors outside a worker
        return False
    return True


# ----------------------------------------------------------------------------- the worker loop


def checkpoint_in(directory: str | os.PathLike[str]) -> str:
    """The committed shardwise checkpoint a Ray checkpoint directory holds: the directory
    itself (a sharded or local checkpoint), else the newest committed checkpoint inside it
    (a ``.pth`` file with its manifest)."""
    directory = Path(directory)
    if is_committed(directory):
        return str(directory)
    found = committed_checkpoints(directory)
    if not found:
        contents = sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []
        raise FileNotFoundError(
            f"the Ray checkpoint {directory} holds no committed shardwise checkpoint (a "
            f"directory or file with its manifest); it holds {contents}"
        )
    return str(found[-1])


def _as_config(cfg: Config | Mapping[str, Any] | str | os.PathLike[str]) -> Config:
    if isinstance(cfg, str | os.PathLike):
        return Config.fromfile(cfg)
    cfg = cfg if isinstance(cfg, Config) else Config(dict(cfg))
    if cfg.get("custom_imports"):  # a config read elsewhere: its modules, in this process
        import_custom_modules(cfg["custom_imports"])
    return cfg


def ray_train_loop(
    cfg: Config | Mapping[str, Any] | str | os.PathLike[str] | Callable[..., Runner],
    *,
    work_dir: str | os.PathLike[str] | None = None,
) -> Runner:
    """Train ``cfg`` in this Ray Train worker; returns the runner. See the module docstring
    for the work dir, the resume and the reports.

    ``cfg``: a config, its dict or its file; or a function that builds the runner in the
    worker, called as ``cfg(work_dir=..., resume=...)`` (``resume``: the checkpoint to resume
    from, or False) and expected to hand both to :class:`~shardwise.runner.Runner`::

        def build_runner(work_dir, resume):
            return Runner(model=MyNet(), work_dir=work_dir, resume=resume, ...)
    """
    name = ray.train.get_context().get_experiment_name()
    checkpoint = ray.train.get_checkpoint()
    with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as directory:
        resume = checkpoint_in(directory) if directory is not None else None
        if callable(cfg):
            root = work_dir if work_dir is not None else "work_dirs"
            runner = cfg(work_dir=os.path.join(str(root), name), resume=resume or False)
            if not isinstance(runner, Runner):
                raise TypeError(
                    f"{cfg!r} returned a {type(runner).__name__}; a function given as the config "
                    "must return a shardwise Runner built with the work_dir and resume it is "
                    "called with"
                )
            if not any(isinstance(hook, RayReportHook) for hook in runner.hooks):
                runner.register_hook(RayReportHook())
        else:
            runner = Runner.from_cfg(_worker_config(cfg, work_dir, name, resume))
        if resume is not None:
            runner.logger.info("Ray Train restarted this trial: resuming %s", resume)
        runner.train()
    return runner


def _worker_config(
    cfg: Config | Mapping[str, Any] | str | os.PathLike[str],
    work_dir: str | os.PathLike[str] | None,
    name: str,
    resume: str | None,
) -> Config:
    """The config a worker trains: ``work_dir`` per run, :class:`RayReportHook` added, the
    Ray checkpoint (if any) to resume from."""
    cfg = _as_config(cfg).copy()
    root = work_dir if work_dir is not None else cfg.get("work_dir", "work_dirs")
    cfg["work_dir"] = os.path.join(str(root), name)
    hooks = list(cfg.get("custom_hooks") or [])
    if not any(_is_report_hook(hook) for hook in hooks):
        hooks.append(dict(type="RayReportHook"))
    cfg["custom_hooks"] = hooks
    if resume is not None:
        cfg["resume"] = resume
        cfg["load_from"] = None
    return cfg


def train_loop_per_worker(config: Mapping[str, Any]) -> None:
    """``TorchTrainer``'s per-worker function: ``config['cfg']`` (a config, its dict or its
    file, or a function that builds the runner) trained by :func:`ray_train_loop`
    (``config['work_dir']``: the work dir root)."""
    if "cfg" not in config:
        raise KeyError(
            "train_loop_per_worker needs train_loop_config=dict(cfg=CONFIG) (a shardwise "
            f"config, its dict or its file), got keys {sorted(config)}"
        )
    ray_train_loop(config["cfg"], work_dir=config.get("work_dir"))


def _is_report_hook(hook: Any) -> bool:
    if isinstance(hook, Mapping):
        return hook.get("type") in ("RayReportHook", RayReportHook)
    return isinstance(hook, RayReportHook)


# ----------------------------------------------------------------------------- the driver


def fit(
    cfg: Config | Mapping[str, Any] | str | os.PathLike[str] | Callable[..., Runner],
    *,
    scaling_config: ray.train.ScalingConfig | None = None,
    run_config: ray.train.RunConfig | None = None,
    torch_config: TorchConfig | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    **trainer_kwargs: Any,
) -> ray.train.Result:
    """Train ``cfg`` with Ray Train: a ``TorchTrainer`` running :func:`train_loop_per_worker`
    on each worker; returns its ``Result`` (``metrics``, ``checkpoint``).

    A config (its dict or its file) is read and checked here, on the driver (against
    ``num_workers`` ranks), and sent to the workers; a function that builds the runner (see
    :func:`ray_train_loop`) is sent as it is. ``work_dir`` (default: the config's, else
    ``work_dirs``) is made absolute here; each run trains in ``work_dir/<run name>``.
    ``scaling_config`` defaults to one worker (on a GPU when CUDA is available);
    ``torch_config`` to the config's ``env_cfg.dist_cfg.backend`` (NCCL without CUDA: gloo),
    else Ray's choice. ``trainer_kwargs`` go to ``TorchTrainer`` (``datasets``...).
    """
    if scaling_config is None:
        import torch

        scaling_config = ray.train.ScalingConfig(num_workers=1, use_gpu=torch.cuda.is_available())
    cfg_work_dir = None
    if not callable(cfg):
        cfg = _as_config(cfg)
        workers = scaling_config.num_workers
        Runner.check_cfg(cfg, world_size=workers if isinstance(workers, int) else None)
        cfg_work_dir = cfg.get("work_dir")
        if torch_config is None:
            env, _ = dist.env_kwargs_from_cfg(cfg.get("env_cfg"))
            backend = (env.get("dist_cfg") or {}).get("backend")
            torch_config = TorchConfig(backend=backend) if backend else None
    root = os.path.abspath(str(work_dir or cfg_work_dir or "work_dirs"))
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=dict(cfg=cfg, work_dir=root),
        scaling_config=scaling_config,
        run_config=run_config,
        torch_config=torch_config,
        **trainer_kwargs,
    )
    return trainer.fit()
