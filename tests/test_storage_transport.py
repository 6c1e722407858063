"""The transport under checkpoints on object storage, against moto's S3 server
(``tests/s3_server.py``): each request is retried alone (a failed part of a multipart upload
is sent again, not the whole file), and logged; only failures a retry may mend are retried;
incomplete multipart uploads under a prefix are aborted; a spool directory is removed only
when its owner ran on this machine and is gone; a checkpoint deleted or overwritten while it
is read is named as such."""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import sys

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.remote_read import RemoteCheckpoint
from shardwise.checkpoint.storage import (
    _this_machine,
    _transient,
    abort_incomplete_uploads,
    retried,
    set_storage_options,
    spool_directory,
    upload_files,
)
from tests.s3_server import FaultProxy, shared_server


@pytest.fixture(scope="module")
def s3():
    return shared_server()


@pytest.fixture
def proxied(s3):
    """A bucket reached through the fault-injecting proxy."""
    proxy = FaultProxy(s3).start()
    bucket = s3.bucket()
    set_storage_options(bucket, dict(endpoint_url=f"http://127.0.0.1:{proxy.port}"))
    yield proxy, bucket
    set_storage_options(bucket, None)
    proxy.stop()


@pytest.fixture
def notes(caplog):
    """What shardwise's storage logger says, once each (it does not propagate to pytest's
    once shardwise's logging is set up)."""
    storage_log = logging.getLogger("shardwise.checkpoint.storage")
    storage_log.addHandler(caplog.handler)
    yield lambda: list(dict.fromkeys(r.getMessage() for r in caplog.records))
    storage_log.removeHandler(caplog.handler)


# ----------------------------------------------------------------------------- retries
def test_a_failed_part_of_a_multipart_upload_is_sent_again_alone(proxied, tmp_path, notes):
    proxy, bucket = proxied
    local = tmp_path / "state.pth"
    local.write_bytes(os.urandom(40 << 20))  # 3 parts of 16 MiB
    failed = proxy.add(
        method="PUT", path=r"partNumber=2&", status=500, code="InternalError", times=2
    )

    upload_files([(local, f"{bucket}/run/state.pth")])

    assert failed.hits == 2
    parts = [r for r in proxy.seen if r.startswith("PUT") and "partNumber" in r]
    starts = [r for r in proxy.seen if r.startswith("POST") and r.endswith("?uploads")]
    assert len(parts) == 3 + 2 and len(starts) == 1  # the file's upload was not restarted
    assert proxy.server.client().get_object(Bucket=bucket[5:], Key="run/state.pth")[
        "Body"
    ].read() == (local.read_bytes())
    said = [m for m in notes() if "a request failed" in m]
    assert said == [
        f"uploading {bucket}/run/state.pth: a request failed (HTTP 500 InternalError) at "
        f"attempt {n} of 5; the client sends it again"
        for n in (1, 2)
    ]


def _client_error(status: int, code: str) -> ClientError:
    body = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(body, "PutObject")


@pytest.mark.parametrize(
    "error",
    [
        _client_error(503, "SlowDown"),
        _client_error(500, "InternalError"),
        _client_error(400, "RequestTimeout"),
        _client_error(429, "TooManyRequests"),
        OSError(errno.EBUSY, "Please reduce your request rate"),  # s3fs's SlowDown
        ConnectionResetError(),
        TimeoutError(),
        EndpointConnectionError(endpoint_url="http://127.0.0.1:9"),
        ReadTimeoutError(endpoint_url="http://127.0.0.1:9"),
    ],
    ids=repr,
)
def test_throttling_timeouts_server_errors_and_dropped_connections_are_transient(error):
    assert _transient(error)


@pytest.mark.parametrize(
    "error",
    [
        KeyError("ETag"),
        AttributeError("'NoneType' object has no attribute 'read'"),
        TypeError("expected bytes"),
        ValueError("bad range"),
        FileNotFoundError("s3://b/run/iter_4.pth"),
        PermissionError("AccessDenied"),
        _client_error(403, "AccessDenied"),
        _client_error(412, "PreconditionFailed"),
        OSError(errno.EINVAL, "bad argument"),
    ],
    ids=repr,
)
def test_programming_errors_and_refusals_are_not_transient(error):
    assert not _transient(error)


def test_a_programming_error_is_raised_at_once_not_retried():
    calls = []

    def broken() -> None:
        calls.append(1)
        raise KeyError("ETag")

    with pytest.raises(KeyError):
        retried("reading", "s3://b/run/iter_4.pth", broken)
    assert len(calls) == 1


# ----------------------------------------------------------------------------- only if absent
SIZES = pytest.mark.parametrize("size", [1 << 10, 33 << 20], ids=["one PUT", "multipart"])


@SIZES
def test_an_upload_never_replaces_another_writers_object(s3, tmp_path, size):
    bucket, key = s3.bucket(), "run/iter_2.pth/__0_0.distcp"
    theirs = os.urandom(size)  # a run that took the prefix over wrote it first
    s3.client().put_object(Bucket=bucket[5:], Key=key, Body=theirs)
    ours = tmp_path / "__0_0.distcp"
    ours.write_bytes(os.urandom(size))

    with pytest.raises(FileExistsError, match=f"{bucket}/{key} was written by another writer"):
        upload_files([(ours, f"{bucket}/{key}")])

    assert s3.client().get_object(Bucket=bucket[5:], Key=key)["Body"].read() == theirs
    assert not s3.client().list_multipart_uploads(Bucket=bucket[5:]).get("Uploads")


@SIZES
def test_an_upload_whose_response_was_lost_is_found_to_be_its_own(proxied, tmp_path, size):
    proxy, bucket = proxied
    local = tmp_path / "state.pth"
    local.write_bytes(os.urandom(size))
    # the request that writes the object (the PUT, or the multipart upload's completion)
    # reaches the store, its response does not: the client sends it again, which the store
    # refuses (the object is there now)
    method, path = ("PUT", r"/run/state\.pth$") if size < 1 << 20 else ("POST", r"uploadId=")
    lost = proxy.add(method=method, path=path, lose=True)

    upload_files([(local, f"{bucket}/run/state.pth")])

    assert lost.hits == 1
    assert len([r for r in proxy.seen if r.startswith(method) and re.search(path, r)]) == 2
    body = proxy.server.client().get_object(Bucket=bucket[5:], Key="run/state.pth")["Body"]
    assert body.read() == local.read_bytes()


# ----------------------------------------------------------------------------- leftovers
def test_incomplete_multipart_uploads_under_the_prefix_are_aborted_and_others_kept(s3):
    bucket = s3.bucket()
    client = s3.client()
    name = bucket.removeprefix("s3://")
    for key in ("run/iter_4.pth/__0_0.distcp", "run/iter_8.pth", "other/iter_4.pth"):
        client.create_multipart_upload(Bucket=name, Key=key)

    aborted = abort_incomplete_uploads(f"{bucket}/run")

    assert sorted(aborted) == [f"{bucket}/run/iter_4.pth/__0_0.distcp", f"{bucket}/run/iter_8.pth"]
    left = client.list_multipart_uploads(Bucket=name).get("Uploads", [])
    assert [upload["Key"] for upload in left] == ["other/iter_4.pth"]
    assert abort_incomplete_uploads(f"{bucket}/run") == []


def test_aborting_uploads_elsewhere_than_s3_is_nothing_to_do(tmp_path):
    assert abort_incomplete_uploads("memory://bucket/run") == []
    assert abort_incomplete_uploads(str(tmp_path)) == []


# ----------------------------------------------------------------------------- spools
def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_spool_of_a_dead_process_of_this_machine_is_removed_and_another_hosts_kept(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SHARDWISE_SPOOL_DIR", str(tmp_path))
    boot, namespace, host = _this_machine()
    dead = _dead_pid()
    spools = {
        "dead here": f"shardwise-save-{dead}-{boot}-{namespace}-{host}-abcd1234",
        "other host": f"shardwise-save-{dead}-{boot}-{namespace}-other.host-abcd1234",
        "other boot": f"shardwise-save-{dead}-00000000-{namespace}-{host}-abcd1234",
        "other container": f"shardwise-read-{dead}-{boot}-1-{host}-abcd1234",
        "alive here": f"shardwise-save-{os.getpid()}-{boot}-{namespace}-{host}-abcd1234",
        "unknown owner": f"shardwise-save-{dead}-abcd1234",  # named before owners were
    }
    for name in spools.values():
        (tmp_path / name).mkdir()

    mine = spool_directory("save")

    left = {path.name for path in tmp_path.iterdir()} - {mine.name}
    assert left == {name for what, name in spools.items() if what != "dead here"}
    assert mine.name.startswith(f"shardwise-save-{os.getpid()}-{boot}-{namespace}-{host}-")


# ----------------------------------------------------------------------------- pinned reads
@pytest.fixture
def opened(s3):
    """A checkpoint of two objects on the store, opened for reading (listed, nothing read)."""
    bucket = s3.bucket()
    client, name = s3.client(), bucket.removeprefix("s3://")
    for key in ("run/iter_4.pth/__0_0.distcp", "run/iter_4.pth/.metadata"):
        client.put_object(Bucket=name, Key=key, Body=os.urandom(1 << 20))
    with RemoteCheckpoint(f"{bucket}/run/iter_4.pth") as remote:
        yield remote, client, name


def test_a_checkpoint_deleted_while_it_is_read_is_named_as_such(opened):
    remote, client, bucket = opened
    client.delete_object(Bucket=bucket, Key="run/iter_4.pth/__0_0.distcp")
    with pytest.raises(CheckpointError) as failed:
        remote.fetch()
    assert str(failed.value).startswith(
        f"checkpoint {remote.url} was deleted or overwritten while it was being read: "
        f"{remote.url}/__0_0.distcp was deleted or overwritten since it was listed"
    )
    assert not isinstance(failed.value, FileNotFoundError)


def test_a_checkpoint_overwritten_while_it_is_read_is_named_and_no_bytes_are_mixed(opened):
    remote, client, bucket = opened
    remote.fetch([".metadata"])
    client.put_object(Bucket=bucket, Key="run/iter_4.pth/__0_0.distcp", Body=os.urandom(1 << 20))
    with pytest.raises(CheckpointError, match="was deleted or overwritten while it was being read"):
        remote.fetch(["__0_0.distcp"])
    assert remote.fetched == {".metadata": 1 << 20}
