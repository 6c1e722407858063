"""The commit protocol on object storage, where nothing renames and listing is no lock.

On local disk a checkpoint is written under a staging name and renamed into place
(:mod:`.commit`). An object store has no rename: an object appears whole when its upload ends,
and a prefix is only a name. So a checkpoint at a URL is committed by its manifest, written
last:

1. every rank writes its part with the local writers, into a spool directory of its own
   (:func:`~.storage.spool_directory`: the same bytes, checksummed while written), and the
   ranks agree that they did (the training thread's one step in an asynchronous save);
2. rank 0 prepares the prefix: it checks that this run owns it (:class:`RunClaims`), removes
   what interrupted saves left, writes a marker ``.NAME.partial`` naming the save in progress
   (its run and claim), and, to overwrite ``NAME``, deletes its manifest (the old checkpoint
   is no longer committed) and then its objects; the ranks agree;
3. every rank uploads its files, several at a time (large ones in parts), and the ranks agree
   (each rank's error, and the sizes and checksums of what it uploaded);
4. rank 0 checks its claim again, then writes the manifest (every object's size and checksum,
   a sequence number and the run), which commits the checkpoint; then ``last_checkpoint``;
   then it removes the marker and deletes what retention retires (each one marked, its
   manifest first) while its claim still holds.

**Committed** means: the manifest exists *and* every object it names exists with the size and
the version (ETag) it records (:meth:`Listing.committed`). Only committed checkpoints are
listed, resumed from (:func:`find_last_checkpoint_at`) or counted as the newest. A listing
reads one level of the prefix (checkpoint names and markers: one LIST with a delimiter), the
manifests' times (one HEAD per checkpoint directory), and the manifests and objects only of
the candidates a caller needs (the newest, walking back past incomplete ones): its cost grows
with the checkpoints kept, not with their objects.

**Claims.** Two runs must not write one prefix (their checkpoints, ``last_checkpoint`` and
retention would mix). A run's first save there writes the owner object ``.shardwise-owner.json``
with a conditional write: only if absent, or, to take over, only if its ETag is still the one
read. The body carries a claim id new to that write; the run keeps the id it wrote (never
what a later read returns). A claim holds while the owner object's body carries that id.
Invariants, and why they hold:

- *At most one run owns a prefix*: ids are unique and the owner object holds one of them; a
  run acts as owner (clean-up, marker, manifest, retention) only right after reading its id
  there (:meth:`RunClaims.confirm`).
- *A lost response is not a refusal*: a conditional write whose response was lost is retried
  and answered 412; the run reads the owner object and, finding its own id, holds the claim.
- *Only committed checkpoints are resumed*, and a committed checkpoint is one save's: the
  manifest pins each object's ETag as listed just before the claim is checked, and is
  written only if absent (a late manifest of an overtaken save that lands first is deleted by
  the owner's commit and written again). A save overtaken by a takeover fails its check
  before the manifest; when its check passed just before the takeover (the window between
  the GET of the owner object and the manifest PUT: S3 has no write conditional on another
  object), its manifest may still land, naming objects the taker's clean-up removed or
  replaced: that checkpoint is not committed, and nothing resumes from it.
- *No run deletes the owner's save in flight*: a run deletes leftovers (right after
  confirming its claim, before its own marker), overwritten and retired checkpoints, and
  its own failed save only while it owns the prefix; the owner's clean-up deletes what the
  markers of earlier claims name (saves that can no longer commit) and aborts the incomplete
  multipart uploads under the prefix.
- *A run takes over only what it continues*: a prefix with no committed checkpoint, one whose
  newest committed checkpoint it resumed from, or (a rollback, below) one of its committed
  checkpoints that the run resumed from explicitly while newer ones were there. Otherwise the
  save is refused, in one line naming the owner.
- *No upload replaces another writer's object*: a run taken over in the middle of an
  upload's transfer goes on sending its bytes until it checks its claim, but every object is
  written only if absent (:func:`.storage.upload_files`); where both runs save one name at
  once, the one that comes second fails that save (``FileExistsError`` naming the object)
  and the other's object stays. A write whose response was lost, sent again by the client
  and refused, is recognised as the run's own by its bytes.

**Rolling a run back.** Resume explicitly from an older checkpoint of the prefix
(``resume='s3://bucket/run/iter_4.pth'``, ``--resume s3://bucket/run/iter_4.pth``); the first
save takes the prefix over with a new claim and logs one line naming the newer checkpoints.
They are kept, not deleted: the resumed line's saves are newer, so ``resume=True`` picks them
from its first save on, a save of the same name replaces one, and the others stay until
deleted by hand. A checkpoint that was the newest when resumed but no longer is at the first
save means another run committed meanwhile: that is refused, not a rollback.

**Stores without conditional writes.** The first claim of a run probes the store: a second
write only-if-absent of a probe object must be refused. A store that accepts it cannot keep
two runs apart; the save is refused, naming the store, unless ``SHARDWISE_SINGLE_WRITER=1``
(the user sees to it that one run writes each prefix), when claims are written
unconditionally, still checked before each commit, with one warning.

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
    abort_incomplete_uploads,
    delete_objects,
    etag,
    filesystem,
    is_url,
    list_objects,
    location,
    modified,
    object_info,
    read_object,
    retried,
    spool_directory,
    upload_files,
    write_object,
)

__all__ = [
    "PrefixClaimedError",
    "OWNER",
    "SINGLE_WRITER_ENV",
    "Listing",
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
#: Set to 1 to save to a store that ignores conditional writes (one run per prefix, unchecked).
SINGLE_WRITER_ENV = "SHARDWISE_SINGLE_WRITER"
_Outcome = tuple[str | None, dict[str, dict[str, Any]]]


def _marker(final: ObjectURL) -> ObjectURL:
    return final.with_name(f".{final.name}{STAGING_SUFFIX}")


def _dumps(value: Any) -> bytes:
    return (json.dumps(value, indent=1) + "\n").encode()


def _read_json(url: str) -> dict[str, Any]:
    """A small JSON object's content; ``{}`` when it is absent or not a JSON object."""
    try:
        value = json.loads(read_object(url))
    except (FileNotFoundError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _list_level(prefix: ObjectURL) -> dict[str, dict[str, Any]]:
    """What is directly in ``prefix``, by name: objects, and sub-prefixes (``type``
    ``'directory'``): one LIST with a delimiter, not the objects below them."""
    fs, path = filesystem(prefix)
    fs.invalidate_cache(path)
    try:
        entries = retried("listing", prefix, fs.ls, path, detail=True)
    except FileNotFoundError:
        return {}
    base = path.rstrip("/") + "/"
    return {e["name"][len(base) :].rstrip("/"): e for e in entries if e["name"].startswith(base)}


def _list_exact(url: ObjectURL) -> list[dict[str, Any]]:
    """What the store lists for the one object ``url`` (as a listing of its prefix shows it)."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    try:
        return [e for e in retried("listing", url, fs.ls, path, detail=True) if e["name"] == path]
    except FileNotFoundError:
        return []


def _fresh_info(url: ObjectURL) -> dict[str, Any] | None:
    """:func:`~.storage.object_info`, asked of the store (not of a listing fsspec cached)."""
    fs, path = filesystem(url)
    fs.invalidate_cache(path)
    return object_info(url)


def _same(info: dict[str, Any] | None, entry: dict[str, Any]) -> bool:
    """Whether a listed object is the one a manifest's ``entry`` records (its size, and its
    ETag where the manifest pinned one)."""
    if info is None or info.get("size") != entry.get("size"):
        return False
    return "etag" not in entry or etag(info) == entry["etag"]


class Listing:
    """A prefix read as checkpoints: what is directly in it (one listing), each name a single
    object or a "directory" of objects; manifests and objects read only when asked (see the
    module docstring)."""

    def __init__(self, prefix: ObjectURL) -> None:
        self.prefix = prefix
        self.entries = _list_level(prefix)
        self.names = set(self.entries)
        self._manifests: dict[str, tuple[str, dict[str, Any]] | None] = {}
        self._contents: dict[str, dict[str, Any]] = {}
        self._committed: dict[str, bool] = {}

    def exists(self, name: str) -> bool:
        return name in self.names

    def _is_dir(self, name: str) -> bool:
        return self.entries.get(name, {}).get("type") == "directory"

    def _manifest_info(self, name: str) -> tuple[str, dict[str, Any]] | None:
        if name not in self._manifests:
            sidecar = f"{name}{SIDECAR_SUFFIX}"
            found = None
            if self._is_dir(name):
                info = _fresh_info(self.prefix / name / MANIFEST)
                found = None if info is None else (f"{name}/{MANIFEST}", info)
            elif sidecar in self.entries:
                found = (sidecar, self.entries[sidecar])
            self._manifests[name] = found
        return self._manifests[name]

    def manifest(self, name: str) -> str | None:
        """The manifest of ``name`` (relative to the prefix), if it has one."""
        found = self._manifest_info(name)
        return None if found is None else found[0]

    def contents(self, name: str) -> dict[str, Any]:
        """The manifest of ``name``, read (``{}`` when it has none or it is unreadable)."""
        if name not in self._contents:
            rel = self.manifest(name)
            self._contents[name] = {} if rel is None else _read_json(self.prefix / rel)
        return self._contents[name]

    def committed(self, name: str) -> bool:
        """Whether ``name`` is committed: its manifest is there and so is every object it
        names, with the size and the version (ETag) it records."""
        if name not in self._committed:
            files = self.contents(name).get("files")
            if not isinstance(files, dict) or not files:
                self._committed[name] = False
            else:
                if self._is_dir(name):
                    found = list_objects(self.prefix / name)
                else:
                    found = {name: self.entries[name]} if name in self.entries else {}
                self._committed[name] = all(
                    isinstance(entry, dict) and _same(found.get(rel), entry)
                    for rel, entry in files.items()
                )
        return self._committed[name]

    def objects_of(self, name: str) -> list[str]:
        """The objects of the checkpoint ``name``, its manifest last."""
        if self._is_dir(name):
            found = [f"{name}/{rel}" for rel in list_objects(self.prefix / name)]
        else:
            found = [name] if name in self.entries else []
        manifest = self.manifest(name)
        found = [rel for rel in found if rel != manifest]
        return found + ([manifest] if manifest is not None else [])

    def markers(self) -> list[str]:
        """The checkpoints that a marker names (saves or deletions in progress)."""
        return sorted(
            rel[1 : -len(STAGING_SUFFIX)]
            for rel in self.names
            if rel.startswith(".") and rel.endswith(STAGING_SUFFIX)
        )

    def _candidates(self) -> list[str]:
        """The names with a manifest, oldest commit first (for the ones committed within two
        seconds of the newest, whose order the store's clock cannot tell apart, by the
        manifest's sequence number)."""
        names = [
            n
            for n in self.names
            if not n.startswith(".") and not n.endswith(".json") and self.manifest(n)
        ]
        times = {n: modified(self._manifest_info(n)[1]) for n in names}  # type: ignore[index]
        latest = max(times.values(), default=0.0)

        def order(n: str) -> tuple:
            close = times[n] >= latest - 2.0
            sequence = int(self.contents(n).get("sequence") or 0) if close else 0
            return (close, sequence, times[n], n)

        return sorted(names, key=order)

    def newest(self) -> list[tuple[ObjectURL, dict]]:
        """Every committed checkpoint, oldest commit first, with its manifest (each one's
        objects checked: for the few callers that want them all; see :meth:`last`)."""
        return [
            (self.prefix / n, self.contents(n)) for n in self._candidates() if self.committed(n)
        ]

    def last(self) -> str | None:
        """The name of the newest committed checkpoint (only candidates from the newest back
        to it are checked), or None."""
        return next((n for n in reversed(self._candidates()) if self.committed(n)), None)


# ----------------------------------------------------------------------------- run claims
class PrefixClaimedError(CheckpointError):
    """Another run writes this prefix, or the store cannot keep runs apart: the save is
    refused (on every rank), before anything is uploaded. Bad input of the run (``shardwise
    train``: one line, exit code 2)."""


class RunClaims:
    """The prefixes this run writes (one per :class:`~.checkpointer.Checkpointer`; rank 0's
    counts): the claim id it wrote in each, which checkpoints it resumed from, its last
    sequence number. See the module docstring."""

    def __init__(self, label: str = "") -> None:
        self.run = uuid.uuid4().hex[:16]
        #: How a person finds this run (the strategy gives its log folder).
        self.label = label
        self._owned: dict[str, str] = {}  # prefix -> the id of the claim this run wrote
        self._resumed: dict[str, bool] = {}  # checkpoint URL -> it was the newest then
        self._sequence: dict[str, int] = {}
        self._continued: set[str] = set()  # the runs this one resumed from, by id
        self._unconditional: set[str] = set()  # prefixes on stores without conditional writes

    def manifest_entry(self) -> dict[str, Any]:
        """The ``run`` a local checkpoint's manifest records: who committed it."""
        entry: dict[str, Any] = dict(id=self.run, host=socket.gethostname(), pid=os.getpid())
        if self.label:
            entry["label"] = self.label
        return entry

    def resumed_from(self, checkpoint: str | os.PathLike[str]) -> None:
        """This run resumed from ``checkpoint``: it may take over the prefix whose newest
        checkpoint that is (or roll it back to it, when it was not the newest: see the
        module docstring), and it continues the run that committed it (which
        :meth:`another_runs` then does not count as another)."""
        if is_url(checkpoint):
            url = ObjectURL(str(location(checkpoint)))
            self._resumed[str(url)] = Listing(url.parent).last() == url.name
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

    def owns(self, prefix: str) -> bool:
        """Whether this run holds the claim on ``prefix`` now (the owner object carries the
        id it wrote)."""
        mine = self._owned.get(str(prefix))
        return mine is not None and _read_json(ObjectURL(prefix) / OWNER).get("claim") == mine

    def claim(self, final: ObjectURL, listing: Listing) -> None:
        """Make sure this run owns ``final``'s prefix, claiming it on the first save (rank
        0). Raises PrefixClaimedError when another run writes there."""
        prefix = final.parent
        owner = prefix / OWNER
        if str(prefix) in self._owned:
            if not self.owns(prefix):
                raise self._refusal(final, owner, "took it over since this run's last save")
            return
        self._probe(prefix)
        info = _fresh_info(owner)
        last = listing.last()
        if info is not None and last is not None:
            self._may_take_over(final, owner, listing, last)
        token = uuid.uuid4().hex
        record = _dumps(
            dict(
                run=self.run,
                claim=token,
                host=socket.gethostname(),
                pid=os.getpid(),
                since=time.strftime("%Y-%m-%d %H:%M:%S"),
            )
        )
        try:
            if str(prefix) in self._unconditional:
                write_object(owner, record)
            elif info is None:
                write_object(owner, record, if_absent=True)
            else:
                write_object(owner, record, if_match=etag(info))
        except FileExistsError:  # someone else's write, or ours whose response was lost
            if _read_json(owner).get("claim") != token:
                raise self._refusal(final, owner, "claimed it a moment ago") from None
        self._owned[str(prefix)] = token
        if last is not None:
            self._sequence[str(prefix)] = int(listing.contents(last).get("sequence") or 0)

    def _may_take_over(
        self, final: ObjectURL, owner: ObjectURL, listing: Listing, last: str
    ) -> None:
        """Refuse to take over a prefix with committed checkpoints unless this run continues
        its newest or rolls it back to one it resumed from; a rollback is logged."""
        prefix = final.parent
        resumed = {
            ObjectURL(u).name: newest
            for u, newest in self._resumed.items()
            if ObjectURL(u).parent == prefix
        }
        if last in resumed:
            return
        back = [n for n, newest in resumed.items() if not newest and listing.committed(n)]
        if not back:
            newest = [(prefix / last, {})]
            raise self._refusal(final, owner, "has committed checkpoints there", newest)
        newer = [n for n in listing._candidates() if listing.committed(n)]
        newer = newer[newer.index(back[0]) + 1 :]
        logger.warning(
            "Rolling %s back to %s: this run takes the prefix over from %s; the newer "
            "checkpoints %s are kept (this run's saves are newer from its first one on, a "
            "save of the same name replaces one; delete the others when they are not wanted)",
            prefix,
            back[0],
            _who(owner),
            ", ".join(newer),
        )

    def _probe(self, prefix: ObjectURL) -> None:
        """Refuse a store that ignores conditional writes (see the module docstring)."""
        probe = prefix / f".shardwise-probe-{uuid.uuid4().hex[:12]}"
        try:
            write_object(probe, b"", if_absent=True)
            try:
                write_object(probe, b"", if_absent=True)
                why = "a second write only-if-absent of one object succeeded"
            except FileExistsError:
                return
        except (OSError, NotImplementedError, ValueError) as exc:
            why = f"a write only-if-absent failed ({describe_error(exc)})"
        finally:
            delete_objects([probe])
        if os.environ.get(SINGLE_WRITER_ENV) == "1":
            self._unconditional.add(str(prefix))
            logger.warning(
                "The store of %s ignores conditional writes (%s); %s=1: saving as the one run "
                "writing there, which nothing checks",
                prefix,
                why,
                SINGLE_WRITER_ENV,
            )
            return
        raise PrefixClaimedError(
            f"refusing to save to {prefix}: the store ignores conditional writes "
            f"(If-None-Match: *; {why}), which keep two runs from writing one prefix; use a "
            f"store that honours them (AWS S3, a recent MinIO), or set {SINGLE_WRITER_ENV}=1 "
            "if you make sure only one run writes there"
        )

    def claim_id(self, final: ObjectURL) -> str | None:
        """The id of the claim this run wrote on ``final``'s prefix (None: none)."""
        return self._owned.get(str(final.parent))

    def unconditional(self, final: ObjectURL) -> bool:
        """Whether ``final``'s store ignores conditional writes (``SHARDWISE_SINGLE_WRITER``)."""
        return str(final.parent) in self._unconditional

    def confirm(self, final: ObjectURL) -> None:
        """Before acting as the owner: the claim on ``final``'s prefix is still this run's."""
        if not self.owns(final.parent):
            raise self._refusal(
                final, final.parent / OWNER, "took it over while this checkpoint was written"
            )

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
        hint = f" (its newest: {newest[-1][0]})" if newest else ""
        return PrefixClaimedError(
            f"refusing to save {final}: {_who(owner)} writes {final.parent} and {did}{hint}; "
            "two runs writing one prefix would mix their checkpoints. Save to another "
            "work_dir, resume from the newest checkpoint there (resume=True, --resume) to "
            "continue that run, resume from an older one of it to roll it back, or delete "
            f"{owner} to start over there"
        )


def _who(owner: ObjectURL) -> str:
    who = _read_json(owner)
    if not who:
        return "another run"
    return f"run {who.get('run')} (host {who.get('host')}, pid {who.get('pid')})"


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
                self._discard()
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
        known = listing.manifest(name) is not None or name in listing.markers()
        if listing.exists(name) and not known:
            raise CheckpointError(
                f"refusing to save to {self.final}: objects are there that are not a committed "
                "shardwise checkpoint (no manifest, and no save of shardwise left them), and "
                "saving would replace them. Save under another name or delete them"
            )
        self.claims.confirm(self.final)
        clean_leftovers_at(listing)
        marker = dict(run=self.claims.run, claim=self.claims.claim_id(self.final), what="save")
        write_object(_marker(self.final), _dumps(marker))
        if listing.manifest(name) is not None:  # an overwrite: decommitted first
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
        """Rank 0: the claim checked, the manifest (the commit), ``last_checkpoint``, the
        marker removed, the retired checkpoints deleted (while the claim holds)."""
        files = self._pinned(files)
        self.claims.confirm(self.final)
        self._write_manifest(files)
        self._after_commit()

    def _after_commit(self) -> None:
        """Rank 0, once committed: ``last_checkpoint``, the marker removed, the retired
        checkpoints deleted while the claim holds."""
        if self.work_dir is not None:
            write_pointer(self.work_dir, self.final)
        delete_objects([_marker(self.final)])
        retire = [old for old in self.retire if old != self.final]
        if retire and not self.claims.owns(self.final.parent):
            logger.warning(
                "Not deleting the outdated checkpoints %s: %s took %s over",
                ", ".join(retire),
                _who(self.final.parent / OWNER),
                self.final.parent,
            )
            return
        for old in retire:
            try:
                deleted = remove_checkpoint_at(old, run=self.claims.run)
            except (OSError, CheckpointError) as exc:  # committed: do not fail the save
                logger.warning("Could not delete the outdated checkpoint %s: %s", old, exc)
            else:
                if deleted:
                    logger.info("Deleted the outdated checkpoint %s (max_keep_ckpts)", old)

    def _pinned(self, files: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """``files`` with each object's ETag as the store lists it now (one listing, before
        the claim is checked): the manifest pins these versions, so a checkpoint whose objects
        another save replaced is not committed (:meth:`Listing.committed`)."""
        if self.is_dir:
            found = list_objects(self.final)
        else:
            exact = _list_exact(self.final)
            found = {self.final.name: exact[0]} if exact else {}
        missing = sorted(set(files) - set(found))
        if missing:
            raise CheckpointError(f"committing {self.final}: uploaded but gone: {missing[:5]}")
        return {rel: dict(entry, etag=etag(found[rel])) for rel, entry in files.items()}

    def _write_manifest(self, files: dict[str, dict[str, Any]]) -> None:
        """The manifest: every object's size and checksum, the sequence number, the run."""
        manifest = dict(
            manifest_version=1,
            algorithm=ALGORITHM,
            created=time.strftime("%Y-%m-%d %H:%M:%S"),
            files=dict(sorted(files.items())),
            sequence=self.claims.next_sequence(self.final),
            run=self.claims.run,
        )
        target = self.final / MANIFEST if self.is_dir else ObjectURL(self.final + SIDECAR_SUFFIX)
        if self.claims.unconditional(self.final):
            write_object(target, _dumps(manifest))
            return
        for _ in range(3):  # only if absent: a late manifest of an overtaken save loses
            try:
                write_object(target, _dumps(manifest), if_absent=True)
                return
            except FileExistsError:
                found = _read_json(target)
                if (
                    found.get("sequence") == manifest["sequence"]
                    and found.get("run") == manifest["run"]
                ):
                    return  # ours, its response lost
                logger.warning(
                    "Deleting %s, written by run %s after it lost %s",
                    target,
                    found.get("run"),
                    self.final.parent,
                )
                delete_objects([target])
        raise CheckpointError(f"committing {self.final}: {target} keeps appearing (another run?)")

    def _discard(self) -> None:
        """Rank 0: delete what this save uploaded, then its marker (nothing was committed),
        while this run owns the prefix; else the owner's next clean-up does."""
        try:
            if not self.claims.owns(self.final.parent):
                return
            listing = Listing(self.final.parent)
            if listing.manifest(self.final.name) is None:
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
    markers of finished saves; manifests beside a single object that is gone; incomplete
    multipart uploads. The caller owns the prefix (claim confirmed just before): a marker of
    an earlier claim is a save that can no longer commit. Returns the checkpoints removed."""
    removed = []
    for name in listing.markers():
        marker = listing.prefix / f".{name}{STAGING_SUFFIX}"
        if _read_json(marker).get("what", "save") == "delete" or not listing.committed(name):
            _delete(listing.prefix, listing.objects_of(name)[::-1])
            removed.append(name)
        delete_objects([marker])
    for rel in listing.names:
        if rel.endswith(SIDECAR_SUFFIX) and not rel.startswith("."):
            base = rel[: -len(SIDECAR_SUFFIX)]
            if base and base not in listing.names:
                delete_objects([listing.prefix / rel])
                removed.append(rel)
    _abort_uploads(listing.prefix)
    return removed


def _abort_uploads(prefix: ObjectURL) -> None:
    """Abort the incomplete multipart uploads under ``prefix`` (killed saves leave them); a
    store that cannot list them is noted, not an error."""
    try:
        aborted = abort_incomplete_uploads(str(prefix))
    except (OSError, NotImplementedError, CheckpointError) as exc:
        logger.info("Could not list the incomplete uploads under %s: %s", prefix, exc)
        return
    if aborted:
        logger.info("Aborted %d incomplete uploads under %s", len(aborted), prefix)


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
        logger.warning("Not deleting the outdated checkpoint %s: it is not committed", url)
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
    name = Listing(prefix).last()
    if name is None:
        if pointed is not None:
            logger.warning("%s names %s, which is not committed", LAST_CHECKPOINT, pointed)
        return None
    last = prefix / name
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
