"""``shardwise ckpt inspect|convert|verify|index``: look into, convert and check checkpoints.

Examples::

    shardwise ckpt inspect work_dirs/gpt/iter_1000.pth           # format, meta, mesh, totals
    shardwise ckpt inspect work_dirs/gpt/iter_1000.pth --tensors # and every tensor
    shardwise ckpt inspect work_dirs/gpt/iter_1000.pth --json    # the same, for scripts
    shardwise ckpt convert iter_1000.pth gpt.safetensors --to safetensors --dtype bf16
    shardwise ckpt convert iter_1000.pth iter_1000_full.pth --to full --model-only
    shardwise ckpt verify work_dirs/gpt/iter_1000.pth            # files, checksums, metadata
    shardwise ckpt index work_dirs/gpt/iter_1000.pth             # DCP's .metadata, for torch

Every PATH, SRC and DST may be an object-store URL (``s3://bucket/run/iter_1000.pth``): the
checkpoint is fetched into a temporary local copy (a converted one is uploaded, its manifest
last), and problems name the objects.

Exit status: 0 on success; 1 when a checkpoint is damaged or fails verification; 2 for bad
input (a missing path, an unknown option value, a destination that exists, a store that
cannot be reached).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["add_ckpt_parser"]

_DAMAGED, _BAD_INPUT = 1, 2
#: ``convert --to`` choices: the names of ``convert.TARGETS``, spelled out so that building the
#: parser imports no torch.
_TARGETS = ("full", "sharded", "safetensors")


def add_ckpt_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``shardwise ckpt``."""
    ckpt = sub.add_parser(
        "ckpt",
        help="inspect, convert and verify checkpoints (full, sharded, local, safetensors)",
        description="Look into, convert and check checkpoints: full (one file), sharded "
        "(a DCP directory), local (rank{i}.pth files) and safetensors.",
        epilog="examples:" + __doc__.split("Examples::")[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = ckpt.add_subparsers(dest="ckpt_command", required=True, metavar="COMMAND")

    inspect = commands.add_parser(
        "inspect",
        help="describe a checkpoint without loading its tensors",
        description="Print a checkpoint's format, files, meta (strategy, world size, "
        "epoch/iter as meta records them, the device mesh it was saved from), its tensors' "
        "totals by state and dtype and its 10 largest tensors; with --tensors every model and "
        "optimizer tensor's shape and dtype (and a model tensor's placements on the mesh). "
        "Read from the checkpoint's metadata only. A memory_checkpoint directory (e.g. "
        "/dev/shm/shardwise): each run's snapshots on this node, by owner rank and step.",
    )
    inspect.add_argument(
        "path",
        help="a checkpoint file or directory, a .safetensors file, or a memory_checkpoint dir",
    )
    inspect.add_argument(
        "--tensors",
        action="store_true",
        help="list every model and optimizer tensor (default: the 10 largest)",
    )
    inspect.add_argument(
        "--json", action="store_true", help="print everything as JSON (every tensor included)"
    )
    inspect.set_defaults(func=_inspect)

    convert = commands.add_parser(
        "convert",
        help="convert a checkpoint to full, sharded or safetensors (CPU, one process)",
        description="Convert a full or sharded checkpoint. The output appears under DST only "
        "once complete, with a manifest of its checksums. A safetensors file holds the model "
        "weights only and is written tensor by tensor (memory: the largest tensor).",
    )
    convert.add_argument("src", help="the checkpoint to convert (full or sharded)")
    convert.add_argument("dst", help="where to write the result (must not exist)")
    convert.add_argument("--to", required=True, choices=_TARGETS, help="the output format")
    convert.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "fp32"),
        help="cast the floating-point model weights (the optimizer state keeps its dtype)",
    )
    convert.add_argument(
        "--model-only",
        action="store_true",
        help="keep the model weights and meta; drop the optimizer, schedulers and extras",
    )
    convert.add_argument("--overwrite", action="store_true", help="replace DST if it exists")
    convert.add_argument(
        "--no-progress", action="store_true", help="no progress bar (drawn only on a terminal)"
    )
    convert.set_defaults(func=_convert)

    verify = commands.add_parser(
        "verify",
        help="check a checkpoint's files, checksums and metadata",
        description="Check that every file of a checkpoint is present with the size and "
        "checksum its manifest recorded at save time, and that its metadata is consistent "
        "(e.g. every file DCP's .metadata refers to exists). Without a manifest only the "
        "structural checks run. Exits 1 naming each bad file.",
    )
    verify.add_argument("path", help="a checkpoint file or directory, or a .safetensors file")
    verify.add_argument(
        "--write-manifest",
        action="store_true",
        help="after the checks pass, record the checksums of a checkpoint that has no "
        "manifest (or replace its manifest), so that later verifies compare against them",
    )
    verify.add_argument(
        "--no-progress", action="store_true", help="no progress bar (drawn only on a terminal)"
    )
    verify.set_defaults(func=_verify)

    index = commands.add_parser(
        "index",
        help="write DCP's .metadata into a sharded checkpoint, for torch's own tools",
        description="A sharded checkpoint is saved without a central gather: each rank "
        "writes its own metadata fragment (__{rank}.metadata) and shardwise reads only the "
        "fragments it needs. torch's own tools (torch.distributed.checkpoint.load, "
        "format_utils.dcp_to_torch_save) read one .metadata of every chunk: this merges the "
        "fragments into it (one process, off the training's critical path). shardwise "
        "itself never needs it.",
    )
    index.add_argument("path", help="a sharded checkpoint directory")
    index.set_defaults(func=_index)


def _status_of(error: Exception) -> int:
    """A checkpoint's error: damaged (1), or a store that cannot be reached (2, bad input)."""
    from .storage import StorageUnreachableError

    return _BAD_INPUT if isinstance(error, StorageUnreachableError) else _DAMAGED


def _error(command: str, message: Any, status: int) -> int:
    print(f"shardwise ckpt {command}: error: {message}", file=sys.stderr)
    return status


def _inspect(args: argparse.Namespace) -> int:
    from .files import CheckpointError
    from .inspect import format_inspection, inspect_checkpoint
    from .memory import format_memory, inspect_memory
    from .remote_read import local_checkpoint
    from .storage import is_url

    memory = None if is_url(args.path) else inspect_memory(args.path)
    if memory is not None:  # a memory_checkpoint directory: its snapshots on this node
        print(json.dumps(memory, indent=2) if args.json else format_memory(memory))
        return 0
    try:
        with local_checkpoint(args.path) as path:
            summary = inspect_checkpoint(path)
    except (FileNotFoundError, ValueError) as exc:
        return _error("inspect", exc, _BAD_INPUT)
    except CheckpointError as exc:
        return _error("inspect", exc, _status_of(exc))
    if is_url(args.path):
        summary["path"] = args.path
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_printable(format_inspection(summary, tensors=args.tensors)))
    return 0


def _printable(text: str) -> str:
    """``text`` as stdout can encode it (``dp_shard×tp`` becomes ``dp_shardxtp`` on ASCII)."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        text = text.replace("×", "x").encode(encoding, "replace").decode(encoding)
    except LookupError:  # an encoding Python does not know: leave it to print
        pass
    return text


def _convert(args: argparse.Namespace) -> int:
    from .convert import TARGETS, convert_checkpoint
    from .files import CheckpointError
    from .formats import SAFETENSORS
    from .remote_read import local_checkpoint

    if TARGETS[args.to] is SAFETENSORS and not args.model_only:
        print("note: a safetensors file holds the model weights only", file=sys.stderr)
    try:
        with local_checkpoint(args.src) as src, _local_destination(args.dst) as (dst, publish):
            dst = convert_checkpoint(
                src,
                dst,
                to=args.to,
                dtype=args.dtype,
                model_only=args.model_only,
                overwrite=args.overwrite,
                progress=not args.no_progress,
            )
            dst = publish(dst)
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        return _error("convert", exc, _BAD_INPUT)
    except CheckpointError as exc:
        return _error("convert", exc, _status_of(exc))
    print(f"wrote {dst} ({args.to})")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from .files import CheckpointError
    from .remote_read import local_checkpoint
    from .storage import is_url, location

    if args.write_manifest and is_url(args.path):
        return _error("verify", "--write-manifest writes local checkpoints only", _BAD_INPUT)
    try:
        with local_checkpoint(args.path) as path:
            return _verify_at(path, location(args.path), args)
    except (FileNotFoundError, ValueError) as exc:
        return _error("verify", exc, _BAD_INPUT)
    except CheckpointError as exc:
        return _error("verify", exc, _status_of(exc))


def _verify_at(path: Path, shown: Any, args: argparse.Namespace) -> int:
    """``ckpt verify`` of the checkpoint at ``path`` (a local copy of ``shown``, a URL, or
    ``shown`` itself): problems are reported under ``shown``'s name."""
    from .manifest import write_manifest
    from .progress import progress_bar
    from .verify import verify_checkpoint

    total = sum(p.stat().st_size for p in _files(path)) if path.exists() else 0
    bar = progress_bar(total, f"verify {path.name}", enabled=not args.no_progress)
    try:
        with bar:
            report = verify_checkpoint(path, on_bytes=bar.update)
    except FileNotFoundError as exc:
        return _error("verify", exc, _BAD_INPUT)
    for note in report.notes:
        print(f"note: {note}")
    if not report.ok:
        for problem in report.problems:
            if not problem.file:
                where = shown
            elif path.is_dir():
                where = shown / problem.file
            else:
                where = shown.with_name(problem.file)
            print(f"FAILED {where}: {problem.reason}", file=sys.stderr)
        return _error("verify", f"{shown} failed {len(report.problems)} check(s)", _DAMAGED)
    checked = f"checked against {report.manifest.name}" if report.manifest else "structure only"
    print(f"OK {shown} ({report.format}; {checked})")
    if args.write_manifest:
        print(f"recorded {write_manifest(path)}")
    return 0


def _index(args: argparse.Namespace) -> int:
    from .files import CheckpointError
    from .remote_read import local_checkpoint
    from .storage import ObjectURL, is_url, write_object

    try:
        with local_checkpoint(args.path) as path:
            status = _index_at(path)
            if status == 0 and is_url(args.path) and (path / ".metadata").is_file():
                write_object(ObjectURL(args.path) / ".metadata", (path / ".metadata").read_bytes())
                print(f"uploaded {ObjectURL(args.path) / '.metadata'}")
            return status
    except (FileNotFoundError, ValueError) as exc:
        return _error("index", exc, _BAD_INPUT)
    except CheckpointError as exc:
        return _error("index", exc, _status_of(exc))


def _index_at(path: Path) -> int:
    from .files import CheckpointError, require_checkpoint
    from .planning import is_fragmented, write_merged_metadata

    require_checkpoint(path)
    if not path.is_dir():
        return _error("index", f"{path} is not a sharded checkpoint directory", _BAD_INPUT)
    if not is_fragmented(path):
        if (path / ".metadata").is_file():
            print(f"{path} already has DCP's .metadata (saved through DCP's central planner)")
            return 0
        return _error(
            "index", f"{path} has no layout.json: not a sharded checkpoint of shardwise", _BAD_INPUT
        )
    try:
        written = write_merged_metadata(path)
    except CheckpointError as exc:
        return _error("index", exc, _status_of(exc))
    print(f"wrote {written}")
    return 0


@contextlib.contextmanager
def _local_destination(dst: str) -> Iterator[tuple[str, Callable[[Any], Any]]]:
    """Where ``ckpt convert`` writes, and what publishes it there: ``dst`` itself, or, for a
    URL, a temporary local path whose checkpoint is uploaded once complete."""
    from .storage import is_url, location

    if not is_url(dst):
        yield dst, lambda written: written
        return
    from .object_commit import publish_checkpoint

    with tempfile.TemporaryDirectory(prefix="shardwise-convert-") as local:
        yield (
            str(Path(local) / location(dst).name),
            lambda written: publish_checkpoint(Path(written), dst),
        )


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return [p for p in path.rglob("*") if p.is_file()]
    return [path]
