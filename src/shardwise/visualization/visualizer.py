"""The Visualizer: mmengine's ``visualizer=dict(type='Visualizer', vis_backends=[...],
save_dir=...)``, for scalars and the config (no drawing).

Every backend writes under ``<save_dir>/vis_data`` (the Runner's ``save_dir`` is its
``log_dir``); only rank 0 calls them. The Runner's ``LoggerHook`` sends each record of its
JSON-lines log (``metrics.jsonl``) here, at the record's ``iter``; see
:func:`tracked_scalars`.

Example::

    visualizer = Visualizer(
        vis_backends=[dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')],
        save_dir='work_dirs/run')
    visualizer.add_scalars({'loss': 0.5}, step=10)
    visualizer.close()
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from shardwise import dist
from shardwise.registry import VISBACKENDS, VISUALIZERS

from .vis_backend import MMENGINE_ONLY_BACKENDS, BaseVisBackend

__all__ = ["Visualizer", "build_vis_backend", "check_vis_backends", "tracked_scalars"]

_NOT_SCALARS = ("mode",)


@VISUALIZERS.register_module()
class Visualizer:
    """Sends the config and scalars to its backends, from rank 0.

    Args:
        name: the instance's name (:meth:`get_instance`, :meth:`get_current_instance`).
        vis_backends: backend objects or ``VISBACKENDS`` configs (a config's ``name``
            keys it in :meth:`get_backend`; default the class name).
        save_dir: the backends' directory is ``<save_dir>/vis_data`` (a backend's own
            ``save_dir`` wins).

    mmengine's ``image``, ``fig_save_cfg`` and ``fig_show_cfg`` are accepted and unused.
    """

    _instances: ClassVar[dict[str, Visualizer]] = {}
    _current: ClassVar[Visualizer | None] = None

    def __init__(
        self,
        name: str = "visualizer",
        image: Any = None,
        vis_backends: Sequence[Mapping[str, Any] | BaseVisBackend]
        | Mapping[str, Any]
        | BaseVisBackend
        | None = None,
        save_dir: str | os.PathLike[str] | None = None,
        fig_save_cfg: Mapping[str, Any] | None = None,
        fig_show_cfg: Mapping[str, Any] | None = None,
    ) -> None:
        self.instance_name = name
        if isinstance(vis_backends, Mapping | BaseVisBackend):
            vis_backends = [vis_backends]
        if vis_backends is not None and not isinstance(vis_backends, list | tuple):
            raise TypeError(
                f"visualizer.vis_backends={vis_backends!r}: expected a list of backend configs "
                "such as [dict(type='LocalVisBackend')]"
            )
        vis_data = None if save_dir is None else str(Path(save_dir) / "vis_data")
        self._vis_backends: dict[str, BaseVisBackend] = {}
        for i, item in enumerate(vis_backends or []):
            backend_name = None
            if isinstance(item, Mapping):
                cfg = dict(copy.deepcopy(item))
                backend_name = cfg.pop("name", None)
                cfg.setdefault("save_dir", vis_data)
                item = build_vis_backend(cfg, f"visualizer.vis_backends[{i}]")
            elif not isinstance(item, BaseVisBackend):
                raise TypeError(
                    f"visualizer.vis_backends[{i}]={item!r}: expected a backend object or a "
                    "config such as dict(type='LocalVisBackend')"
                )
            backend_name = backend_name or type(item).__name__
            if backend_name in self._vis_backends:
                raise ValueError(
                    f"visualizer.vis_backends: two backends named {backend_name!r}; give one "
                    "name='...' in its config"
                )
            self._vis_backends[backend_name] = item
        Visualizer._instances[name] = self
        Visualizer._current = self

    @classmethod
    def get_instance(cls, name: str, **kwargs: Any) -> Visualizer:
        """The instance called ``name``, built with ``kwargs`` if there is none."""
        found = cls._instances.get(name)
        return found if found is not None else cls(name=name, **kwargs)

    @classmethod
    def saved_instances(cls) -> tuple[dict[str, Visualizer], Visualizer | None]:
        """The instances and the current one as they are now, for :meth:`restore_instances`."""
        return dict(Visualizer._instances), Visualizer._current

    @classmethod
    def restore_instances(cls, saved: tuple[dict[str, Visualizer], Visualizer | None]) -> None:
        """Put back what :meth:`saved_instances` returned."""
        Visualizer._instances, Visualizer._current = dict(saved[0]), saved[1]

    @classmethod
    def get_current_instance(cls) -> Visualizer:
        """The latest instance built (mmengine's way for code without the runner)."""
        if cls._current is None:
            return cls(name="visualizer")
        return cls._current

    @property
    def vis_backends(self) -> dict[str, BaseVisBackend]:
        return dict(self._vis_backends)

    def get_backend(self, name: str) -> BaseVisBackend | None:
        """The backend called ``name`` (its class name unless its config named it)."""
        return self._vis_backends.get(name)

    def add_config(self, config: Any, **kwargs: Any) -> None:
        """Record the run's config (rank 0)."""
        if dist.get_rank() == 0:
            for backend in self._vis_backends.values():
                backend.add_config(config, **kwargs)

    def add_scalar(self, name: str, value: Any, step: int = 0, **kwargs: Any) -> None:
        """Record one scalar at ``step`` (rank 0)."""
        self.add_scalars({name: value}, step, **kwargs)

    def add_scalars(
        self,
        scalar_dict: Mapping[str, Any],
        step: int = 0,
        file_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Record scalars at ``step`` (rank 0); tensors and NumPy numbers become Python
        numbers, other values are skipped."""
        if dist.get_rank() != 0 or not self._vis_backends:
            return
        numbers = {k: _number(v) for k, v in scalar_dict.items()}
        numbers = {k: v for k, v in numbers.items() if v is not None}
        for backend in self._vis_backends.values():
            backend.add_scalars(numbers, step, file_path, **kwargs)

    def close(self) -> None:
        """End every backend's run (files closed, W&B finished, the MLflow run ended)."""
        for backend in self._vis_backends.values():
            backend.close()


def build_vis_backend(cfg: Mapping[str, Any], key: str = "vis_backend") -> BaseVisBackend:
    """A backend from its config; an unknown ``type`` is one ``KeyError`` line naming the
    backends shardwise has (and mmengine's it does not)."""
    check_vis_backend_type(cfg, key)
    return VISBACKENDS.build(dict(cfg))


def check_vis_backend_type(cfg: Mapping[str, Any], key: str) -> type:
    """The backend class a config names; refuses an unknown ``type``, or a backend whose
    tracker package is not installed, in one line."""
    if not isinstance(cfg, Mapping) or "type" not in cfg:
        raise TypeError(
            f"{key}={cfg!r}: expected a backend config such as dict(type='LocalVisBackend')"
        )
    kind = cfg["type"]
    cls = kind if isinstance(kind, type) else VISBACKENDS.get(kind)
    if cls is None:
        known = ", ".join(sorted(VISBACKENDS.module_dict))
        why = (
            " (one of mmengine's backends that shardwise does not implement)"
            if kind in MMENGINE_ONLY_BACKENDS
            else ""
        )
        raise KeyError(
            f"{key}.type={kind!r} is not a visualization backend{why}; shardwise has {known}. "
            "Use one of them, or register yours in shardwise.registry.VISBACKENDS"
        )
    package = getattr(cls, "requires", None)
    if package and importlib.util.find_spec(package) is None:
        raise ImportError(
            f"{key}.type={cls.__name__!r} needs the {package} package, which is not "
            f"installed: {getattr(cls, 'install_hint', '')}"
        )
    return cls


def check_vis_backends(visualizer: Any, key: str = "visualizer") -> None:
    """Check a ``visualizer`` config's backends (types, packages, arguments) without
    starting them; no side effects."""
    if visualizer is None or isinstance(visualizer, Visualizer):
        return
    if not isinstance(visualizer, Mapping):
        raise TypeError(
            f"{key}={visualizer!r}: expected a config such as dict(type='Visualizer', "
            "vis_backends=[dict(type='LocalVisBackend')]) or a Visualizer"
        )
    backends = visualizer.get("vis_backends") or []
    if isinstance(backends, Mapping):
        backends = [backends]
    if not isinstance(backends, list | tuple):
        raise TypeError(
            f"{key}.vis_backends={backends!r}: expected a list of backend configs such as "
            "[dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]"
        )
    save_dir = visualizer.get("save_dir", "vis_data")
    for i, item in enumerate(backends):
        if isinstance(item, BaseVisBackend):
            continue
        where = f"{key}.vis_backends[{i}]"
        check_vis_backend_type(item, where)
        cfg = {k: v for k, v in item.items() if k != "name"}
        cfg.setdefault("save_dir", save_dir)
        try:
            VISBACKENDS.build(cfg)
        except TypeError as exc:
            raise TypeError(f"{where}: {' '.join(str(exc).split())}") from None


def tracked_scalars(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """What the trackers receive for one JSON-lines record: its numeric entries but
    ``mode`` (``epoch`` and ``iter`` included, as mmengine's ``LogProcessor`` sends them),
    the others prefixed with ``prefix`` (``'train/'`` under mmengine's
    ``log_with_hierarchy=True``; default none, mmengine's default)."""
    out = {}
    for key, value in record.items():
        if key in _NOT_SCALARS or isinstance(value, bool) or not isinstance(value, int | float):
            continue
        out[key if key in ("epoch", "iter") else prefix + key] = value
    return out


def _number(value: Any) -> int | float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    item = getattr(value, "item", None)
    if callable(item):  # a tensor or NumPy number (one element)
        try:
            result = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        return result if isinstance(result, int | float) and not isinstance(result, bool) else None
    return None
