"""Object-storage mistakes as a user meets them through the command line, each one line on
stderr (no traceback per rank, no torchrun summary after it) with exit code 2, as ``shardwise
train --help`` and ``shardwise ckpt --help`` document: credentials that may read but not write
(the pre-check writes a marker object), a prefix another run writes, a store that cannot be
reached. Real processes against moto's S3 server (``tests/s3_server.py``)."""

from __future__ import annotations

import pytest

from shardwise.checkpoint.storage import StorageConfigError, list_objects, set_storage_options
from shardwise.cli import build_parser
from shardwise.strategies import SingleDeviceStrategy
from tests.distributed import free_port
from tests.s3_server import FaultProxy, shared_server
from tests.test_cli_train import TINY, shardwise, train

pytestmark = pytest.mark.usefixtures("outside_the_repository")  # URL work dirs log in ./


@pytest.fixture(scope="module")
def s3():
    return shared_server()


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)


def _one_line(proc, command: str = "train") -> str:
    err = proc.stderr
    assert err.startswith(f"shardwise {command}: error:"), err[-3000:]
    assert err.count("\n") == 1, err[-3000:]  # one line: no traceback, no torchrun summary
    return err.strip()


def test_the_help_of_train_and_ckpt_documents_exit_code_2_for_an_unreachable_store(capsys):
    for command in ("train", "ckpt"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "2 for bad input" in text and "a store that cannot be reached" in text


def test_write_denied_credentials_fail_before_training_naming_the_object(s3, config, tmp_path):
    proxy = FaultProxy(s3).start()
    try:
        bucket = s3.bucket()
        denied = proxy.add(method="PUT", status=403, code="AccessDenied", times=-1)
        proc = train(config, f"{bucket}/run", "--nproc-per-node", "2", env=proxy.env)
        assert proc.returncode == 2, proc.stderr[-3000:]
        err = _one_line(proc)
        assert f"work_dir='{bucket}/run': writing {bucket}/run/.shardwise-write-check-" in err
        assert "was refused" in err and "write and delete permission" in err
        assert denied.hits == 1 and "rank" not in proc.stdout  # no worker started
        assert list_objects(bucket) == {}
    finally:
        proxy.stop()


def test_the_library_refuses_write_denied_credentials_before_anything_is_written(s3):
    proxy = FaultProxy(s3).start()
    bucket = s3.bucket()
    set_storage_options(bucket, dict(endpoint_url=f"http://127.0.0.1:{proxy.port}"))
    try:
        proxy.add(method="PUT", status=403, code="AccessDenied", times=-1)
        with pytest.raises(StorageConfigError, match=r"writing .*/run/\.shardwise-write-check"):
            SingleDeviceStrategy(work_dir=f"{bucket}/run")
        proxy.clear()
        proxy.add(method="DELETE", status=403, code="AccessDenied", times=-1)
        proxy.add(method="POST", path=r"\?delete", status=403, code="AccessDenied", times=-1)
        with pytest.raises(StorageConfigError, match=r"deleting .*\.shardwise-write-check"):
            SingleDeviceStrategy(work_dir=f"{bucket}/run")
    finally:
        set_storage_options(bucket, None)
        proxy.stop()


def test_a_second_run_on_a_claimed_prefix_is_one_line_and_exit_code_2(s3, config):
    work_dir = f"{s3.bucket()}/run"
    first = train(config, work_dir, env=s3.env)
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(config, work_dir, "--nproc-per-node", "2", env=s3.env)
    assert second.returncode == 2, second.stderr[-3000:]
    err = _one_line(second)
    assert f"refusing to save {work_dir}/iter_4.pth: run " in err
    assert "has committed checkpoints there" in err and "--resume" in err
    one_process = train(config, work_dir, env=s3.env)  # in-process: the same line
    assert one_process.returncode == 2 and _one_line(one_process) == err.replace(
        err.split(": run ")[1].split(" ")[0], one_process.stderr.split(": run ")[1].split(" ")[0]
    )


def test_an_unreachable_store_is_exit_code_2_for_ckpt_and_train(s3, config):
    env = {
        **s3.env,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
        "SHARDWISE_STORAGE_ATTEMPTS": "2",
    }
    for command in (["ckpt", "inspect"], ["ckpt", "verify"]):
        proc = shardwise(*command, "s3://somewhere/run/iter_4.pth", env=env)
        assert proc.returncode == 2, proc.stderr[-3000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"shardwise {' '.join(command)}: error: reading s3://somewhere")
        assert "unreachable" in last and "Traceback" not in proc.stderr
    proc = train(config, "s3://somewhere/run", "--nproc-per-node", "2", env=env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = _one_line(proc)  # the check before training: no note per retry
    assert err.startswith("shardwise train: error: work_dir='s3://somewhere/run'")
    assert "failed 2 times" in err and "unreachable" in err
