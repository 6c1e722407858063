"""Describe a checkpoint without loading its tensors.

:func:`inspect_checkpoint` returns a JSON-ready summary — format, files, who saved it (strategy,
world size, shardwise version, time), the training position (epoch / iter / step) when ``meta``
records one, totals by state and dtype, and every model and optimizer tensor's shape, dtype
and size — read from the checkpoint's metadata alone (see
:func:`~shardwise.checkpoint.formats.open_checkpoint`). A checkpoint saved from a DeviceMesh
records the mesh and each DTensor parameter's placements in ``meta`` (``mesh``,
``placements``); they are shown with the model tensors.
:func:`format_inspection` renders it for a terminal: a summary with the largest tensors, or
every tensor (``tensors=True``, ``shardwise ckpt inspect --tensors``).

Example::

    >>> summary = inspect_checkpoint('work_dirs/demo/epoch_1.pth')
    >>> summary['format'], summary['world_size'], summary['tensor_count']
    ('sharded', 2, 25)
    >>> print(format_inspection(summary))
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .formats import LOCAL, open_checkpoint
from .manifest import manifest_path
from .opened import MODEL, TENSOR_SECTIONS, TensorInfo

__all__ = ["format_inspection", "inspect_checkpoint"]

_POSITION_KEYS = ("epoch", "iter", "step")
#: How many tensors the summary lists (the largest); ``tensors=True`` lists every one.
LARGEST = 10
_SAVED_BY_KEYS = ("strategy", "shardwise_version", "time", "seed")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_entry(info: TensorInfo, placements: dict[str, Any]) -> dict[str, Any]:
    entry = dict(
        key=info.key,
        section=info.section,
        name=info.name,
        shape=list(info.shape),
        dtype=_dtype_name(info.dtype),
        numel=info.numel,
        nbytes=info.nbytes,
    )
    if info.section == MODEL and info.name in placements:
        entry["placements"] = placements[info.name]
    return entry


def _saved_mesh(meta: dict[str, Any]) -> dict[str, int] | None:
    """``meta['mesh']`` (dimension name -> size) when it is one."""
    mesh = meta.get("mesh")
    if isinstance(mesh, dict) and all(isinstance(n, int) for n in mesh.values()):
        return {str(k): v for k, v in mesh.items()}
    return None


def _saved_placements(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta['placements']`` by parameter name, the well-formed entries only:
    ``dict(mesh=[dimension names], placements=[one string per dimension])``."""
    recorded = meta.get("placements")
    if not isinstance(recorded, dict):
        return {}
    return {
        str(name): dict(
            mesh=[str(d) for d in v["mesh"]], placements=[str(p) for p in v["placements"]]
        )
        for name, v in recorded.items()
        if isinstance(v, dict)
        and isinstance(v.get("mesh"), list | tuple)
        and isinstance(v.get("placements"), list | tuple)
    }


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, TensorInfo | torch.Tensor):
        return f"<tensor {_dtype_name(value.dtype)} {list(value.shape)}>"
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return repr(value)


def _meta_summary(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` for display: RNG states and placements (shown with the tensors) are
    counted, not printed."""
    summary = {k: v for k, v in meta.items() if k not in ("rng_states", "placements")}
    if "rng_states" in meta:
        summary["rng_states"] = f"<{len(meta['rng_states'])} rank(s)>"
    if isinstance(meta.get("placements"), dict):
        summary["placements"] = f"<{len(meta['placements'])} parameter(s)>"
    return _jsonable(summary)


def inspect_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON-ready description of the checkpoint at ``path`` (full, sharded, local or
    safetensors); no tensor data is read.

    Raises:
        FileNotFoundError: nothing is at ``path``.
        CheckpointError: it is not a checkpoint, or is damaged.
    """
    path = Path(path)
    reader = open_checkpoint(path)
    meta = reader.meta
    base = path if path.is_dir() else path.parent
    files = [dict(name=name, size=(base / name).stat().st_size) for name in reader.files]
    tensors = reader.tensors()
    placements = _saved_placements(meta)
    sections = {
        section: dict(
            count=len(found := [t for t in tensors if t.section == section]),
            nbytes=sum(t.nbytes for t in found),
        )
        for section in TENSOR_SECTIONS
        if any(t.section == section for t in tensors)
    }
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    for t in tensors:  # by state (section), then dtype, in the order the tensors come
        entry = totals.setdefault(
            (t.section, _dtype_name(t.dtype)),
            dict(section=t.section, dtype=_dtype_name(t.dtype), count=0, numel=0, nbytes=0),
        )
        entry["count"] += 1
        entry["numel"] += t.numel
        entry["nbytes"] += t.nbytes
    world_size = meta.get("world_size")
    if reader.format is LOCAL and world_size is None:
        world_size = len(reader.index)
    if isinstance(world_size, str) and world_size.isdigit():  # safetensors metadata: strings
        world_size = int(world_size)
    summary: dict[str, Any] = dict(
        path=str(path.absolute()),
        format=reader.format.name,
        layout=reader.format.layout(len(files), len(reader.index) if reader.format is LOCAL else 1),
        files=files,
        size=sum(f["size"] for f in files),
        manifest=manifest_path(path).is_file(),
        world_size=world_size,
        mesh=_saved_mesh(meta),
        **{key: meta.get(key) for key in _SAVED_BY_KEYS},
        position={key: meta[key] for key in _POSITION_KEYS if key in meta},
        tensor_count=len(tensors),
        tensor_bytes=sum(t.nbytes for t in tensors),
        sections=sections,
        totals=sorted(totals.values(), key=lambda e: TENSOR_SECTIONS.index(e["section"])),
        other_keys=sorted(k for k in reader.skeleton if k not in (*TENSOR_SECTIONS, "meta")),
        tensors=[_tensor_entry(t, placements) for t in tensors],
        meta=_meta_summary(meta),
    )
    if reader.format is LOCAL:
        summary["ranks"] = [
            dict(
                rank=rank,
                file=rank_reader.path.name,
                tensor_count=len(rank_tensors := rank_reader.tensors()),
                tensor_bytes=sum(t.nbytes for t in rank_tensors),
            )
            for rank, rank_reader in reader.index.items()
        ]
        summary["shapes_are"] = "rank 0's shards"
    return _jsonable(summary)


def _size(nbytes: int) -> str:
    size = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def format_inspection(summary: dict[str, Any], tensors: bool = False) -> str:
    """:func:`inspect_checkpoint`'s summary as text for a terminal: what the checkpoint is,
    its totals by state and dtype and its :data:`LARGEST` largest tensors; every tensor, by
    state, with ``tensors=True``."""
    lines = [
        f"checkpoint  {summary['path']}",
        f"format      {summary['format']} ({summary['layout']}, {_size(summary['size'])}"
        + (", with manifest)" if summary["manifest"] else ", no manifest)"),
    ]
    saved_by = [
        f"{summary['strategy']}" if summary.get("strategy") else None,
        f"{summary['world_size']} rank(s)" if summary.get("world_size") is not None else None,
        f"shardwise {summary['shardwise_version']}" if summary.get("shardwise_version") else None,
        summary.get("time"),
    ]
    if any(saved_by):
        lines.append("saved by    " + ", ".join(str(s) for s in saved_by if s))
    if summary.get("mesh"):
        lines.append("mesh        " + ", ".join(f"{k}={v}" for k, v in summary["mesh"].items()))
    if summary.get("seed") is not None:
        lines.append(f"seed        {summary['seed']}")
    if summary["position"]:  # as meta records it (mmengine's keys)
        lines.append("position    " + ", ".join(f"{k} {v}" for k, v in summary["position"].items()))
    if summary["other_keys"]:
        lines.append("also holds  " + ", ".join(summary["other_keys"]))
    per_section = ", ".join(
        f"{name} {s['count']} ({_size(s['nbytes'])})" for name, s in summary["sections"].items()
    )
    lines.append(
        f"tensors     {summary['tensor_count']} ({_size(summary['tensor_bytes'])})"
        + (f": {per_section}" if per_section else "")
    )
    for rank in summary.get("ranks", []):
        lines.append(
            f"  {rank['file']:<12} {rank['tensor_count']} tensors ({_size(rank['tensor_bytes'])})"
        )
    if "shapes_are" in summary:
        lines.append(f"shapes below are {summary['shapes_are']}")
    if tensors:
        lines += _every_tensor(summary)
    else:
        lines += _totals(summary) + _largest(summary)
    return "\n".join(lines)


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    """``rows`` in aligned columns (the columns in ``right`` aligned right), indented."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  "
        + "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    ]


def _totals(summary: dict[str, Any]) -> list[str]:
    totals = summary.get("totals") or []
    if not totals:
        return []
    rows = [["state", "dtype", "tensors", "elements", "bytes"]]
    rows += [
        [t["section"], t["dtype"], str(t["count"]), f"{t['numel']:,}", _size(t["nbytes"])]
        for t in totals
    ]
    return ["", "totals by state and dtype:", *_table(rows, right={2, 3, 4})]


def _shape(t: dict[str, Any]) -> str:
    return "[" + ", ".join(str(d) for d in t["shape"]) + "]"


def _largest(summary: dict[str, Any]) -> list[str]:
    tensors = summary["tensors"]
    if not tensors:
        return []
    largest = sorted(tensors, key=lambda t: -t["nbytes"])[:LARGEST]
    rows = [
        [t["section"], t["name"], t["dtype"], _shape(t), _size(t["nbytes"])]
        + ([_layout(t["placements"])] if "placements" in t else [])
        for t in largest
    ]
    width = max(len(row) for row in rows)
    rows = [row + [""] * (width - len(row)) for row in rows]
    title = (
        f"the {len(largest)} largest of {len(tensors)} tensors (--tensors lists every one):"
        if len(largest) < len(tensors)
        else f"the {len(tensors)} tensors, largest first:"
    )
    return ["", title, *_table(rows, right={4})]


def _every_tensor(summary: dict[str, Any]) -> list[str]:
    lines = []
    for section in summary["sections"]:
        entries = [t for t in summary["tensors"] if t["section"] == section]
        width = max(len(t["name"]) for t in entries)
        shapes = [_shape(t) for t in entries]
        shape_width = max(len(shape) for shape in shapes)
        lines.append("")
        lines.append(f"{section}:")
        for t, shape in zip(entries, shapes):
            line = f"  {t['name']:<{width}}  {t['dtype']:<9} "
            if "placements" in t:  # aligned after the widest shape
                line += f"{shape:<{shape_width}}  {_layout(t['placements'])}"
            else:
                line += shape
            lines.append(line)
    return lines


def _layout(placements: dict[str, Any]) -> str:
    """``dp_shard×tp: _StridedShard(dim=0, sf=2), Shard(dim=0)``"""
    return "×".join(placements["mesh"]) + ": " + ", ".join(placements["placements"])
