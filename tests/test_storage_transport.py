"""The transport under checkpoints on object storage, against moto's S3 server
(``tests/s3_server.py``): incomplete multipart uploads under a prefix are aborted."""

from __future__ import annotations

import pytest

from shardwise.checkpoint.storage import abort_incomplete_uploads
from tests.s3_server import shared_server


@pytest.fixture(scope="module")
def s3():
    return shared_server()


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
