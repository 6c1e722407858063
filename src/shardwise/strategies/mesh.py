"""The parallel degrees of a run and the one DeviceMesh they make.

The vocabulary is torchtitan's and Accelerate's: ``pp`` (pipeline stages, the outermost
dimension), ``dp_replicate`` (copies of each shard: HSDP's replicate dimension, DDP-like),
``dp_shard`` (FSDP's sharding dimension) and ``tp`` (tensor parallel); ``-1`` means "the rest
of the world". The mesh's dimensions are named after them and laid out in that order,
row-major, so that a rank's tensor-parallel peers are its neighbours (``rank // tp`` is its
data-parallel rank without pipeline stages; :meth:`Degrees.dp_rank` in general). FSDP's
``sharding_strategy`` vocabulary maps onto the same degrees (:func:`resolve_degrees`).

Example::

    >>> degrees = resolve_degrees(dict(tp=2), mesh_kind='shard', replicate_size=None,
    ...                           world_size=8, local_size=8)
    >>> degrees.shape, degrees.dim_names, degrees.dp_dim_names
    ((4, 2), ('dp_shard', 'tp'), ('dp_shard',))
    >>> mesh = build_device_mesh('cpu', degrees)   # mesh['tp'], mesh['dp_shard']
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = [
    "DEGREE_NAMES",
    "Degrees",
    "build_device_mesh",
    "data_parallel_mesh",
    "parse_parallelism",
    "resolve_degrees",
    "stage_mesh",
]

#: The parallel degrees, in the order of the mesh's dimensions (outermost first).
DEGREE_NAMES = ("pp", "dp_replicate", "dp_shard", "tp")
_EXAMPLE = "parallelism=dict(dp_shard=-1, tp=2)"


@dataclass(frozen=True)
class Degrees:
    """Resolved parallel degrees (their product is the world size).

    ``hybrid``: the mesh keeps a ``dp_replicate`` dimension even of size 1 (HYBRID_SHARD,
    NO_SHARD: FSDP2 then replicates across it).
    """

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    hybrid: bool = False
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp_size(self) -> int:
        """How many different batches one step sees (tensor-parallel peers share one)."""
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        """The data-parallel rank of global ``rank`` (its batch's index; the stages of one
        pipeline share it)."""
        return (rank % (self.dp_size * self.tp)) // self.tp

    def pp_rank(self, rank: int) -> int:
        """The pipeline rank of global ``rank`` (0 without pipeline stages)."""
        return rank // (self.dp_size * self.tp)

    @property
    def dp_dim_names(self) -> tuple[str, ...]:
        """The mesh dimensions ``fully_shard`` works on."""
        return ("dp_replicate", "dp_shard") if self.hybrid else ("dp_shard",)

    @property
    def dim_names(self) -> tuple[str, ...]:
        names = (*self.dp_dim_names, "tp") if self.tp > 1 else self.dp_dim_names
        return ("pp", *names) if self.pp > 1 else names

    @property
    def stage_dim_names(self) -> tuple[str, ...]:
        """The dimensions one pipeline stage is parallelised over (all but ``pp``)."""
        return tuple(name for name in self.dim_names if name != "pp")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, name) for name in self.dim_names)


def parse_parallelism(value: Any) -> dict[str, int]:
    """Check ``parallelism=dict(pp=..., dp_replicate=..., dp_shard=..., tp=...)`` (every key
    optional): positive ints, or ``-1`` for at most one of them. Returns the given keys."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(
            f"parallelism must be a dict of degrees, got {type(value).__name__}: {value!r}; "
            f"e.g. {_EXAMPLE}"
        )
    unknown = sorted(set(value) - set(DEGREE_NAMES))
    if unknown:
        raise ValueError(
            f"parallelism has unknown keys {unknown}; accepted: {list(DEGREE_NAMES)} "
            f"(e.g. {_EXAMPLE})"
        )
    for name, degree in value.items():
        if isinstance(degree, bool) or not isinstance(degree, int) or (degree < 1 and degree != -1):
            raise ValueError(
                f"parallelism {name}={degree!r} must be a positive int, or -1 for the rest of "
                f"the world; e.g. {_EXAMPLE}"
            )
    rest = [name for name, degree in value.items() if degree == -1]
    if len(rest) > 1:
        raise ValueError(
            f"parallelism gives -1 (the rest of the world) for {rest}; at most one degree can be -1"
        )
    return dict(value)


def resolve_degrees(
    parallelism: Any,
    *,
    mesh_kind: str,
    replicate_size: int | None,
    world_size: int,
    local_size: int,
) -> Degrees:
    """The degrees of a run of ``world_size`` ranks (``local_size`` per node).

    ``mesh_kind`` and ``replicate_size`` come from FSDP's ``sharding_strategy``: ``'shard'``
    (FULL_SHARD, SHARD_GRAD_OP) leaves the data-parallel degrees to ``parallelism`` (by
    default ``dp_shard`` takes the rest); ``'hybrid'`` (HYBRID_SHARD) sets ``dp_replicate``
    to ``replicate_size`` (default: the number of nodes) and ``dp_shard`` to the rest;
    ``'replicate'`` (NO_SHARD) sets ``dp_shard=1``. Refuses degrees whose product is not the
    world size, naming them and the fix.
    """
    given = parse_parallelism(parallelism)
    degrees: dict[str, int] = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1}
    data_keys = sorted({"dp_replicate", "dp_shard"} & set(given))
    if mesh_kind != "shard" and data_keys:
        raise ValueError(
            f"model_wrapper's sharding_strategy already sets the data-parallel degrees, and "
            f"parallelism sets {data_keys} too; give them in one place: drop "
            f"{data_keys} from parallelism, or the sharding_strategy (parallelism="
            "dict(dp_replicate=2, dp_shard=-1) is HYBRID_SHARD with replicate_size=2)"
        )
    for name in ("tp", "pp"):
        if mesh_kind != "shard" and given.get(name) == -1:
            raise ValueError(
                f"parallelism {name}=-1 leaves two degrees to the world with the "
                f"sharding_strategy's data-parallel ones; give {name} as a number, e.g. "
                f"parallelism=dict({name}=2)"
            )
    pp = given.get("pp", 1)
    if mesh_kind == "hybrid":
        size, tp = replicate_size or max(world_size // local_size, 1), given.get("tp", 1) * pp
        if world_size % (size * tp):
            raise ValueError(
                f"HYBRID_SHARD with replicate_size={size} needs a world size divisible by "
                f"{'it' if tp == 1 else f'it times tp × pp = {tp}'}, but {world_size} ranks "
                "run; set "
                f"model_wrapper=dict(replicate_size=...) to a divisor of {world_size // tp} or "
                f"launch a multiple of {size * tp} ranks"
            )
        degrees.update(pp=pp, dp_replicate=size, dp_shard=-1, tp=given.get("tp", 1))
    elif mesh_kind == "replicate":
        degrees.update(pp=pp, dp_replicate=-1, tp=given.get("tp", 1))
    else:
        degrees.update(given)
        if -1 not in given.values() and "dp_shard" not in given:
            degrees["dp_shard"] = -1
    if -1 in degrees.values():
        rest = next(name for name, degree in degrees.items() if degree == -1)
        known = math.prod(d for d in degrees.values() if d != -1)
        if world_size % known:
            raise ValueError(
                f"{_describe(degrees)} needs a world size divisible by {known}, but "
                f"{world_size} rank(s) run; launch a multiple of {known} ranks or change the "
                "degrees"
            )
        degrees[rest] = world_size // known
    if math.prod(degrees.values()) != world_size:
        raise ValueError(
            f"{_describe(degrees)} needs {'pp × ' if degrees['pp'] > 1 else ''}"
            "dp_replicate × dp_shard × tp = "
            f"{math.prod(degrees.values())} ranks, but {world_size} rank(s) run; launch "
            f"{math.prod(degrees.values())} ranks, or set one degree to -1 (the rest of the "
            f"world), e.g. {_EXAMPLE}"
        )
    hybrid = mesh_kind != "shard" or degrees["dp_replicate"] > 1
    return Degrees(**degrees, hybrid=hybrid)


def _describe(degrees: Mapping[str, int]) -> str:
    shown = {k: v for k, v in degrees.items() if k != "pp" or v != 1}
    return "parallelism=dict(" + ", ".join(f"{k}={v}" for k, v in shown.items()) + ")"


def build_device_mesh(device_type: str, degrees: Degrees) -> DeviceMesh:
    """The run's mesh, one named dimension per degree (:attr:`Degrees.dim_names`):
    ``('dp_shard',)``, ``('dp_replicate', 'dp_shard')``, with ``'tp'`` last when ``tp > 1``
    and ``'pp'`` first when ``pp > 1``."""
    return init_device_mesh(device_type, degrees.shape, mesh_dim_names=degrees.dim_names)


def data_parallel_mesh(mesh: DeviceMesh, degrees: Degrees) -> DeviceMesh:
    """The (sub)mesh ``fully_shard`` works on: the data-parallel dimensions of ``mesh``."""
    return _submesh(mesh, degrees, degrees.dp_dim_names)


def stage_mesh(mesh: DeviceMesh, degrees: Degrees) -> DeviceMesh:
    """The (sub)mesh one pipeline stage is parallelised over: every dimension but ``pp``."""
    return _submesh(mesh, degrees, degrees.stage_dim_names)


def _submesh(mesh: DeviceMesh, degrees: Degrees, names: tuple[str, ...]) -> DeviceMesh:
    if degrees.dim_names == names:
        return mesh
    return mesh[names[0]] if len(names) == 1 else mesh[names]
