"""The commit protocol on object storage, where nothing renames and listing is no lock.

On local disk a checkpoint is written under a staging name and renamed into place
(:mod:`.commit`). An object store has no rename: an object appears whole when its upload ends,
and a prefix is only a name. So a checkpoint at a URL is committed by its manifest, written
last:

1. every rank writes its part with the local writers, into a spool directory of its own
   (:func:`~.storage.spool_directory`: the same bytes, checksummed while written), and the
   ranks agree that they did (the training thread's one step in an asynchronous save);
2. rank 0 prepares the prefix: it checks that this run may write there (:class:`RunClaims`),
   removes what interrupted saves left, writes a marker ``.NAME.partial`` naming the save in
   progress, and, to overwrite a committed ``NAME``, deletes its manifest (the old checkpoint
   is no longer committed) and then its objects; the ranks agree;
3. every rank uploads its files, several at a time (large ones in parts), and the ranks agree
   (each rank's error, and the sizes and checksums of what it uploaded);
4. rank 0 writes the manifest (every object's size and checksum, a sequence number and the
   run), which commits the checkpoint; then ``last_checkpoint``; then it removes the marker
   and deletes what retention retires (each one marked, its manifest first).

A checkpoint without its manifest is never loaded (:func:`find_last_checkpoint_at` and
``shardwise ckpt verify`` see no committed checkpoint) and the next save deletes it, since
its marker names it; objects that no marker names and no manifest commits are someone
else's, and a save refuses to replace them. A save that fails on any rank deletes what it
uploaded and commits nothing.

Two runs must not write one prefix (their checkpoints, ``last_checkpoint`` and retention
would mix): the first save of a run claims the prefix with an object ``.shardwise-owner.json``
written only if absent (or, to take over, only if unchanged since read: conditional writes);
a run may take over only what it continues: a prefix whose newest committed checkpoint it
resumed from, or one with no committed checkpoint. At each commit rank 0 checks the claim is
still its own. A run that finds another's claim is refused, in one line naming it.

Example::

    commit = ObjectCommit('s3://bucket/run/iter_10.pth', work_dir='s3://bucket/run')
    with commit as staging:                     # a local spool path
        commit.record(*fmt.write(state, staging, rank=rank))
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch.distributed as dist

from .agreement import gather_outcomes, raise_if_any
from .commit import CheckpointCommit
from .files import (
    LAST_CHECKPOINT,
    SIDECAR_SUFFIX,
    STAGING_SUFFIX,
    CheckpointError,
    atomic_write_text,
    describe_error,
)
from .manifest import ALGORITHM, MANIFEST, file_checksum, read_manifest
from .storage import (
    ObjectURL,
    delete_objects,
    etag,
    is_url,
    list_objects,
    location,
    modified,
    object_info,
    read_object,
    spool_directory,
    upload_files,
    write_object,
)

__all__ = [
    "PrefixClaimedError",
    "OWNER",
    "ObjectCommit",
    "commit_for",
    "RunClaims",
    "commit_time",
    "committed_checkpoints_at",
    "find_last_checkpoint_at",
    "publish_checkpoint",
    "remove_checkpoint_at",
]

logger = logging.getLogger(__name__)

#: The object naming the run that writes a prefix.
OWNER = ".shardwise-owner.json"
_Outcome = tuple[str | None, dict[str, dict[str, Any]]]


def _marker(final: ObjectURL) -> ObjectURL:
    return final.with_name(f".{final.name}{STAGING_SUFFIX}")


def _dumps(value: Any) -> bytes:
    return (json.dumps(value, indent=1) + "\n").encode()


class Listing:
    """The objects under a prefix (one listing), read as checkpoints: names directly in the
    prefix, each a single object or a "directory" of objects."""

    def __init__(self, prefix: ObjectURL) -> None:
        self.prefix = prefix
        self.objects = list_objects(prefix)
        self.names = {rel.split("/", 1)[0] for rel in self.objects}

    def exists(self, name: str) -> bool:
        return name in self.names

    def committed(self, name: str) -> bool:
        """Whether ``name`` has its manifest (written last by the commit, whole or not at
        all)."""
        return f"{name}/{MANIFEST}" in self.objects or f"{name}{SIDECAR_SUFFIX}" in self.objects

    def manifest(self, name: str) -> str | None:
        for rel in (f"{name}/{MANIFEST}", f"{name}{SIDECAR_SUFFIX}"):
            if rel in self.objects:
                return rel
        return None

    def objects_of(self, name: str) -> list[str]:
        """The objects of the checkpoint ``name``, its manifest last."""
        found = [rel for rel in self.objects if rel == name or rel.startswith(name + "/")]
        manifest = self.manifest(name)
        found = [rel for rel in found if rel != manifest]
        return found + ([manifest] if manifest is not None else [])

    def markers(self) -> list[str]:
        """The checkpoints that a marker names (saves or deletions in progress)."""
        return sorted(
            rel[1 : -len(STAGING_SUFFIX)]
            for rel in self.objects
            if rel.startswith(".") and rel.endswith(STAGING_SUFFIX) and "/" not in rel
        )

    def checkpoints(self) -> list[str]:
        """The committed checkpoints directly in the prefix."""
        return sorted(
            name
            for name in self.names
            if not name.startswith(".") and not name.endswith(".json") and self.committed(name)
        )

    def newest(self, names: Sequence[str] | None = None) -> list[tuple[ObjectURL, dict]]:
        """The committed checkpoints (of ``names``), oldest commit first, with their manifest
        (read for the ones committed within two seconds of the newest, whose order the
        store's clock cannot tell apart: the manifest's sequence number does)."""
        names = self.checkpoints() if names is None else list(names)
        times = {n: modified(self.objects[self.manifest(n) or n]) for n in names}
        latest = max(times.values(), default=0.0)
        manifests: dict[str, dict] = {}
        for name in names:
            if times[name] >= latest - 2.0:
                try:
                    manifests[name] = json.loads(read_object(self.prefix / self.manifest(name)))
                except (FileNotFoundError, ValueError):
                    manifests[name] = {}
        order = sorted(
            names,
            key=lambda n: (
                times[n] >= latest - 2.0,
                int(manifests.get(n, {}).get("sequence") or 0),
                times[n],
                n,
            ),
        )
        return [(self.prefix / n, manifests.get(n, {})) for n in order]


# ----------------------------------------------------------------------------- run claims
class PrefixClaimedError(CheckpointError):
    """Another run writes this prefix: the save is refused (on every rank), before anything
    is uploaded. Bad input of the run (``shardwise train``: one line, exit code 2)."""


class RunClaims:
    """The prefixes this run writes (one per :class:`~.checkpointer.Checkpointer`; rank 0's
    counts): which it claimed, which checkpoints it resumed from, its last sequence number.
    See the module docstring."""

    def __init__(self, label: str = "") -> None:
        self.run = uuid.uuid4().hex[:16]
        #: How a person finds this run (the strategy gives its log folder).
        self.label = label
        self._owned: dict[str, str] = {}  # prefix -> the ETag of the claim this run wrote
        self._resumed: set[str] = set()
        self._sequence: dict[str, int] = {}
        self._continued: set[str] = set()  # the runs this one resumed from, by id

    def manifest_entry(self) -> dict[str, Any]:
        """The ``run`` a local checkpoint's manifest records: who committed it."""
        entry: dict[str, Any] = dict(id=self.run, host=socket.gethostname(), pid=os.getpid())
        if self.label:
            entry["label"] = self.label
        return entry

    def resumed_from(self, checkpoint: str | os.PathLike[str]) -> None:
        """This run resumed from ``checkpoint``: it may take over the prefix whose newest
        checkpoint that is, and it continues the run that committed it (which
        :meth:`another_runs` then does not count as another)."""
        if is_url(checkpoint):
            self._resumed.add(str(location(checkpoint)))
            return
        previous = _run_of(checkpoint)
        if previous is not None and previous.get("id"):
            self._continued.add(str(previous["id"]))

    def another_runs(self, checkpoint: Path) -> dict[str, Any] | None:
        """The run that committed the local ``checkpoint``, when it is neither this run nor
        one this run continues (``{}``: a manifest that does not say); None otherwise, or
        when nothing committed is there."""
        previous = _run_of(checkpoint)
        if previous is None or previous.get("id") in {self.run, *self._continued}:
            return None
        return previous

    def _record(self) -> bytes:
        return _dumps(
            dict(
                run=self.run,
                host=socket.gethostname(),
                pid=os.getpid(),
                since=time.strftime("%Y-%m-%d %H:%M:%S"),
            )
        )

    def claim(self, final: ObjectURL, listing: Listing) -> None:
        """Make sure this run may write ``final``'s prefix, claiming it on the first save
        (rank 0). Raises CheckpointError when another run writes there."""
        prefix = final.parent
        owner = prefix / OWNER
        info = object_info(owner)
        if str(prefix) in self._owned:
            if info is not None and etag(info) == self._owned[str(prefix)]:
                return
            raise self._refusal(final, owner, "took it over since this run's last save")
        newest = listing.newest()
        if info is not None:
            resumed = newest and str(newest[-1][0]) in self._resumed
            if newest and not resumed:
                raise self._refusal(final, owner, "has committed checkpoints there", newest)
        try:
            if info is None:
                write_object(owner, self._record(), if_absent=True)
            else:
                write_object(owner, self._record(), if_match=etag(info))
        except FileExistsError:
            raise self._refusal(final, owner, "claimed it a moment ago") from None
        mine = object_info(owner)
        self._owned[str(prefix)] = etag(mine) if mine is not None else ""
        if newest:
            self._sequence[str(prefix)] = int(newest[-1][1].get("sequence") or 0)

    def confirm(self, final: ObjectURL) -> None:
        """Before committing: the claim on ``final``'s prefix is still this run's."""
        owner = final.parent / OWNER
        info = object_info(owner)
        if info is None or etag(info) != self._owned.get(str(final.parent)):
            raise self._refusal(final, owner, "took it over while this checkpoint was written")

    def next_sequence(self, final: ObjectURL) -> int:
        """The sequence number of the next commit under ``final``'s prefix: the time in
        nanoseconds, past every one this run committed or found there."""
        key = str(final.parent)
        value = max(time.time_ns(), self._sequence.get(key, 0) + 1)
        self._sequence[key] = value
        return value

    def _refusal(
        self, final: ObjectURL, owner: ObjectURL, did: str, newest: Any = None
    ) -> PrefixClaimedError:
        try:
            who = json.loads(read_object(owner))
            other = f"run {who.get('run')} (host {who.get('host')}, pid {who.get('pid')})"
        except (FileNotFoundError, ValueError, CheckpointError):
            other = "another run"
        hint = f" (its newest: {newest[-1][0]})" if newest else ""
        return PrefixClaimedError(
            f"refusing to save {final}: {other} writes {final.parent} and {did}{hint}; two "
            "runs writing one prefix would mix their checkpoints. Save to another work_dir, "
            "resume from the newest checkpoint there (resume=True, --resume) to continue "
            f"that run, or delete {owner} to start over there"
        )


# ----------------------------------------------------------------------------- the commit
class ObjectCommit:
    """One save to a URL through the commit protocol of the module docstring, with the
    interface of :class:`~.commit.CheckpointCommit` (a context manager, or :meth:`begin`
    then :meth:`finish`, possibly on another thread): :meth:`begin` returns a local spool
    path to write this rank's part under; :meth:`finish` uploads and commits.

    Args:
        final: the checkpoint's URL (an object, or a prefix for a directory format).
        work_dir: where ``last_checkpoint`` goes (a URL or a local directory); None: nowhere.
        group: the process group of the agreements (default: the world).
        is_dir: the checkpoint is a directory (a prefix of objects).
        retire: checkpoints rank 0 deletes once this one is committed (never ``final``).
        claims: the run's :class:`RunClaims` (one per Checkpointer).
    """

    def __init__(
        self,
        final: str,
        *,
        work_dir: str | os.PathLike[str] | None = None,
        group: dist.ProcessGroup | None = None,
        is_dir: bool = False,
        retire: Sequence[str | os.PathLike[str]] = (),
        claims: RunClaims | None = None,
    ) -> None:
        self.final = ObjectURL(str(final))
        self.work_dir = None if work_dir is None else location(work_dir)
        self.group = group
        self.is_dir = is_dir
        self.retire = [ObjectURL(str(p)) for p in retire if is_url(p)]
        self.claims = claims or RunClaims()
        self.staging = Path()
        self._spool: Path | None = None
        self._written: list[Path] = []
        self._hashed: dict[Path, str] = {}

    @property
    def _rank(self) -> int:
        return dist.get_rank(self.group) if dist.is_available() and dist.is_initialized() else 0

    def record(self, *paths: Any) -> None:
        """Note files this rank wrote under the staging path, with the checksum taken while
        writing them where they bring one (:class:`~.full.WrittenFile`)."""
        for item in paths:
            path = Path(getattr(item, "path", item)).absolute()
            self._written.append(path)
            checksum = getattr(item, "checksum", None)
            if checksum is not None:
                self._hashed[path] = checksum

    def begin(self, error: BaseException | None = None) -> Path:
        """Every rank makes its spool path; the ranks agree that they did (and on
        ``error``). Nothing is sent to the store yet. A collective."""
        if error is None:
            try:
                self._spool = spool_directory("save")
                self.staging = self._spool / self.final.name
                if self.is_dir:
                    self.staging.mkdir()
            except OSError as exc:
                error = exc
        what = f"saving {self.final}"
        try:
            message = None if error is None else describe_error(error)
            raise_if_any(gather_outcomes(message, self.group, what), what, error)
        except BaseException:
            self._remove_spool()
            raise
        return self.staging

    def finish(self, error: BaseException | None = None) -> None:
        """Prepare the prefix (rank 0), upload every rank's files, agree, commit (rank 0);
        or, when any rank failed, delete what was uploaded. Raises CheckpointError on every
        rank when any failed. Collectives."""
        try:
            self._finish(error)
        finally:
            self._remove_spool()

    def _finish(self, error: BaseException | None) -> None:
        saving = f"saving {self.final}"
        prepared = False
        if self._rank == 0 and error is None:
            try:
                self._prepare()
                prepared = True
            except Exception as exc:  # noqa: BLE001 - every rank learns of it below
                error = exc
        message = None if error is None else describe_error(error)
        refusal = str(error) if isinstance(error, PrefixClaimedError) else None
        outcomes = gather_outcomes((message, refusal), self.group, saving)
        refusals = [text for _, text in outcomes if text is not None]
        if refusals:  # rank 0's refusal, as it is, on every rank
            raise error if refusal is not None else PrefixClaimedError(refusals[0])
        try:
            raise_if_any([text for text, _ in outcomes], saving, error)
        except CheckpointError:
            if prepared:
                self._discard()
            raise
        digests: dict[str, dict[str, Any]] = {}
        try:
            digests = self._upload()
        except Exception as exc:  # noqa: BLE001 - every rank learns of it below
            error = exc
        message = None if error is None else describe_error(error)
        outcomes: list[_Outcome] = gather_outcomes((message, digests), self.group, saving)
        errors = [err for err, _ in outcomes]
        commit_error = None
        if self._rank == 0:
            try:
                if any(err is not None for err in errors):
                    self._discard()
                else:
                    merged = {k: v for _, d in outcomes for k, v in d.items()}
                    self._commit(merged)
            except Exception as exc:  # noqa: BLE001 - every rank learns of it below
                commit_error = exc
        committing = f"committing {self.final}"
        message = None if commit_error is None else describe_error(commit_error)
        commit_errors = gather_outcomes(message, self.group, committing)
        raise_if_any(errors, saving, error)
        raise_if_any(commit_errors, committing, commit_error)

    # ------------------------------------------------------------------ the steps
    def _prepare(self) -> None:
        """Rank 0: the claim, leftovers, refusal of what is not ours, the marker, and an
        overwrite's old checkpoint decommitted and deleted."""
        listing = Listing(self.final.parent)
        self.claims.claim(self.final, listing)
        name = self.final.name
        if listing.exists(name) and not listing.committed(name) and name not in listing.markers():
            raise CheckpointError(
                f"refusing to save to {self.final}: objects are there that are not a committed "
                "shardwise checkpoint (no manifest, and no save of shardwise left them), and "
                "saving would replace them. Save under another name or delete them"
            )
        clean_leftovers_at(listing)
        write_object(_marker(self.final), _dumps(dict(run=self.claims.run, what="save")))
        if listing.committed(name):  # an overwrite: the old one stops being committed first
            _delete(listing.prefix, listing.objects_of(name)[::-1])

    def _upload(self) -> dict[str, dict[str, Any]]:
        """This rank's files, uploaded; their manifest entries."""
        if self.is_dir:
            files = sorted(p for p in self.staging.rglob("*") if p.is_file())
        else:
            files = [self.staging] if self.staging.is_file() else []
        digests, pairs = {}, []
        for path in files:
            if path == self.staging:
                name, url = self.final.name, self.final
            else:
                name = path.relative_to(self.staging).as_posix()
                url = self.final / name
            checksum = self._hashed.get(path.absolute()) or file_checksum(path)
            digests[name] = {"size": path.stat().st_size, ALGORITHM: checksum}
            pairs.append((path, url))
        upload_files(pairs)
        return digests

    def _commit(self, files: dict[str, dict[str, Any]]) -> None:
        """Rank 0: the manifest (the commit), ``last_checkpoint``, the marker removed, the
        retired checkpoints deleted."""
        self.claims.confirm(self.final)
        manifest = dict(
            manifest_version=1,
            algorithm=ALGORITHM,
            created=time.strftime("%Y-%m-%d %H:%M:%S"),
            files=dict(sorted(files.items())),
            sequence=self.claims.next_sequence(self.final),
            run=self.claims.run,
        )
        target = self.final / MANIFEST if self.is_dir else self.final + SIDECAR_SUFFIX
        write_object(target, _dumps(manifest))
        if self.work_dir is not None:
            write_pointer(self.work_dir, self.final)
        delete_objects([_marker(self.final)])
        for old in self.retire:
            if old == self.final:
                continue
            try:
                deleted = remove_checkpoint_at(old, run=self.claims.run)
            except (OSError, CheckpointError) as exc:  # committed: do not fail the save
                logger.warning("Could not delete the outdated checkpoint %s: %s", old, exc)
            else:
                if deleted:
                    logger.info("Deleted the outdated checkpoint %s (max_keep_ckpts)", old)

    def _discard(self) -> None:
        """Rank 0: delete what this save uploaded, then its marker (nothing was committed)."""
        try:
            listing = Listing(self.final.parent)
            if not listing.committed(self.final.name):
                _delete(listing.prefix, listing.objects_of(self.final.name))
            delete_objects([_marker(self.final)])
        except (OSError, CheckpointError) as exc:  # the next save cleans up (the marker)
            logger.warning("Could not delete the failed save's objects of %s: %s", self.final, exc)

    def _remove_spool(self) -> None:
        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
            self._spool = None

    def __enter__(self) -> Path:
        return self.begin()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc_type is not None and not issubclass(exc_type, Exception):
            self._remove_spool()
            return False  # KeyboardInterrupt & co.: no collective; the marker tells the next save
        self.finish(exc)
        return False


def _run_of(checkpoint: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``run`` recorded in a local checkpoint's manifest (``{}`` when it has none, with
    the manifest's ``created``); None when it is not committed."""
    try:
        manifest = read_manifest(checkpoint)
    except CheckpointError:
        return None
    if manifest is None:
        return None
    run = manifest.get("run")
    found = dict(run) if isinstance(run, dict) else {}
    found.setdefault("created", manifest.get("created"))
    return found


def commit_for(
    path: Path | ObjectURL,
    work_dir: Path | ObjectURL | None,
    claims: RunClaims,
    is_dir: bool = False,
    retire: Sequence[str | os.PathLike[str]] = (),
    group: dist.ProcessGroup | None = None,
) -> CheckpointCommit | ObjectCommit:
    """The commit protocol of a save to ``path``: :class:`~.commit.CheckpointCommit` (it
    renames) on local disk, :class:`ObjectCommit` (the manifest last) at a URL, for the run
    whose ``claims`` these are. ``last_checkpoint`` goes to ``work_dir`` (a local save's only
    to a local one)."""
    if isinstance(path, ObjectURL):
        return ObjectCommit(
            path, work_dir=work_dir, group=group, is_dir=is_dir, retire=retire, claims=claims
        )
    local = work_dir if isinstance(work_dir, Path) else None
    return CheckpointCommit(
        path,
        work_dir=local,
        group=group,
        is_dir=is_dir,
        retire=retire,
        run=claims.manifest_entry(),
    )


def _delete(prefix: ObjectURL, names: Sequence[str]) -> None:
    """Delete objects of ``prefix`` in order (a manifest first deletes as one request)."""
    if names:
        delete_objects([prefix / rel for rel in names])


def clean_leftovers_at(listing: Listing) -> list[str]:
    """Delete what interrupted saves and deletions left in a prefix: the checkpoints their
    markers name that are not committed (a save that did not finish), or were being deleted;
    markers of finished saves; manifests beside a single object that is gone. Returns the
    checkpoints removed."""
    removed = []
    for name in listing.markers():
        marker = listing.prefix / f".{name}{STAGING_SUFFIX}"
        try:
            what = json.loads(read_object(marker)).get("what")
        except (FileNotFoundError, ValueError):
            what = "save"
        if what == "delete" or not listing.committed(name):
            _delete(listing.prefix, listing.objects_of(name)[::-1])
            removed.append(name)
        delete_objects([marker])
    for rel in listing.objects:
        if "/" not in rel and rel.endswith(SIDECAR_SUFFIX) and not rel.startswith("."):
            base = rel[: -len(SIDECAR_SUFFIX)]
            if base and base not in listing.names:
                delete_objects([listing.prefix / rel])
                removed.append(rel)
    return removed


def remove_checkpoint_at(url: str, run: str = "") -> bool:
    """Delete the committed checkpoint at ``url`` (retention): a marker first, then its
    manifest (it is no longer committed), its objects, the marker; a crash in between leaves
    the marker, and the next save finishes the deletion. One that is not committed is left
    alone (False)."""
    url = ObjectURL(url)
    listing = Listing(url.parent)
    if not listing.exists(url.name):
        return False
    if not listing.committed(url.name):
        logger.warning("Not deleting the outdated checkpoint %s: it has no manifest", url)
        return False
    write_object(_marker(url), _dumps(dict(run=run, what="delete")))
    _delete(listing.prefix, listing.objects_of(url.name)[::-1])
    delete_objects([_marker(url)])
    return True


def write_pointer(work_dir: ObjectURL | Path, checkpoint: ObjectURL) -> None:
    """``work_dir/last_checkpoint`` names ``checkpoint`` (an object's whole write, or the
    local atomic replace)."""
    if isinstance(work_dir, ObjectURL):
        write_object(work_dir / LAST_CHECKPOINT, str(checkpoint).encode())
    else:
        work_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(work_dir / LAST_CHECKPOINT, str(checkpoint))


# ----------------------------------------------------------------------------- which is last
def read_pointer(work_dir: str | os.PathLike[str]) -> ObjectURL | None:
    """The URL ``work_dir/last_checkpoint`` names (work_dir a URL or a local directory), or
    None (no pointer, or one naming a local path)."""
    where = location(work_dir)
    try:
        if isinstance(where, ObjectURL):
            text = read_object(where / LAST_CHECKPOINT).decode("utf-8", "replace")
        else:
            text = (where / LAST_CHECKPOINT).read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    text = text.strip()
    return ObjectURL(text) if is_url(text) else None


def committed_checkpoints_at(prefix: str) -> list[ObjectURL]:
    """The committed checkpoints directly under ``prefix``, oldest commit first."""
    return [url for url, _ in Listing(ObjectURL(prefix)).newest()]


def find_last_checkpoint_at(work_dir: str | os.PathLike[str]) -> str | None:
    """The newest committed checkpoint of a work_dir on object storage, or of the prefix a
    local work_dir's ``last_checkpoint`` names (a URL): the one the pointer names when
    nothing was committed after it, else the newest (with a warning naming both)."""
    where = location(work_dir)
    pointed = read_pointer(where)
    prefix = pointed.parent if pointed is not None else where
    if not isinstance(prefix, ObjectURL):
        return None
    newest = Listing(prefix).newest()
    if not newest:
        if pointed is not None:
            logger.warning("%s names %s, which is not committed", LAST_CHECKPOINT, pointed)
        return None
    last = newest[-1][0]
    if pointed is not None and pointed != last:
        logger.warning(
            "%s names %s, but the newest committed checkpoint in %s is %s: resuming from it",
            LAST_CHECKPOINT,
            pointed,
            prefix,
            last,
        )
    return str(last)


def commit_time(checkpoint: str) -> float:
    """When the checkpoint at ``checkpoint`` (a URL) was committed: its manifest's time (0
    when it has none)."""
    url = ObjectURL(checkpoint)
    for manifest in (url / MANIFEST, ObjectURL(url + SIDECAR_SUFFIX)):
        info = object_info(manifest)
        if info is not None:
            return modified(info)
    return 0.0


def publish_checkpoint(local: Path, url: str) -> ObjectURL:
    """Upload a committed checkpoint from local disk to ``url`` (``shardwise ckpt
    convert`` to a URL): its files, then its manifest (the commit). ``url`` must not hold
    objects yet."""
    from .manifest import read_manifest

    url = ObjectURL(url)
    manifest = read_manifest(local)
    if manifest is None:
        raise CheckpointError(f"{local} has no manifest to publish it with")
    listing = Listing(url.parent)
    if listing.exists(url.name):
        raise FileExistsError(f"{url} exists; delete it first or choose another name")
    write_object(_marker(url), _dumps(dict(run="publish", what="save")))
    if local.is_dir():
        pairs = [(local / rel, url / rel) for rel in manifest["files"]]
        target = url / MANIFEST
    else:
        pairs = [(local, url)]
        manifest["files"] = {url.name: next(iter(manifest["files"].values()))}
        target = ObjectURL(url + SIDECAR_SUFFIX)
    upload_files(pairs)
    manifest["sequence"] = time.time_ns()
    write_object(target, _dumps(manifest))
    delete_objects([_marker(url)])
    return url
