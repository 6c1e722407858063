"""Which checkpoint a run resumes from: the newest committed one in its ``work_dir``.

``work_dir/last_checkpoint`` names the checkpoint committed last; the commit protocol writes it
right after the rename that commits a checkpoint. It can still be wrong: a crash between the
rename and the update leaves it naming the previous checkpoint, and a checkpoint deleted by
hand leaves it dangling. So the committed checkpoints (those with a manifest) beside it are
looked at too:

- ``last_checkpoint`` names a checkpoint that exists and nothing was committed after the
  pointer was written: that checkpoint;
- a checkpoint was committed after the pointer was written (its manifest is newer): that one,
  with a warning naming both;
- the pointer dangles (or is missing): the newest committed checkpoint, with a warning naming
  both; none at all: None (with a warning if files that look like checkpoints are there: a run
  asked to resume never restarts from scratch silently).

Example::

    >>> find_last_checkpoint('work_dirs/demo')
    '/abs/work_dirs/demo/iter_3000.pth'
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .files import LAST_CHECKPOINT, replaced_path
from .manifest import is_committed, manifest_path

__all__ = ["LAST_CHECKPOINT", "committed_checkpoints", "find_last_checkpoint"]

_CHECKPOINT_SUFFIXES = (".pth", ".pt", ".ckpt", ".safetensors")

logger = logging.getLogger(__name__)


def committed_checkpoints(*directories: str | os.PathLike[str]) -> list[Path]:
    """The committed checkpoints directly inside ``directories``, oldest commit first (by the
    time their manifest was written)."""
    found: dict[Path, int] = {}
    for directory in map(Path, directories):
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if entry.name.startswith(".") or entry.name.endswith(".json"):
                continue
            if is_committed(entry):
                found[entry.absolute()] = manifest_path(entry).stat().st_mtime_ns
    return sorted(found, key=lambda path: (found[path], path.name))


def _pointer(work_dir: Path) -> tuple[Path | None, int]:
    """The path ``last_checkpoint`` names (absolute) and when it was written."""
    record = work_dir / LAST_CHECKPOINT
    if not record.is_file():
        return None, 0
    try:
        target = record.read_bytes().decode().strip()
    except UnicodeDecodeError:
        target = "\0"
    if "\0" in target:  # bit rot (a path holds neither): as if it named nothing
        logger.warning("%s is damaged (not a path): ignoring it", record)
        return None, 0
    if not target:
        return None, 0
    path = Path(target)
    return (path if path.is_absolute() else work_dir / path), record.stat().st_mtime_ns


def find_last_checkpoint(work_dir: str | os.PathLike[str]) -> str | None:
    """The newest committed checkpoint of ``work_dir`` (see the module docstring), or None if
    there is none. If a crash interrupted the overwrite of the one ``last_checkpoint`` names
    (it is still under its ``.NAME.replaced`` name, which the next save moves back), that
    path. A work_dir on object storage, or whose ``last_checkpoint`` names a URL:
    :func:`.object_commit.find_last_checkpoint_at`."""
    if _on_object_storage(work_dir):
        from .object_commit import find_last_checkpoint_at

        return find_last_checkpoint_at(work_dir)
    work_dir = Path(work_dir)
    pointed, written = _pointer(work_dir)
    folders = [work_dir] + ([pointed.parent] if pointed is not None else [])
    committed = committed_checkpoints(*dict.fromkeys(folders))
    newest = committed[-1] if committed else None
    if pointed is not None and pointed.exists():
        later = [p for p in committed if manifest_path(p).stat().st_mtime_ns > written]
        if later and later[-1] != pointed.absolute():
            logger.warning(
                "%s names %s, but %s was committed after it was written (a crash between that "
                "commit and the update of %s?): resuming from the newest, %s",
                LAST_CHECKPOINT,
                pointed,
                later[-1],
                LAST_CHECKPOINT,
                later[-1],
            )
            return str(later[-1])
        return str(pointed)
    if pointed is not None and replaced_path(pointed).exists():
        return str(replaced_path(pointed))  # a crash while it was being overwritten: the old one
    if newest is not None:
        logger.warning(
            "%s; the newest committed checkpoint in %s is %s: resuming from it",
            f"{LAST_CHECKPOINT} names {pointed}, which does not exist"
            if pointed is not None
            else f"{work_dir} has no {LAST_CHECKPOINT}",
            newest.parent,
            newest,
        )
        return str(newest)
    hint = _uncommitted_hint(work_dir)
    if hint is not None:
        logger.warning("%s", hint)
    return None


def _on_object_storage(work_dir: str | os.PathLike[str]) -> bool:
    """Whether ``work_dir`` is a URL, or a local directory whose pointer names one."""
    from .storage import is_url

    if is_url(work_dir):
        return True
    try:
        return is_url((Path(work_dir) / LAST_CHECKPOINT).read_text(errors="replace").strip())
    except OSError:
        return False


def _uncommitted_hint(work_dir: str | os.PathLike[str]) -> str | None:
    """What to tell a user whose resume found no committed checkpoint although ``work_dir``
    holds files that look like checkpoints (None: it holds none)."""
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return None
    lookalikes = sorted(
        entry.name
        for entry in work_dir.iterdir()
        if not entry.name.startswith(".") and entry.name.endswith(_CHECKPOINT_SUFFIXES)
    )
    if not lookalikes:
        return None
    return (
        f"{work_dir} holds {', '.join(lookalikes[:10])}{', ...' if len(lookalikes) > 10 else ''}"
        " but no committed checkpoint (none has a manifest), so there is nothing to resume "
        "from. To resume from one of them, pass resume='PATH' (or --resume PATH)"
    )
