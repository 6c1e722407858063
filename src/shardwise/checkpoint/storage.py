"""Where a checkpoint lives: a local path, or an object in a store that fsspec reaches by URL.

A checkpoint path is either local (``work_dirs/demo/iter_10.pth``, ``file:///...``), which keeps
shardwise's local code path unchanged (POSIX rename and fsync), or an fsspec URL
(``s3://bucket/run/iter_10.pth``, ``gs://``, ``az://``, ``memory://``), which goes to object
storage through the commit protocol of :mod:`.object_commit` and the reads of
:mod:`.remote_read`. This module holds what both need:

- telling them apart, once, at the boundary (:func:`is_url`, :func:`location`), and naming
  objects (:class:`ObjectURL`, a ``str`` with ``name``, ``parent`` and ``/``);
- the fsspec file system of a URL (:func:`filesystem`), its package imported only then; a
  protocol without its package, missing credentials or a missing bucket is one line naming
  the value and the fix (:class:`StorageConfigError`, a ``ValueError``; :func:`check_storage`);
- storage options by URL prefix (mmengine's ``backend_args``: :func:`set_storage_options`);
  otherwise credentials and endpoints come from the environment as the client reads them
  (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``~/.aws``, ``FSSPEC_S3_*``...);
- retries in two layers, of failures a retry may mend only (throttling, HTTP 5xx, dropped
  or timed-out connections: :func:`_transient`): each S3 request by its client (botocore's
  standard mode; a failed part of a multipart upload is sent again alone), logged; each
  object operation by :func:`retried`, with backoff, then one
  :class:`~.files.CheckpointError` naming the object. The operations: uploads of a rank's
  files in parallel, each only if absent (:func:`upload_files`; s3fs uploads large objects in
  parts), ranged reads pinned to the version listed (:func:`read_ranges`, :func:`pin`),
  listings, small objects with a condition (:func:`write_object`: only if absent, or only if
  unchanged since read), the abort of incomplete multipart uploads
  (:func:`abort_incomplete_uploads`).

Example::

    >>> url = location('s3://bucket/run') / 'iter_10.pth'
    >>> url, url.name, url.parent
    ('s3://bucket/run/iter_10.pth', 'iter_10.pth', 's3://bucket/run')
    >>> upload_files([(Path('/tmp/spool/iter_10.pth'), url)])
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import functools
import logging
import os
import random
import re
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .files import CheckpointError, describe_error

__all__ = [
    "ObjectChangedError",
    "ObjectURL",
    "RetryPolicy",
    "StorageConfigError",
    "StorageUnreachableError",
    "abort_incomplete_uploads",
    "absolute",
    "check_storage",
    "delete_objects",
    "exists",
    "filesystem",
    "is_url",
    "list_objects",
    "location",
    "modified",
    "object_info",
    "pin",
    "protocol_of",
    "read_object",
    "read_ranges",
    "restore_storage_options",
    "retried",
    "saved_storage_options",
    "set_storage_options",
    "spool_directory",
    "storage_options",
    "upload_files",
    "write_object",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")

#: The packages fsspec needs for a protocol, and the extra of shardwise that installs them.
_PACKAGES = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
}

#: Where rank files are spooled before their upload and remote reads are mirrored (default:
#: the system's temporary directory).
SPOOL_ENV = "SHARDWISE_SPOOL_DIR"
#: Attempts per object operation, and the first backoff in seconds (doubling, capped).
ATTEMPTS_ENV, BACKOFF_ENV = "SHARDWISE_STORAGE_ATTEMPTS", "SHARDWISE_STORAGE_BACKOFF"
#: Attempts per S3 request (botocore's standard retry mode): a failed part of a multipart
#: upload is sent again alone, within the operation's attempt.
REQUEST_ATTEMPTS = 5

#: Pieces a large read is split into, so that they are fetched in parallel.
READ_PIECE = 16 << 20
#: Bytes of ranged reads held in memory at once.
READ_BATCH = 256 << 20
#: The part size of S3's multipart uploads (s3fs's default, 50 MiB, would send files up to
#: 100 MiB in one request).
UPLOAD_PART = 16 << 20


class StorageConfigError(ValueError):
    """Bad storage input, found before anything is written: an unknown protocol, its package
    not installed, missing credentials, credentials that may not write, a missing bucket (one
    line: the value and the fix)."""


class ObjectChangedError(CheckpointError):
    """An object deleted or replaced since it was listed, found by a read pinned to the
    version listed (:func:`read_ranges`)."""


class StorageUnreachableError(CheckpointError):
    """A store that failed every retry of an operation (unreachable, or refusing requests):
    not a damaged checkpoint (``shardwise ckpt``: exit status 2, bad input)."""


# ----------------------------------------------------------------------------- naming
def protocol_of(path: Any) -> str | None:
    """The URL scheme of ``path`` (``'s3'``), or None for a plain path."""
    if isinstance(path, Path):
        return None
    match = _SCHEME.match(os.fspath(path) if isinstance(path, os.PathLike) else str(path))
    return match.group(1).lower() if match else None


def is_url(path: Any) -> bool:
    """Whether ``path`` names an object in a store (an fsspec URL other than ``file://``)."""
    return protocol_of(path) not in (None, "file")


class ObjectURL(str):
    """The URL of an object or of a prefix (a "directory"), without a trailing slash."""

    def __new__(cls, url: str) -> ObjectURL:
        text = str(url)
        scheme = _SCHEME.match(text)
        head = scheme.group(0) if scheme else ""
        return super().__new__(cls, head + text[len(head) :].rstrip("/"))

    @property
    def protocol(self) -> str:
        return protocol_of(self) or ""

    @property
    def _rest(self) -> str:
        return self.split("://", 1)[1]

    @property
    def name(self) -> str:
        """The last part (``'iter_10.pth'``)."""
        return self._rest.rsplit("/", 1)[-1]

    @property
    def parent(self) -> ObjectURL:
        """The prefix it is in (a bucket's root is its own parent)."""
        rest = self._rest
        if "/" not in rest:
            return self
        return ObjectURL(f"{self.protocol}://{rest.rsplit('/', 1)[0]}")

    def __truediv__(self, part: str | os.PathLike[str]) -> ObjectURL:
        part = Path(part).as_posix() if isinstance(part, os.PathLike) else str(part)
        return ObjectURL(f"{self}/{part.lstrip('/')}")

    def with_name(self, name: str) -> ObjectURL:
        return self.parent / name

    def relative_to(self, base: str) -> str:
        base = ObjectURL(base)
        if not self.startswith(base + "/"):
            raise ValueError(f"{self} is not inside {base}")
        return self[len(base) + 1 :]


def location(path: str | os.PathLike[str]) -> ObjectURL | Path:
    """``path`` in the one shape the checkpoint code works on: an :class:`ObjectURL` for an
    object store, else a local :class:`~pathlib.Path` (``file://`` URLs included)."""
    if isinstance(path, ObjectURL | Path):
        return path
    if is_url(path):
        return ObjectURL(str(path))
    text = os.fspath(path)
    if protocol_of(text) == "file":
        text = text.split("://", 1)[1]
    return Path(text)


def absolute(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute as a string (a URL is already)."""
    where = location(path)
    return str(where if isinstance(where, ObjectURL) else where.absolute())


# ----------------------------------------------------------------------------- file systems
_OPTIONS: dict[str, dict[str, Any]] = {}


def set_storage_options(prefix: str, options: Mapping[str, Any] | None) -> None:
    """Use fsspec's ``options`` (s3fs: ``key``, ``secret``, ``endpoint_url``,
    ``client_kwargs``...) for every URL under ``prefix`` (mmengine's ``backend_args`` of a
    hook's ``out_dir``). None forgets them."""
    prefix = str(ObjectURL(prefix))
    if options is None:
        _OPTIONS.pop(prefix, None)
    else:
        _OPTIONS[prefix] = dict(options)


def saved_storage_options() -> dict[str, dict[str, Any]]:
    """Every prefix's options as they are now, for :func:`restore_storage_options`."""
    return {prefix: dict(options) for prefix, options in _OPTIONS.items()}


def restore_storage_options(saved: Mapping[str, Mapping[str, Any]]) -> None:
    """Put back the options :func:`saved_storage_options` returned (and only those)."""
    _OPTIONS.clear()
    _OPTIONS.update({prefix: dict(options) for prefix, options in saved.items()})


def storage_options(url: str) -> dict[str, Any]:
    """The options for ``url``: those set for its longest prefix, else none. On S3 the
    client retries each request (botocore's standard mode, ``REQUEST_ATTEMPTS``) unless the
    options say otherwise; :func:`retried` retries the whole operation around that."""
    url = str(url)
    matches = [p for p in _OPTIONS if url == p or url.startswith(p + "/")]
    options = dict(_OPTIONS[max(matches, key=len)]) if matches else {}
    if protocol_of(url) in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": REQUEST_ATTEMPTS, "mode": "standard"})
        options["config_kwargs"] = config
    return options


def filesystem(url: str, what: str = "path") -> tuple[Any, str]:
    """The fsspec file system of ``url`` and the path fsspec gives the object on it.

    Raises:
        StorageConfigError: fsspec does not know the protocol, or its package is missing.
    """
    protocol = protocol_of(url) or "file"
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec comes with torch
        raise StorageConfigError(
            f"{what}={str(url)!r} is an object-store URL, which needs fsspec: pip install fsspec"
        ) from None
    try:
        fs, path = fsspec.core.url_to_fs(str(url), **storage_options(url))
    except ImportError as exc:
        package, extra = _PACKAGES.get(protocol, (None, None))
        fix = (
            f"pip install 'shardwise[{extra}]' (or pip install {package})"
            if package
            else f"install the fsspec implementation of {protocol}:// ({exc})"
        )
        raise StorageConfigError(
            f"{what}={str(url)!r}: the {protocol}:// protocol needs "
            f"{package or 'a package'}, which is not installed: {fix}"
        ) from None
    except ValueError as exc:
        if "Protocol not known" not in str(exc):
            raise StorageConfigError(f"{what}={str(url)!r}: {exc}") from None
        raise StorageConfigError(
            f"{what}={str(url)!r}: fsspec knows no {protocol}:// protocol; use a local path or "
            "a URL such as s3://bucket/prefix, gs://bucket/prefix, az://container/prefix"
        ) from None
    if protocol in ("s3", "s3a") and not getattr(fs, "_shardwise_notes_retries", False):
        fs.retries = 1  # s3fs's own loop, around botocore's (shardwise's instance)
        fs.connect().meta.events.register(
            "needs-retry.s3", _note_request_retry, unique_id="shardwise-note-retry"
        )
        fs._shardwise_notes_retries = True
    return fs, path


#: What :func:`retried` is doing in this context (its action, object and log level), for the
#: notes of the requests it makes (fsspec runs them in its event loop in a copy of it).
_OPERATION: contextvars.ContextVar[tuple[str, str, int]] = contextvars.ContextVar(
    "shardwise_storage_operation", default=("requesting", "", logging.WARNING)
)


def _note_request_retry(
    attempts: int,
    request_dict: Mapping[str, Any],
    response: Any = None,
    caught_exception: Any = None,
    **_: Any,
) -> None:
    """botocore's ``needs-retry`` hook: log a request that failed in a way its retry mode
    retries (the retry mode itself decides, and waits)."""
    if caught_exception is not None:
        failure = describe_error(caught_exception)
    else:
        status = response[0].status_code
        code = response[1].get("Error", {}).get("Code", "")
        if status < 500 and status != 429 and code not in _TRANSIENT_CODES:
            return
        failure = f"HTTP {status} {code}".strip()
    action, url, level = _OPERATION.get()
    logger.log(
        level,
        "%s %s: a request failed (%s) at attempt %d of %d; %s",
        action,
        url or request_dict.get("url", ""),
        failure,
        attempts,
        REQUEST_ATTEMPTS,
        "the client sends it again" if attempts < REQUEST_ATTEMPTS else "the client gives up",
    )


def _credentials_error(exc: BaseException) -> bool:
    return any("Credential" in kind.__name__ for kind in type(exc).__mro__)


def check_storage(url: str, what: str = "work_dir", *, write: bool = True) -> None:
    """Refuse, in one line, a URL whose store cannot be used: an unknown protocol or one
    without its package, missing or refused credentials, a bucket that does not exist, and
    with ``write`` (where a run writes) credentials that may read but not write or delete
    there. Reads the bucket; with ``write``, writes a small marker object under ``url`` and
    deletes it. A local path passes."""
    if not is_url(url):
        return
    fs, path = filesystem(url, what)
    bucket = path.strip("/").split("/", 1)[0]
    if not bucket or protocol_of(url) == "memory":
        return
    _check_bucket(fs, url, bucket, what)
    if write:
        _check_writes(url, what)


def _check_writes(url: str, what: str) -> None:
    """Write a marker object under ``url`` and delete it (before training: the first write
    of a run is its config)."""
    marker = ObjectURL(url) / f".shardwise-write-check-{os.getpid()}-{random.getrandbits(32):08x}"
    steps = (
        ("writing", "write", lambda: write_object(marker, b"")),
        ("deleting", "delete", lambda: delete_objects([marker])),
    )
    for action, verb, step in steps:
        try:
            step()
        except PermissionError as exc:
            raise StorageConfigError(
                f"{what}={str(url)!r}: {action} {marker} was refused ({describe_error(exc)}); "
                f"these credentials may read the bucket but not {verb} there: give them "
                "write and delete permission on the prefix (s3:PutObject, s3:DeleteObject), "
                "or choose a prefix they may write"
            ) from None
        except (StorageConfigError, CheckpointError) as exc:
            raise StorageConfigError(f"{what}={str(url)!r}: {exc}") from None


def _check_bucket(fs: Any, url: str, bucket: str, what: str) -> None:
    try:
        # before training: the one line of its outcome, not a note per retry
        retried(
            "reading", f"{protocol_of(url)}://{bucket}", fs.info, bucket, retry_notes=logging.DEBUG
        )
    except FileNotFoundError:
        raise StorageConfigError(
            f"{what}={str(url)!r}: the bucket {bucket!r} does not exist (or these credentials "
            "cannot see it); create it, or check the name and the endpoint"
        ) from None
    except PermissionError as exc:
        raise StorageConfigError(
            f"{what}={str(url)!r}: access to {bucket!r} was refused ({describe_error(exc)}); "
            "check the credentials and the bucket's permissions"
        ) from None
    except (StorageConfigError, CheckpointError) as exc:
        raise StorageConfigError(f"{what}={str(url)!r}: {exc}") from None


# ----------------------------------------------------------------------------- retries
@dataclass(frozen=True)
class RetryPolicy:
    """How an object operation is retried: ``attempts`` in all, the wait before the second
    ``backoff`` seconds (drawn up to it: full jitter), doubling up to ``max_backoff``."""

    attempts: int = 3
    backoff: float = 0.5
    max_backoff: float = 10.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        """The defaults, or ``SHARDWISE_STORAGE_ATTEMPTS`` / ``SHARDWISE_STORAGE_BACKOFF``."""
        attempts = int(os.environ.get(ATTEMPTS_ENV) or cls.attempts)
        backoff = float(os.environ.get(BACKOFF_ENV) or cls.backoff)
        return cls(max(1, attempts), max(0.0, backoff))

    def wait(self, attempt: int) -> float:
        """Seconds to wait after the ``attempt``-th failure (1-based)."""
        return random.uniform(0, min(self.max_backoff, self.backoff * 2 ** (attempt - 1)))


#: S3 error codes a retry may mend (throttling, timeouts, the server's own errors).
_TRANSIENT_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "InternalError",
    "ServiceUnavailable",
    "OperationAborted",
}
#: errnos of dropped or refused connections, timeouts, and of the codes above as s3fs maps
#: them (SlowDown: EBUSY, InternalError: EREMOTEIO, a 5xx it does not know: EIO).
_TRANSIENT_ERRNOS = {
    errno.EBUSY,
    errno.EREMOTEIO,
    errno.EIO,
    errno.ETIMEDOUT,
    errno.ECONNRESET,
    errno.ECONNREFUSED,
    errno.ECONNABORTED,
    errno.EPIPE,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
}


@functools.cache
def _transient_types() -> tuple[type[BaseException], ...]:
    """The exception types of dropped connections and timeouts: Python's, and those of the
    clients that are installed (botocore's ConnectionError, EndpointConnectionError,
    ReadTimeoutError...; aiohttp's; fsspec's timeout)."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, names in (
        ("botocore.exceptions", ("ConnectionError", "HTTPClientError")),
        ("aiohttp", ("ClientConnectionError", "ClientPayloadError")),
        ("fsspec.exceptions", ("FSTimeoutError",)),
        ("urllib3.exceptions", ("ProtocolError", "TimeoutError")),
    ):
        try:
            imported = __import__(module, fromlist=list(names))
        except ImportError:
            continue
        found += [getattr(imported, name) for name in names if hasattr(imported, name)]
    return tuple(found)


def _transient(exc: BaseException) -> bool:
    """Whether ``exc`` may pass on a retry (an allow-list): a dropped, refused or timed-out
    connection, an HTTP 5xx or 429, a throttling or timeout code (SlowDown, RequestTimeout).
    Anything else (a missing object, a refused request, a programming error such as
    KeyError) is raised at once."""
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None)
    if isinstance(response, Mapping) and "Error" in response:  # botocore's ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = response["Error"].get("Code", "")
        return status >= 500 or status == 429 or code in _TRANSIENT_CODES
    if isinstance(exc, _transient_types()):
        return True
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def retried(
    action: str,
    url: str,
    fn: Callable[..., T],
    *args: Any,
    policy: RetryPolicy | None = None,
    retry_notes: int = logging.WARNING,
    **kwargs: Any,
) -> T:
    """``fn(*args, **kwargs)``, retried with backoff while it fails in a way a retry may
    mend (:func:`_transient`), each retry logged at ``retry_notes``; then
    :class:`StorageUnreachableError` naming ``action`` and the object. A failure a retry
    would not change is raised at once, as it is (a missing object is
    ``FileNotFoundError``), except missing credentials: one line saying so."""
    policy = policy or RetryPolicy.from_env()
    for attempt in range(1, policy.attempts + 1):
        try:
            operation = _OPERATION.set((action, str(url), retry_notes))
            try:
                return fn(*args, **kwargs)
            finally:
                _OPERATION.reset(operation)
        except BaseException as exc:
            if _credentials_error(exc):
                raise StorageConfigError(
                    f"{action} {url}: no usable credentials for {protocol_of(url)}:// "
                    f"({describe_error(exc)}); set them in the environment (e.g. "
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY), the client's config files, "
                    "or backend_args"
                ) from None
            if not _transient(exc):
                raise
            if attempt == policy.attempts:
                raise StorageUnreachableError(
                    f"{action} {url} failed {policy.attempts} times, the last with "
                    f"{describe_error(exc)}; the store is unreachable or refusing requests"
                ) from exc
            delay = policy.wait(attempt)
            logger.log(
                retry_notes,
                "%s %s failed (%s); retrying in %.2f s (attempt %d of %d)",
                action,
                url,
                describe_error(exc),
                delay,
                attempt + 1,
                policy.attempts,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


# ----------------------------------------------------------------------------- objects
def object_info(url: str) -> dict[str, Any] | None:
    """What the store says of the object at ``url`` (size, time, ETag...), None if absent."""
    fs, path = filesystem(url)
    try:
        info = retried("reading", url, fs.info, path)
    except FileNotFoundError:
        return None
    return info if info.get("type", "file") == "file" else None


def exists(url: str) -> bool:
    """Whether an object is at ``url``, or objects under it (a prefix)."""
    fs, path = filesystem(url)
    fs.invalidate_cache()
    return bool(retried("reading", url, fs.exists, path))


def modified(info: Mapping[str, Any]) -> float:
    """When an object was written (seconds since the epoch; 0 when the store does not say)."""
    for key in ("LastModified", "mtime", "updated", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        try:
            return float(value)
        except (TypeError, ValueError):
            continue
    return 0.0


def read_object(url: str) -> bytes:
    """The bytes of a (small) object. Raises FileNotFoundError when it is absent."""
    fs, path = filesystem(url)
    return retried("reading", url, fs.cat_file, path)


def write_object(
    url: str, data: bytes, *, if_absent: bool = False, if_match: str | None = None
) -> None:
    """Write a small object whole (it appears whole, or not at all). ``if_absent``: only if
    no object is there (FileExistsError otherwise); ``if_match``: only if the object's ETag
    is still this (FileExistsError otherwise). The store checks the condition where it can
    (S3's conditional writes); elsewhere it is checked just before writing."""
    fs, path = filesystem(url)
    s3 = protocol_of(url) in ("s3", "s3a")
    if if_match is not None and not s3:
        info = object_info(url)
        if info is None or etag(info) != if_match:
            raise FileExistsError(f"{url} changed since it was read")
    kwargs: dict[str, Any] = {}
    if if_absent:
        kwargs["mode"] = "create"
    if if_match is not None and s3:
        kwargs["IfMatch"] = if_match
    try:
        retried("writing", url, fs.pipe_file, path, data, **kwargs)
    except OSError as exc:
        if if_match is not None and exc.errno == errno.EINVAL and "condition" in str(exc):
            raise FileExistsError(f"{url} changed since it was read") from None
        raise


def etag(info: Mapping[str, Any]) -> str:
    """An object's version as the store names it (S3's ETag), or its size and time."""
    value = info.get("ETag") or info.get("etag")
    return str(value) if value else f"{info.get('size')}@{modified(info)}"


def delete_objects(urls: Sequence[str]) -> None:
    """Delete objects (missing ones are no error), in batches."""
    if not urls:
        return
    fs, _ = filesystem(urls[0])
    paths = [filesystem(url)[1] for url in urls]
    for first in range(0, len(paths), 1000):  # S3 deletes up to 1,000 keys per request
        batch = paths[first : first + 1000]
        try:
            retried("deleting", urls[first], fs.rm, batch)
        except FileNotFoundError:
            pass
        fs.invalidate_cache()


def list_objects(prefix: str) -> dict[str, dict[str, Any]]:
    """Every object under the prefix ``prefix`` (recursively), by its name relative to it,
    with what the store says of it; empty when there is none. Not cached."""
    fs, path = filesystem(prefix)
    fs.invalidate_cache()
    try:
        found = retried("listing", prefix, fs.find, path, detail=True, withdirs=False)
    except FileNotFoundError:
        return {}
    base = path.rstrip("/") + "/"
    return {
        name[len(base) :]: info
        for name, info in found.items()
        if name.startswith(base) and info.get("type", "file") == "file"
    }


def abort_incomplete_uploads(prefix: str) -> list[str]:
    """Abort every incomplete multipart upload under ``prefix`` (left by a process killed
    mid-upload: its parts are billed until aborted), returning the URLs of their objects.
    Only S3 has them: elsewhere ``[]``."""
    protocol = protocol_of(prefix)
    if protocol not in ("s3", "s3a"):
        return []
    fs, path = filesystem(prefix)
    bucket, _, key = path.strip("/").partition("/")
    page: dict[str, Any] = {"Bucket": bucket, "Prefix": key + "/" if key else ""}
    aborted: list[str] = []
    while True:
        listed = retried(
            "listing uploads under", prefix, fs.call_s3, "list_multipart_uploads", **page
        )
        for upload in listed.get("Uploads") or []:
            url = f"{protocol}://{bucket}/{upload['Key']}"
            retried(
                "aborting the upload of",
                url,
                fs.call_s3,
                "abort_multipart_upload",
                Bucket=bucket,
                Key=upload["Key"],
                UploadId=upload["UploadId"],
            )
            aborted.append(url)
        if not listed.get("IsTruncated"):
            break
        page.update(KeyMarker=listed["NextKeyMarker"], UploadIdMarker=listed["NextUploadIdMarker"])
    if aborted:
        logger.debug("aborted %d incomplete multipart upload(s) under %s", len(aborted), prefix)
    return aborted


def upload_files(pairs: Iterable[tuple[Path, str]], threads: int = 8) -> None:
    """Upload local files to new objects, several at a time, each retried (:func:`retried`);
    on S3 a file of twice ``UPLOAD_PART`` or more goes as a multipart upload, its parts in
    parallel (s3fs).

    Each object is written only if absent (fsspec's ``mode='create'``: S3's ``If-None-Match:
    *`` on the PUT or on the multipart upload's completion), so that an upload never replaces
    another writer's object, e.g. that of a run which took the prefix over mid-upload: that
    is ``FileExistsError`` naming the object, which is left as it is. An object found there
    with this file's bytes is this upload's own, whose response was lost and whose request
    the client sent again: that upload succeeded."""
    pairs = list(pairs)
    if not pairs:
        return

    def upload(pair: tuple[Path, str]) -> None:
        local, url = pair
        fs, path = filesystem(url)
        options: dict[str, Any] = {"mode": "create"}
        if protocol_of(url) in ("s3", "s3a"):  # S3 takes at most 10,000 parts
            options["chunksize"] = max(UPLOAD_PART, -(-local.stat().st_size // 10_000))
        try:
            retried("uploading", url, fs.put_file, str(local), path, **options)
        except OSError as exc:
            if not _refused_as_present(exc):
                raise
            if not _holds(url, local):
                raise FileExistsError(
                    f"{url} was written by another writer while this save uploaded it (a run "
                    "that took the prefix over, or another one saving there): it is not this "
                    "save's object and is left as it is"
                ) from None

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(pairs)))) as pool:
        list(pool.map(upload, pairs))  # raises the first failure


def _refused_as_present(exc: OSError) -> bool:
    """Whether an only-if-absent write failed because an object was there (fsspec's
    ``FileExistsError``; s3fs's 412 Precondition Failed, an ``EINVAL``)."""
    if isinstance(exc, FileExistsError):
        return True
    return exc.errno == errno.EINVAL and "condition" in str(exc).lower()


def _holds(url: str, local: Path) -> bool:
    """Whether the object at ``url`` holds exactly ``local``'s bytes (read back)."""
    info = object_info(url)
    size = local.stat().st_size
    if info is None or int(info.get("size", -1)) != size:
        return False
    fs, path = filesystem(url)
    with fs.open(path, "rb", block_size=UPLOAD_PART) as remote, open(local, "rb") as f:
        return all(
            remote.read(len(block)) == block for block in iter(lambda: f.read(UPLOAD_PART), b"")
        )


def pin(info: Mapping[str, Any]) -> dict[str, str]:
    """What pins a read to the object version ``info`` describes: its VersionId where the
    bucket keeps versions, else its ETag (If-Match); empty where the store says neither."""
    if info.get("VersionId"):
        return {"VersionId": str(info["VersionId"])}
    tag = info.get("ETag") or info.get("etag")
    return {"IfMatch": str(tag)} if tag else {}


def read_ranges(
    requests: Sequence[tuple[str, int, int]], pins: Mapping[str, Mapping[str, str]] | None = None
) -> list[bytes]:
    """The bytes ``[start, end)`` of each ``(url, start, end)``: ranged reads in parallel
    (one call into fsspec's event loop per batch), each failed one retried. ``pins``: by URL,
    the version each object must still be (:func:`pin`); on S3 a read of an object deleted or
    replaced since is :class:`ObjectChangedError`."""
    from fsspec.asyn import sync

    if not requests:
        return []
    fs, _ = filesystem(requests[0][0])
    paths = [filesystem(url)[1] for url, _, _ in requests]
    pinned = bool(pins) and protocol_of(requests[0][0]) in ("s3", "s3a")

    async def read_pinned(url: str, path: str, start: int, end: int) -> bytes:
        bucket, key, _ = fs.split_path(path)
        got = await fs._call_s3(
            "get_object",
            Bucket=bucket,
            Key=key,
            Range=f"bytes={start}-{end - 1}",
            **(pins or {}).get(url, {}),
        )
        return await got["Body"].read()

    async def read_all_pinned() -> list[Any]:
        reads = [read_pinned(url, p, s, e) for (url, s, e), p in zip(requests, paths)]
        return await asyncio.gather(*reads, return_exceptions=True)

    def read_all() -> list[Any]:
        if pinned:
            return sync(fs.loop, read_all_pinned)
        starts, ends = [s for _, s, _ in requests], [e for _, _, e in requests]
        return fs.cat_ranges(paths, starts, ends, on_error="return")

    def read_one(url: str, path: str, start: int, end: int) -> bytes:
        if pinned:
            return sync(fs.loop, read_pinned, url, path, start, end)
        return fs.cat_file(path, start=start, end=end)

    results = retried("reading", requests[0][0], read_all)
    out: list[bytes] = []
    for (url, start, end), path, got in zip(requests, paths, results):
        action = f"reading bytes {start}-{end} of"
        if isinstance(got, BaseException) and _transient(got):
            logger.warning("%s %s failed (%s); retrying", action, url, describe_error(got))
            try:
                got = retried(action, url, read_one, url, path, start, end)
            except Exception as exc:
                got = exc
        if isinstance(got, BaseException):
            if pinned and _changed(got):
                raise ObjectChangedError(
                    f"{url} was deleted or overwritten since it was listed ({describe_error(got)})"
                ) from got
            raise got
        if len(got) != end - start:
            raise CheckpointError(
                f"reading bytes {start}-{end} of {url} returned {len(got)} bytes: the object "
                "is shorter than its listing says (changed while it was read?)"
            )
        out.append(got)
    return out


def _changed(exc: BaseException) -> bool:
    """Whether a pinned read failed because its object is gone (404) or another (412)."""
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None)
    status = (response or {}).get("ResponseMetadata", {}).get("HTTPStatusCode")
    return isinstance(exc, FileNotFoundError) or status in (404, 412)


# ----------------------------------------------------------------------------- local spool
#: A spool's name: its owner (pid, the first 8 hex digits of the kernel's boot id, the inode
#: of its PID namespace, its host's name), then mkdtemp's random part.
_SPOOL = re.compile(r"^shardwise-(?:save|read)-(\d+)-(\w+)-(\d+)-(.+)-\w{8}$")


@functools.cache
def _this_machine() -> tuple[str, str, str]:
    """What tells this kernel and PID namespace from another host's or container's: the boot
    id, the PID namespace's inode, the host's name (``0`` where unknown)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    except OSError:
        boot = "0"
    try:
        namespace = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        namespace = "0"
    host = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "0"
    return boot, namespace, host


def spool_directory(prefix: str) -> Path:
    """A new private directory on local disk (``SHARDWISE_SPOOL_DIR``, else the system's
    temporary directory) for a rank's files on their way to or from a store; the caller
    removes it. Its name says which process owns it (pid, boot, PID namespace, host), so that
    those of processes that died on this machine (killed in a save) are removed here, and no
    other host's, on a shared disk."""
    root = Path(os.environ.get(SPOOL_ENV) or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    _remove_dead_spools(root)
    owner = "-".join((str(os.getpid()), *_this_machine()))
    return Path(tempfile.mkdtemp(prefix=f"shardwise-{prefix}-{owner}-", dir=root))


def _remove_dead_spools(root: Path) -> None:
    """Remove the spool directories in ``root`` whose owner ran on this machine (host, boot,
    PID namespace) and is gone; another host's, or one of unknown owner, is left alone."""
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        match = _SPOOL.match(entry.name)
        if match is None or not entry.is_dir(follow_symlinks=False):
            continue
        if match.group(2, 3, 4) != _this_machine():
            continue
        try:
            os.kill(int(match.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except (PermissionError, OverflowError):
            pass  # alive, another user's
