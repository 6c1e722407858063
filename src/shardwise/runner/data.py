"""Data loading for the runner: dataloaders built from configs, seeded, and resumable mid-epoch.

Every dataloader the runner builds uses a :class:`ResumableSampler` (a
``DistributedSampler``, with one replica when not distributed): it shuffles with a seed and
the epoch, gives each rank its share, and can start its next pass at any position, so a
resumed run continues with exactly the next batch without loading the batches it skips.
Worker processes are seeded from the seed, the epoch and the rank.

A dataset of mmengine's (an OpenMMLab package's: ``mmpretrain``'s ``CustomDataset``...) gets the
loader mmengine's Runner would build for it: ``full_init()`` first, and what the Runner's
compatibility policy says (:mod:`shardwise.integrations.openmmlab_compat`: mmengine's
``pseudo_collate`` by default and its ``collate_fn`` names, its worker seeding, and a loader
that reports each ``iter()`` to the policy, which draws from torch's generator as torch draws
for mmengine's loader). mmengine's
``InfiniteSampler`` is :class:`ResumableInfiniteSampler`: the same endless order, resumable.

Example::

    loader = build_dataloader(
        dict(dataset=dict(type='MyDataset'), batch_size=32, num_workers=2,
             sampler=dict(type='DefaultSampler', shuffle=True)),
        seed=0)
    start_epoch(loader, epoch=3, skip_batches=10)   # the 11th batch of epoch 3 comes next
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data.dataloader import default_collate

from shardwise import dist
from shardwise.integrations.openmmlab_compat import PlainRun
from shardwise.registry import DATA_SAMPLERS, DATASETS, FUNCTIONS, DefaultScope

__all__ = [
    "ResumableInfiniteSampler",
    "ResumableSampler",
    "build_dataloader",
    "start_epoch",
    "seed_worker",
    "pseudo_collate",
    "default_collate",
]

logger = logging.getLogger(__name__)

# Sampler names from mmengine configs that mean "shuffle (or not) and split across ranks".
_SAMPLER_NAMES = ("DefaultSampler", "InfiniteSampler", "DistributedSampler", "ResumableSampler")
_ENDLESS_NAMES = ("InfiniteSampler",)
_PLAIN = PlainRun()
_LOADER_KEYS = (
    "batch_size",
    "num_workers",
    "pin_memory",
    "drop_last",
    "persistent_workers",
    "prefetch_factor",
    "timeout",
    "multiprocessing_context",
    "in_order",
)

FUNCTIONS.register_module(name="default_collate", module=default_collate)


@FUNCTIONS.register_module()
def pseudo_collate(batch: Sequence[Any]) -> Any:
    """mmengine's collate: transpose a list of samples without stacking tensors
    (a list of dicts becomes a dict of lists; a list of tuples, a list of lists)."""
    first = batch[0]
    if isinstance(first, Mapping):
        return {key: pseudo_collate([sample[key] for sample in batch]) for key in first}
    if isinstance(first, tuple | list) and not isinstance(first, str):
        return [pseudo_collate(list(items)) for items in zip(*batch)]
    return list(batch)


class ResumableSampler(DistributedSampler):
    """A ``DistributedSampler`` whose next pass can start at a given position.

    Args:
        dataset: the dataset to sample.
        shuffle: reshuffle every epoch with ``seed + epoch`` (the same order on every rank).
        seed: the shuffling seed, identical on every rank.
        num_replicas, rank: default to the process group's world size and rank.
        generator: the dataloader's generator; :meth:`set_epoch` reseeds it from
            (seed, epoch, rank), which makes the worker processes' seeds reproducible.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            dataset,
            num_replicas=dist.get_world_size() if num_replicas is None else num_replicas,
            rank=dist.get_rank() if rank is None else rank,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
        )
        self.generator = generator
        self._start = 0
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if self.generator is not None:
            self.generator.manual_seed(_mix(self.seed, epoch, self.rank))

    def set_seed(self, seed: int) -> None:
        self.seed = seed
        self.set_epoch(self.epoch)

    def skip(self, num_samples: int) -> None:
        """Start the next pass after this rank's first ``num_samples`` indices."""
        if num_samples < 0:
            raise ValueError(f"cannot skip a negative number of samples ({num_samples})")
        self._start = num_samples

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        start, self._start = self._start, 0
        return iter(indices[start:])


class ResumableInfiniteSampler(DistributedSampler):
    """mmengine's ``InfiniteSampler`` (``mmengine/dataset/sampler.py``), resumable: one endless
    stream of permutations of the dataset (a generator seeded once with ``seed``, not reseeded
    per epoch), every ``num_replicas``-th index from ``rank`` on; its length is the dataset's.
    :meth:`skip` starts the next iteration after this rank's first ``num_samples`` indices of
    the stream (mmengine's Runner loads and drops them; nothing is loaded here).
    ``set_epoch`` does nothing, as mmengine's."""

    endless = True

    def __init__(
        self,
        dataset: Dataset,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(
            dataset,
            num_replicas=dist.get_world_size() if num_replicas is None else num_replicas,
            rank=dist.get_rank() if rank is None else rank,
            shuffle=shuffle,
            seed=seed,
        )
        self.generator = generator
        self.size = len(dataset)
        self._start = 0
        if generator is not None:
            generator.manual_seed(_mix(seed, 0, self.rank))

    def set_epoch(self, epoch: int) -> None:
        """Nothing: the stream goes on (mmengine's ``InfiniteSampler.set_epoch``)."""

    def set_seed(self, seed: int) -> None:
        self.seed = seed

    def skip(self, num_samples: int) -> None:
        if num_samples < 0:
            raise ValueError(f"cannot skip a negative number of samples ({num_samples})")
        self._start = num_samples

    def __len__(self) -> int:
        return self.size

    def __iter__(self) -> Iterator[int]:
        start, self._start = self.rank + self._start * self.num_replicas, 0
        g = torch.Generator()
        g.manual_seed(self.seed)
        passes, offset = divmod(start, self.size)
        for _ in range(passes):  # the permutations before the start, drawn and dropped
            self._permutation(g)
        while True:
            indices = self._permutation(g)
            yield from indices[offset :: self.num_replicas]
            # the next permutation continues the stream where this one's rank slice ended
            offset = (offset - len(indices)) % self.num_replicas

    def _permutation(self, g: torch.Generator) -> list[int]:
        if self.shuffle:
            return torch.randperm(self.size, generator=g).tolist()
        return list(range(self.size))


def _mix(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + rank) % (2**63 - 1)


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed NumPy and ``random`` from the seed torch gave this worker
    (itself derived from the dataloader's generator, hence from seed, epoch and rank)."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def build_dataloader(
    dataloader: DataLoader | Mapping[str, Any],
    *,
    seed: int = 0,
    shuffle: bool = True,
    num_replicas: int | None = None,
    rank: int | None = None,
    worker_seed: int | None = None,
    compat: PlainRun = _PLAIN,
) -> DataLoader:
    """A ``DataLoader`` from an object (returned as it is) or a config.

    Config keys: ``dataset`` (a ``Dataset`` or a ``DATASETS`` config, required),
    ``batch_size`` (per rank, required), ``num_workers``, ``sampler`` (mmengine's
    ``dict(type='DefaultSampler', shuffle=True, seed=None)``; another ``type`` is built from
    ``DATA_SAMPLERS`` with ``dataset`` and ``seed``), ``shuffle`` (alternative to
    the sampler's), ``collate_fn`` (a callable or ``dict(type='default_collate' |
    'pseudo_collate')``; torch's ``default_collate`` by default, mmengine's ``pseudo_collate``
    for a dataset of mmengine's), and the ``DataLoader``
    keywords ``pin_memory``, ``drop_last``, ``persistent_workers``, ``prefetch_factor``.
    ``shuffle`` is the default when neither the config nor its sampler says.
    ``num_replicas`` and ``rank`` split the data (default: the process group's world and rank).
    ``worker_seed``: the run's seed, which seeds the workers of a dataset of mmengine's as
    mmengine's Runner does (default ``seed``). ``compat``: the Runner's compatibility policy
    (the collate function, worker seeding and loader class of another framework's dataset).
    """
    if isinstance(dataloader, DataLoader):
        return dataloader
    if not isinstance(dataloader, Mapping):
        raise TypeError(
            f"a dataloader must be a torch DataLoader or a config dict, got "
            f"{type(dataloader).__name__}: {dataloader!r}"
        )
    cfg = dict(dataloader)
    check_dataloader_cfg(cfg)
    dataset = cfg.pop("dataset")
    if isinstance(dataset, Mapping):
        dataset = DATASETS.build(dataset)
        if callable(getattr(dataset, "full_init", None)):  # mmengine's: loads its annotations
            dataset.full_init()
    sampler_cfg = dict(cfg.pop("sampler", None) or {})
    shuffle = cfg.pop("shuffle", shuffle)
    generator = torch.Generator()
    if sampler_cfg.get("type", "DefaultSampler") in _SAMPLER_NAMES:
        shuffle = bool(sampler_cfg.pop("shuffle", shuffle))
        sampler_seed = seed if sampler_cfg.get("seed") is None else int(sampler_cfg["seed"])
        sampler = _resumable_sampler(
            dataset, sampler_cfg, shuffle, sampler_seed, generator, num_replicas, rank
        )
    else:  # a package's sampler, built as mmengine's Runner builds it
        sampler = DATA_SAMPLERS.build(sampler_cfg, default_args=dict(dataset=dataset, seed=seed))
    collate_fn = _collate_fn(cfg.pop("collate_fn", None), dataset, compat)
    kwargs = {k: cfg.pop(k) for k in _LOADER_KEYS if k in cfg}
    cfg.pop("worker_init_fn", None)
    if cfg:
        raise ValueError(
            f"unknown dataloader keys {sorted(cfg)}; accepted: dataset, sampler, shuffle, "
            f"collate_fn, {', '.join(_LOADER_KEYS)}"
        )
    if kwargs.get("num_workers", 0) == 0:
        kwargs.pop("persistent_workers", None)
        kwargs.pop("prefetch_factor", None)
    init_fn = compat.worker_init_fn(
        dataset,
        seed_worker,
        num_workers=kwargs.get("num_workers", 0),
        rank=dist.get_rank(),
        seed=seed if worker_seed is None else worker_seed,
    )
    return compat.dataloader(
        dataset,
        sampler=sampler,
        collate_fn=collate_fn,
        worker_init_fn=init_fn,
        generator=generator,
        **kwargs,
    )


def _resumable_sampler(
    dataset: Dataset,
    sampler_cfg: dict[str, Any],
    shuffle: bool,
    seed: int,
    generator: torch.Generator,
    num_replicas: int | None,
    rank: int | None,
) -> ResumableSampler | ResumableInfiniteSampler:
    """The sampler of mmengine's ``DefaultSampler`` (and the names like it) configs; of its
    ``InfiniteSampler``, :class:`ResumableInfiniteSampler`."""
    unknown = set(sampler_cfg) - {"type", "seed", "round_up", "_scope_"}  # it pads equal shares
    if unknown:
        raise ValueError(f"unknown sampler keys {sorted(unknown)}; accepted: shuffle, seed")
    endless = sampler_cfg.get("type") in _ENDLESS_NAMES
    cls = ResumableInfiniteSampler if endless else ResumableSampler
    return cls(
        dataset,
        shuffle=shuffle,
        seed=seed,
        generator=generator,
        num_replicas=num_replicas,
        rank=rank,
    )


def _collate_fn(collate_fn: Any, dataset: Any, compat: PlainRun) -> Any:
    """The collate function of a dataloader config (the default and the names that
    ``compat`` gives ``dataset``, then ``FUNCTIONS``' names)."""
    if collate_fn is None:
        return _COLLATE_DEFAULTS[compat.default_collate(dataset)]
    if not isinstance(collate_fn, Mapping):
        return collate_fn
    cfg = dict(collate_fn)
    name = cfg.pop("type")
    cfg.pop("_scope_", None)  # from a package's base config: its names are resolved below
    current = DefaultScope.get_current_instance()
    func = compat.collate_function(dataset, name, current and current.scope_name)
    func = func or FUNCTIONS.resolve(name)
    return functools.partial(func, **cfg) if cfg else func


_COLLATE_DEFAULTS = {"default_collate": default_collate, "pseudo_collate": pseudo_collate}


def check_dataloader_cfg(cfg: Mapping[str, Any], name: str = "dataloader") -> None:
    """Refuse a dataloader config without a dataset or a batch size, naming the fix."""
    if "dataset" not in cfg or cfg["dataset"] is None:
        raise ValueError(
            f"{name} has no 'dataset' (keys: {sorted(cfg)}); add dataset=dict(type=...) naming a "
            "class registered in shardwise.registry.DATASETS, or a Dataset object"
        )
    size = cfg.get("batch_size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(
            f"{name}.batch_size must be a positive int (the batch size per rank), got {size!r}; "
            f"e.g. {name}=dict(batch_size=32, dataset=...)"
        )
    batches = cfg.get("batch_sampler")
    if batches is not None:
        kind = batches.get("type") if isinstance(batches, Mapping) else type(batches).__name__
        raise ValueError(
            f"{name}.batch_sampler {kind!r} is not supported: shardwise's Runner batches with "
            "its own sampler, whose position its checkpoints save and resume; give the loader "
            f"without it ({name}=dict(_delete_=True, ...) in a child of an mmdet config, whose "
            "datasets set AspectRatioBatchSampler)"
        )
    sampler = cfg.get("sampler")
    kind = sampler.get("type", "DefaultSampler") if isinstance(sampler, Mapping) else None
    if kind is not None and kind not in _SAMPLER_NAMES and DATA_SAMPLERS.get(kind) is None:
        raise ValueError(
            f"{name}.sampler type {kind!r} is not supported; use one of "
            f"{list(_SAMPLER_NAMES)} (they shuffle with a seed, split the data across ranks and "
            "resume mid-epoch), or a sampler registered in DATA_SAMPLERS (an OpenMMLab "
            "package's, under the config's default_scope)"
        )


def _sampler_of(loader: DataLoader) -> Any:
    batch_sampler = getattr(loader, "batch_sampler", None)
    return getattr(batch_sampler, "sampler", None) or getattr(loader, "sampler", None)


def start_epoch(loader: DataLoader, epoch: int, skip_batches: int = 0) -> Iterator[Any]:
    """An iterator over ``loader`` for data epoch ``epoch``, starting after ``skip_batches``.

    With a :class:`ResumableSampler` the skipped batches are never loaded; with another
    sampler they are loaded and dropped (a warning says so). With an endless sampler
    (:class:`ResumableInfiniteSampler`) there is one stream: data epoch ``epoch`` starts at
    its ``epoch * len(loader)``-th batch.
    """
    sampler = _sampler_of(loader)
    if isinstance(sampler, ResumableInfiniteSampler):
        skip_batches += epoch * len(loader)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    if skip_batches <= 0:
        return iter(loader)
    if isinstance(sampler, ResumableSampler | ResumableInfiniteSampler) and loader.batch_size:
        sampler.skip(skip_batches * loader.batch_size)
        return iter(loader)
    logger.warning(
        "The dataloader's sampler cannot start mid-epoch; loading and dropping %d batches to "
        "reach the resumed position. Build the dataloader from a config to skip them for free.",
        skip_batches,
    )
    iterator = iter(loader)
    for _ in range(skip_batches):
        next(iterator)
    return iterator


def set_sampler_seed(loader: DataLoader, seed: int) -> None:
    """Give ``loader``'s :class:`ResumableSampler` a new seed (after a resume restored one)."""
    sampler = _sampler_of(loader)
    if isinstance(sampler, ResumableSampler | ResumableInfiniteSampler):
        sampler.set_seed(seed)
