"""Experiment trackers under mmengine's names and arguments: ``LocalVisBackend``,
``TensorboardVisBackend``, ``WandbVisBackend``, ``MLflowVisBackend``.

Each backend receives the run's config once (``add_config``) and scalars at steps
(``add_scalars``), and ends its run in ``close``. It starts lazily, on its first call, as
mmengine's do: building one imports nothing and writes nothing, so that the runner can build
them on every rank and ``shardwise train`` can check their arguments before any worker
starts; only rank 0 ever calls them (:class:`~shardwise.visualization.Visualizer`). The
tracker library (``tensorboard``, ``wandb``, ``mlflow``) is imported when the backend starts.

Example::

    backend = LocalVisBackend(save_dir='work_dirs/run/vis_data')
    backend.add_scalars({'loss': 0.5, 'lr': 1e-3}, step=10)   # vis_data/scalars.json
    backend.close()
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from shardwise.registry import VISBACKENDS

__all__ = [
    "BaseVisBackend",
    "LocalVisBackend",
    "TensorboardVisBackend",
    "WandbVisBackend",
    "MLflowVisBackend",
    "MMENGINE_ONLY_BACKENDS",
]

logger = logging.getLogger(__name__)

# mmengine 0.10.7's backends that shardwise does not implement (named in the refusal)
MMENGINE_ONLY_BACKENDS = (
    "ClearMLVisBackend",
    "NeptuneVisBackend",
    "DVCLiveVisBackend",
    "AimVisBackend",
)


class BaseVisBackend:
    """One tracker. Subclasses set ``requires`` (the package they import, checked before a
    run starts) and implement ``_init_env``, ``_add_config``, ``_add_scalars``, ``_close``.

    Args:
        save_dir: where the backend writes (the Visualizer gives ``<log_dir>/vis_data``).
    """

    requires: str | None = None
    install_hint: str = ""

    def __init__(self, save_dir: str | os.PathLike[str] | None = None) -> None:
        self._save_dir = None if save_dir is None else str(save_dir)
        self._env_initialized = False

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def experiment(self) -> Any:
        """The tracker's own object (the SummaryWriter, the W&B run, the MLflow client)."""
        self._ensure_env()
        return self._experiment()

    def add_config(self, config: Any, **kwargs: Any) -> None:
        """Record the run's config (a :class:`~shardwise.config.Config`)."""
        self._ensure_env()
        self._add_config(config)

    def add_scalar(self, name: str, value: float, step: int = 0, **kwargs: Any) -> None:
        """Record one scalar at ``step``."""
        self.add_scalars({name: value}, step)

    def add_scalars(
        self,
        scalar_dict: Mapping[str, float],
        step: int = 0,
        file_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Record scalars at ``step`` (``file_path``: mmengine's extra JSON file, used by
        ``LocalVisBackend`` only)."""
        if "step" in scalar_dict:
            raise ValueError(
                f"add_scalars got a 'step' entry in {sorted(scalar_dict)}; pass the step as "
                "add_scalars(scalars, step=N)"
            )
        self._ensure_env()
        self._add_scalars(dict(scalar_dict), int(step), file_path)

    def close(self) -> None:
        """End the tracker's run and release its files; a later call starts it again."""
        if self._env_initialized:
            self._env_initialized = False
            self._close()

    def _ensure_env(self) -> None:
        if not self._env_initialized:
            if self._save_dir is not None:
                Path(self._save_dir).mkdir(parents=True, exist_ok=True)
            self._init_env()
            self._env_initialized = True

    def _import(self, module: str) -> Any:
        import importlib

        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(
                f"{type(self).__name__} needs the {self.requires} package: {self.install_hint}"
            ) from exc

    # subclasses
    def _init_env(self) -> None:
        pass

    def _experiment(self) -> Any:
        return self

    def _add_config(self, config: Any) -> None:
        pass

    def _add_scalars(self, scalars: dict[str, float], step: int, file_path: str | None) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


def _require_save_dir(backend: BaseVisBackend) -> str:
    if backend.save_dir is None:
        raise ValueError(
            f"{type(backend).__name__} has no save_dir; give the Visualizer save_dir=... (the "
            "Runner gives its log_dir) or the backend save_dir=..."
        )
    return backend.save_dir


@VISBACKENDS.register_module()
class LocalVisBackend(BaseVisBackend):
    """mmengine's local files: one JSON object per ``add_scalars`` call in
    ``save_dir/scalars.json`` (``{"loss": 0.5, ..., "step": 10}``) and the config in
    ``save_dir/config.py``."""

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        img_save_dir: str = "vis_image",
        config_save_file: str = "config.py",
        scalar_save_file: str = "scalars.json",
    ) -> None:
        for name, value, suffix in (
            ("config_save_file", config_save_file, ".py"),
            ("scalar_save_file", scalar_save_file, ".json"),
        ):
            if not str(value).endswith(suffix):
                raise ValueError(f"LocalVisBackend {name}={value!r}: expected a *{suffix} name")
        super().__init__(save_dir)
        self._img_save_dir = img_save_dir
        self._config_save_file = config_save_file
        self._scalar_save_file = scalar_save_file

    @property
    def scalar_file(self) -> Path:
        return Path(_require_save_dir(self)) / self._scalar_save_file

    def _init_env(self) -> None:
        _require_save_dir(self)

    def _add_config(self, config: Any) -> None:
        path = Path(_require_save_dir(self)) / self._config_save_file
        try:
            config.dump(path)
        except (TypeError, ValueError):  # objects in the config: keep a readable copy
            path.write_text(config.pretty_text, encoding="utf-8")

    def _add_scalars(self, scalars: dict[str, float], step: int, file_path: str | None) -> None:
        line = json.dumps({**scalars, "step": step}) + "\n"
        if file_path is not None:
            extra = Path(_require_save_dir(self)) / file_path
            if not file_path.endswith(".json") or extra == self.scalar_file:
                raise ValueError(
                    f"LocalVisBackend file_path={file_path!r}: expected a *.json name other "
                    f"than {self._scalar_save_file!r}"
                )
            with open(extra, "a", encoding="utf-8") as f:
                f.write(line)
        with open(self.scalar_file, "a", encoding="utf-8") as f:
            f.write(line)


@VISBACKENDS.register_module()
class TensorboardVisBackend(BaseVisBackend):
    """TensorBoard event files in ``save_dir`` (torch's ``SummaryWriter``); the config as the
    text ``config``."""

    requires = "tensorboard"
    install_hint = "pip install 'shardwise[tensorboard]' (or pip install tensorboard)"

    def _init_env(self) -> None:
        module = self._import("torch.utils.tensorboard")
        self._writer = module.SummaryWriter(_require_save_dir(self))

    def _experiment(self) -> Any:
        return self._writer

    def _add_config(self, config: Any) -> None:
        self._writer.add_text("config", config.pretty_text)

    def _add_scalars(self, scalars: dict[str, float], step: int, file_path: str | None) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, step)
        self._writer.flush()

    def _close(self) -> None:
        self._writer.close()


@VISBACKENDS.register_module()
class WandbVisBackend(BaseVisBackend):
    """Weights & Biases: ``wandb.init(**init_kwargs)`` (``dir`` defaults to ``save_dir``);
    scalars logged at their step (``run.log(scalars, step=step, commit=False)``: W&B keeps
    one row per step, committed when the step moves on, so that an iteration's validation
    metrics join its training values; a second commit of a step would be dropped), the config
    as the W&B run's config; ``close`` finishes the run. ``WANDB_MODE=offline`` keeps it on
    disk.

    Args:
        init_kwargs: ``wandb.init`` keywords (``project``, ``name``, ``entity``, ``mode``...).
        define_metric_cfg: ``{'acc': 'max'}`` or a list of ``wandb.define_metric`` keywords.
        commit: accepted for mmengine's configs (rows are committed per step, as above).
        log_code_name: upload the working directory's code under this artifact name (mmengine
            always uploads it; shardwise only when named: it walks the whole directory).
        watch_kwargs: accepted for mmengine's configs (``add_graph`` is not called).
    """

    requires = "wandb"
    install_hint = "pip install 'shardwise[wandb]' (or pip install wandb)"

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        init_kwargs: Mapping[str, Any] | None = None,
        define_metric_cfg: Mapping[str, str] | Sequence[Mapping[str, Any]] | None = None,
        commit: bool | None = True,
        log_code_name: str | None = None,
        watch_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if init_kwargs is not None and not isinstance(init_kwargs, Mapping):
            raise TypeError(
                f"WandbVisBackend init_kwargs={init_kwargs!r}: expected a dict of wandb.init "
                "keywords such as dict(project='my-project', name='run-1')"
            )
        if define_metric_cfg is not None and not isinstance(define_metric_cfg, Mapping | list):
            raise TypeError(
                f"WandbVisBackend define_metric_cfg={define_metric_cfg!r}: expected a dict "
                "such as {'accuracy': 'max'} or a list of wandb.define_metric keywords"
            )
        super().__init__(save_dir)
        self._init_kwargs = dict(init_kwargs or {})
        self._define_metric_cfg = define_metric_cfg
        self._commit = commit
        self._log_code_name = log_code_name
        self._watch_kwargs = dict(watch_kwargs or {})

    def _init_env(self) -> None:
        wandb = self._import("wandb")
        kwargs = dict(self._init_kwargs)
        if self.save_dir is not None:
            kwargs.setdefault("dir", self.save_dir)
        self._run = wandb.init(**kwargs)
        metrics = self._define_metric_cfg
        if isinstance(metrics, Mapping):
            for name, summary in metrics.items():
                self._run.define_metric(name, summary=summary)
        elif metrics is not None:
            for item in metrics:
                self._run.define_metric(**item)

    def _experiment(self) -> Any:
        return self._run

    def _add_config(self, config: Any) -> None:
        allow = bool(self._init_kwargs.get("allow_val_change", False))
        self._run.config.update(config.to_dict(), allow_val_change=allow)
        if self._log_code_name is not None:
            self._run.log_code(name=self._log_code_name)

    def _add_scalars(self, scalars: dict[str, float], step: int, file_path: str | None) -> None:
        self._run.log(scalars, step=step, commit=False)

    def _close(self) -> None:
        self._run.finish()


@VISBACKENDS.register_module()
class MLflowVisBackend(BaseVisBackend):
    """MLflow, through ``MlflowClient`` (no global active run): one run in the experiment
    ``exp_name`` (default ``'Default'``), created when the backend starts, ``tags`` set,
    ``params`` logged; the config as flattened params (``tracked_config_keys``: only those
    keys) and the artifact ``config.py``; scalars as metrics at the step; ``close`` uploads
    the run's log files whose names end with ``artifact_suffix`` and ends the run.

    Args:
        tracking_uri: default ``file://<save_dir>`` (mmengine's). MLflow 3 refuses a file
            store unless ``MLFLOW_ALLOW_FILE_STORE=true``; for a ``file:`` URI the backend
            sets it when it is not set.
        artifact_location: where a new experiment keeps its artifacts.
    """

    requires = "mlflow"
    install_hint = "pip install 'shardwise[mlflow]' (or pip install mlflow-skinny)"

    def __init__(
        self,
        save_dir: str | os.PathLike[str] | None = None,
        exp_name: str | None = None,
        run_name: str | None = None,
        tags: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        tracking_uri: str | None = None,
        artifact_suffix: str | Sequence[str] = (".json", ".log", ".py", "yaml"),
        tracked_config_keys: Sequence[str] | None = None,
        artifact_location: str | None = None,
    ) -> None:
        for name, value in (("tags", tags), ("params", params)):
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f"MLflowVisBackend {name}={value!r}: expected a dict")
        super().__init__(save_dir)
        self._exp_name = exp_name or "Default"
        self._run_name = run_name
        self._tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self._params = dict(params or {})
        self._tracking_uri = tracking_uri
        suffixes = (artifact_suffix,) if isinstance(artifact_suffix, str) else artifact_suffix
        self._artifact_suffix = tuple(suffixes)
        self._tracked_config_keys = tracked_config_keys
        self._artifact_location = artifact_location
        self.run_id: str | None = None

    def _init_env(self) -> None:
        uri = self._tracking_uri or Path(_require_save_dir(self)).resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking = self._import("mlflow.tracking")
        self._client = tracking.MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(self._exp_name)
        if experiment is None:
            experiment_id = self._client.create_experiment(
                self._exp_name, artifact_location=self._artifact_location
            )
        else:
            experiment_id = experiment.experiment_id
        run = self._client.create_run(experiment_id, run_name=self._run_name, tags=self._tags)
        self.run_id = run.info.run_id
        if self._params:
            self._log_params(self._params)

    def _experiment(self) -> Any:
        return self._client

    def _log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(str(k), str(v)[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):  # MLflow's limit per batch
            self._client.log_batch(self.run_id, params=items[start : start + 100])

    def _add_config(self, config: Any) -> None:
        tree = config.to_dict()
        if self._tracked_config_keys is not None:
            tree = {k: tree[k] for k in self._tracked_config_keys}
        self._log_params(_flatten(tree))
        self._client.log_text(self.run_id, config.pretty_text, "config.py")

    def _add_scalars(self, scalars: dict[str, float], step: int, file_path: str | None) -> None:
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        metrics = [Metric(k, float(v), stamp, step) for k, v in scalars.items()]
        self._client.log_batch(self.run_id, metrics=metrics)

    def _close(self) -> None:
        log_dir = Path(_require_save_dir(self)).parent
        for folder, under in ((log_dir, None), (Path(_require_save_dir(self)), "vis_data")):
            for path in sorted(folder.iterdir()) if folder.is_dir() else []:
                if path.is_file() and path.name.endswith(self._artifact_suffix):
                    self._client.log_artifact(self.run_id, str(path), under)
        self._client.set_terminated(self.run_id)


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """mmengine's flattening of a config into MLflow params: ``a.b``, list items of dicts
    as ``a.0.b``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(_flatten(value, name))
        elif isinstance(value, list | tuple) and any(isinstance(v, Mapping) for v in value):
            for i, item in enumerate(value):
                out.update(_flatten(item, f"{name}.{i}") if isinstance(item, Mapping) else {})
        else:
            out[name] = value
    return out
