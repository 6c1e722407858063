"""Checkpoints on object storage: an S3 server (moto's server mode, started here on a free port)
spoken to over HTTP by the s3fs client, as on AWS.

Full, sharded and local checkpoints of 2 FSDP ranks save to ``s3://`` and resume bit-exact,
asynchronous saves included; a sharded one resumes on 1 rank; retention and
``last_checkpoint`` work there; a checkpoint without its manifest is never resumed from and
the next save deletes it; a second run writing the same prefix is refused; ``ckpt verify``
names a damaged object; the store's throttling, errors and dropped connections (a proxy
injects them) are retried, then fail in one line naming the object, with nothing committed;
bad storage input (a protocol without its package, no credentials, no bucket) is one line
before anything is written. The Runner and the kill -9 campaign are in
``tests/test_object_storage_slow.py``.
"""

from __future__ import annotations

import io
import logging
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch

from shardwise.checkpoint import CheckpointError, find_last_checkpoint
from shardwise.checkpoint.storage import (
    REQUEST_ATTEMPTS,
    StorageConfigError,
    list_objects,
    read_object,
    set_storage_options,
    storage_options,
    write_object,
)
from shardwise.strategies import SingleDeviceStrategy
from tests.distributed import run_distributed
from tests.s3_server import FaultProxy, shared_server
from tests.test_fsdp import full_weights
from tests.test_fsdp_checkpoint import SCHEDULERS, _prepare, _steps
from tests.toy import ToyNet, train_steps

pytestmark = pytest.mark.usefixtures("outside_the_repository")  # URL work dirs log in ./


@pytest.fixture(scope="module")
def s3():
    """The S3 server (one per test process), this process's environment pointing at it."""
    return shared_server()


# ----------------------------------------------------------------------------- 2 ranks
def _spy_on_fetches() -> list[dict[str, tuple[int, int]]]:
    """What each read of a checkpoint on the store fetched: by object, the bytes fetched and
    its size (recorded as the local copy closes)."""
    from shardwise.checkpoint.remote_read import RemoteCheckpoint

    reads: list[dict[str, tuple[int, int]]] = []
    close = RemoteCheckpoint.close

    def recorded(self):
        reads.append({name: (n, self.sizes[name]) for name, n in self.fetched.items()})
        close(self)

    RemoteCheckpoint.close = recorded
    return reads


def _round_trips(bucket):
    """On each of 2 ranks, per format: train 3 steps, save (sync), train 3 more; a fresh
    strategy resumes and trains the same 3; it saves asynchronously, trains 2; a third one
    resumes the newest (``resume=True``) and trains the same 2."""
    reads = _spy_on_fetches()
    out = {}
    for fmt in ("full", "sharded", "local"):
        work_dir = f"{bucket}/{fmt}"
        run = _prepare(work_dir, fmt)
        _steps(*run, range(3))
        run[0].save_checkpoint("iter_3.pth")
        saved = full_weights(run[1])
        uninterrupted = _steps(*run, range(3, 6))
        run = _prepare(work_dir, fmt)
        run[0].resume("iter_3.pth")
        fetched = reads[-1]
        at_resume = full_weights(run[1])
        resumed = _steps(*run, range(3, 6))
        run[0].save_checkpoint("iter_6.pth", async_save=True)
        run[0].wait_for_checkpoint()
        after_async = _steps(*run, range(6, 8)) + [full_weights(run[1])]
        run = _prepare(work_dir, fmt)
        run[0].load_or_resume(resume=True)
        resumed_async = _steps(*run, range(6, 8)) + [full_weights(run[1])]
        out[fmt] = dict(
            saved=saved,
            fetched=fetched,
            at_resume=at_resume,
            losses=(uninterrupted, resumed),
            async_losses=(after_async, resumed_async),
        )
    return out


def _resume_on_one_rank(url):
    """The sharded checkpoint of 2 ranks, resumed by 1: its weights, and the next losses."""
    strategy, model, wrapper, schedulers = _prepare(url.rsplit("/", 1)[0], "sharded")
    strategy.resume(url)
    weights = full_weights(model)
    return weights, _steps(strategy, model, wrapper, schedulers, range(3, 6))


@pytest.fixture(scope="module")
def two_ranks(s3):
    bucket = s3.bucket()
    results = run_distributed(_round_trips, 2, bucket, env=s3.env, init_pg=False, timeout=240)
    return bucket, results


@pytest.mark.parametrize("fmt", ["full", "sharded", "local"])
def test_two_ranks_save_to_s3_and_resume_bit_exact(two_ranks, fmt):
    _, results = two_ranks
    for rank in results:
        got = rank[fmt]
        assert all(torch.equal(got["at_resume"][k], v) for k, v in got["saved"].items())
        uninterrupted, resumed = got["losses"]
        assert resumed == uninterrupted  # optimizer, schedulers and RNG came back exactly


@pytest.mark.parametrize("fmt", ["full", "sharded", "local"])
def test_an_asynchronous_save_to_s3_resumes_bit_exact(two_ranks, fmt):
    _, results = two_ranks
    for rank in results:
        (*after, weights), (*resumed, resumed_weights) = rank[fmt]["async_losses"]
        assert resumed == after
        assert all(torch.equal(resumed_weights[k], v) for k, v in weights.items())


def test_a_resuming_rank_fetches_only_its_own_byte_ranges(two_ranks):
    _, results = two_ranks
    for rank, result in enumerate(results):
        fetched = result["sharded"]["fetched"]
        other = 1 - rank
        mine, size = fetched[f"__{rank}_0.distcp"]
        assert mine > size / 2  # its own shards
        # of the other rank's file, at most the records of plain tensors rank 0 alone wrote
        # (the optimizer's step counts: ~1 KB each, a fifth of this tiny model's file)
        theirs, size = fetched.get(f"__{other}_0.distcp", (0, 1))
        assert theirs < size / 4
        assert f"__{rank}.metadata" in fetched  # the fragments that index them
        assert set(fetched) <= {
            "manifest.json",
            "meta.pt",
            "layout.json",
            "__0.metadata",
            "__1.metadata",
            "__0_0.distcp",
            "__1_0.distcp",
        }
        local = result["local"]["fetched"]  # a local checkpoint: this rank's file
        assert f"rank{rank}.pth" in local and f"rank{other}.pth" not in local
        full = result["full"]["fetched"]  # a full checkpoint: read by rank 0 alone
        assert (sum(n for n, _ in full.values()) > 0) == (rank == 0)


def test_a_sharded_checkpoint_of_two_ranks_resumes_on_one_from_s3(two_ranks, s3):
    bucket, results = two_ranks
    ((weights, losses),) = run_distributed(
        _resume_on_one_rank, 1, f"{bucket}/sharded/iter_3.pth", env=s3.env, timeout=120
    )
    assert all(torch.equal(weights[k], v) for k, v in results[0]["sharded"]["saved"].items())
    # 1 rank sees both ranks' batches as 2 ranks did: the loss differs, but it trains on
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_the_objects_of_a_sharded_checkpoint_on_s3_are_those_on_disk(two_ranks):
    bucket, _ = two_ranks
    names = sorted(list_objects(f"{bucket}/sharded/iter_3.pth"))
    assert names == [
        "__0.metadata",
        "__0_0.distcp",
        "__1.metadata",
        "__1_0.distcp",
        "layout.json",
        "manifest.json",
        "meta.pt",
    ]
    top = sorted(list_objects(f"{bucket}/sharded"))
    assert not [n for n in top if n.endswith(".partial")]  # no marker left by a commit
    assert find_last_checkpoint(f"{bucket}/sharded") == f"{bucket}/sharded/iter_6.pth"


# ----------------------------------------------------------------------------- one process
def _toy(work_dir, **kwargs):
    strategy = SingleDeviceStrategy(
        work_dir=work_dir, env_kwargs=dict(randomness=dict(seed=3)), **kwargs
    )
    model, wrapper, schedulers = strategy.prepare(
        ToyNet(),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1, momentum=0.9)),
        param_scheduler=SCHEDULERS,
    )
    return strategy, model, wrapper, schedulers


def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_retention_and_last_checkpoint_on_s3(s3):
    work_dir = f"{s3.bucket()}/run"
    strategy, model, wrapper, schedulers = _toy(work_dir, max_keep_ckpts=2)
    for step in range(1, 5):
        train_steps(model, wrapper, schedulers, [step])
        strategy.save_checkpoint(f"iter_{step}.pth", async_save=step % 2 == 0)
    strategy.wait_for_checkpoint()
    names = sorted(n for n in list_objects(work_dir) if not n.startswith("."))
    assert names == [
        "iter_3.pth",
        "iter_3.pth.manifest.json",
        "iter_4.pth",
        "iter_4.pth.manifest.json",
        "last_checkpoint",
    ]
    assert read_object(f"{work_dir}/last_checkpoint").decode() == f"{work_dir}/iter_4.pth"
    # a resumed run goes on retiring the checkpoints saved before it
    strategy, model, wrapper, schedulers = _toy(work_dir, max_keep_ckpts=2)
    strategy.load_or_resume(resume=True)
    strategy.save_checkpoint("iter_5.pth")
    assert sorted(n for n in list_objects(work_dir) if n.startswith("iter_")) == [
        "iter_4.pth",
        "iter_4.pth.manifest.json",
        "iter_5.pth",
        "iter_5.pth.manifest.json",
    ]


def test_a_checkpoint_without_its_manifest_is_never_resumed_and_the_next_save_deletes_it(s3):
    work_dir = f"{s3.bucket()}/run"
    strategy, model, wrapper, schedulers = _toy(work_dir)
    train_steps(model, wrapper, schedulers, [1])
    strategy.save_checkpoint("iter_1.pth")
    committed = _weights(model)
    # what a save killed before its commit leaves: its marker and data, no manifest
    write_object(f"{work_dir}/.iter_2.pth.partial", b'{"what": "save"}')
    write_object(f"{work_dir}/iter_2.pth", read_object(f"{work_dir}/iter_1.pth"))
    assert find_last_checkpoint(work_dir) == f"{work_dir}/iter_1.pth"
    strategy, model, wrapper, schedulers = _toy(work_dir)
    strategy.load_or_resume(resume=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in committed.items())
    strategy.save_checkpoint("iter_3.pth")
    assert sorted(n for n in list_objects(work_dir) if n.startswith(("iter_", ".iter"))) == [
        "iter_1.pth",
        "iter_1.pth.manifest.json",
        "iter_3.pth",
        "iter_3.pth.manifest.json",
    ]


def test_a_save_refuses_to_replace_objects_it_did_not_write(s3):
    work_dir = f"{s3.bucket()}/run"
    write_object(f"{work_dir}/notes.pth/README", b"not a checkpoint")
    strategy, *_ = _toy(work_dir)
    with pytest.raises(CheckpointError, match="not a committed shardwise checkpoint"):
        strategy.save_checkpoint("notes.pth")
    assert read_object(f"{work_dir}/notes.pth/README") == b"not a checkpoint"


def test_a_second_run_writing_the_same_prefix_is_refused(s3):
    work_dir = f"{s3.bucket()}/run"
    first, model, wrapper, schedulers = _toy(work_dir)
    first.save_checkpoint("iter_1.pth")
    second, *_ = _toy(work_dir)  # a fresh run, not resuming: it would mix the two
    with pytest.raises(CheckpointError, match=r"run \w+ \(host .*writes .*/run"):
        second.save_checkpoint("iter_1b.pth")
    assert "iter_1b.pth" not in {n.split("/")[0] for n in list_objects(work_dir)}
    # a run that resumes from the newest checkpoint continues the prefix; the first is refused
    third, *_ = _toy(work_dir)
    third.load_or_resume(resume=True)
    third.save_checkpoint("iter_2.pth")
    with pytest.raises(CheckpointError, match="took it over"):
        first.save_checkpoint("iter_3.pth")
    assert find_last_checkpoint(work_dir) == f"{work_dir}/iter_2.pth"


def test_ckpt_verify_names_a_damaged_object(s3, two_ranks):
    from shardwise.cli import main

    bucket, _ = two_ranks
    url = f"{bucket}/sharded/iter_6.pth"
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert main(["ckpt", "verify", "--no-progress", url]) == 0
    assert f"OK {url}" in out.getvalue()
    bucket_name, key = url[len("s3://") :].split("/", 1)
    client = s3.client()
    damaged = f"{key}/__1_0.distcp"
    data = bytearray(client.get_object(Bucket=bucket_name, Key=damaged)["Body"].read())
    data[len(data) // 2] ^= 0xFF
    client.put_object(Bucket=bucket_name, Key=damaged, Body=bytes(data))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        assert main(["ckpt", "verify", "--no-progress", url]) == 1
    assert f"FAILED {url}/__1_0.distcp: XXH3-64" in err.getvalue()


def test_ckpt_inspect_convert_and_index_read_and_write_s3(s3, two_ranks, tmp_path):
    from shardwise.cli import main

    bucket, _ = two_ranks
    src, dst = f"{bucket}/sharded/iter_3.pth", f"{bucket}/exported/iter_3_full.pth"
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        assert main(["ckpt", "inspect", "--json", src]) == 0
        assert main(["ckpt", "convert", "--no-progress", src, dst, "--to", "full"]) == 0
        assert main(["ckpt", "verify", "--no-progress", dst]) == 0
        assert main(["ckpt", "index", f"{bucket}/sharded/iter_6.pth"]) == 0
    assert f'"path": "{src}"' in out.getvalue()
    assert f"OK {dst}" in out.getvalue()
    assert ".metadata" in list_objects(f"{bucket}/sharded/iter_6.pth")  # for torch's tools


def test_checkpoint_hook_takes_an_out_dir_url_with_backend_args(s3):
    from types import SimpleNamespace
    from unittest.mock import Mock

    from shardwise.runner import CheckpointHook, MessageHub

    bucket = s3.bucket()
    options = dict(endpoint_url=s3.endpoint, key="testing", secret="testing")
    hook = CheckpointHook(out_dir=f"{bucket}/ckpts", backend_args=options)
    runner = SimpleNamespace(work_dir="/runs/exp", message_hub=MessageHub(), logger=Mock())
    hook.before_train(runner)
    assert hook.out_dir == f"{bucket}/ckpts/exp"  # mmengine's out_dir/<work_dir's name>
    assert storage_options(hook.out_dir)["endpoint_url"] == s3.endpoint
    assert not hook.file_backend.isfile(f"{hook.out_dir}/iter_1.pth")
    with pytest.raises(ValueError, match="petrel.*fsspec URL"):
        CheckpointHook(out_dir=f"{bucket}/ckpts", backend_args=dict(backend="petrel"))


# ----------------------------------------------------------------------------- faults
@pytest.fixture
def proxied(s3):
    """A bucket reached through the fault-injecting proxy (storage options for its URL)."""
    proxy = FaultProxy(s3).start()
    bucket = s3.bucket()
    set_storage_options(bucket, dict(endpoint_url=f"http://127.0.0.1:{proxy.port}"))
    yield proxy, bucket
    set_storage_options(bucket, None)
    proxy.stop()


def test_throttling_and_server_errors_are_retried(proxied, caplog):
    proxy, bucket = proxied
    strategy, model, wrapper, schedulers = _toy(f"{bucket}/run")
    slow = proxy.add(method="PUT", path=r"/run/iter_1\.pth$", status=503, code="SlowDown", times=2)
    error = proxy.add(method="PUT", path=r"manifest\.json", status=500, code="InternalError")
    # (aiohttp itself retries a request whose reused connection was closed once)
    dropped = proxy.add(method="GET", path=r"/run/iter_1\.pth$", drop=True, times=3)
    storage_log = logging.getLogger("shardwise.checkpoint.storage")
    storage_log.addHandler(caplog.handler)  # shardwise's logger does not propagate to pytest's
    try:
        train_steps(model, wrapper, schedulers, [1])
        strategy.save_checkpoint("iter_1.pth")
        saved = _weights(model)
        strategy, model, *_ = _toy(f"{bucket}/run")
        strategy.resume("iter_1.pth", resume_optimizer=True)
    finally:
        storage_log.removeHandler(caplog.handler)
    assert (slow.hits, error.hits, dropped.hits) == (2, 1, 3)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    # each failed request is sent again by the client (botocore's retries) and logged,
    # naming shardwise's operation
    retried = [r.getMessage() for r in caplog.records if "a request failed" in r.getMessage()]
    assert any(
        f"uploading {bucket}/run/iter_1.pth: a request failed (HTTP 503 SlowDown)" in m
        for m in retried
    )
    assert any(
        f"writing {bucket}/run/iter_1.pth.manifest.json: a request failed (HTTP 500 InternalError)"
        in m
        for m in retried
    )
    assert any(
        f"reading {bucket}/run/iter_1.pth: a request failed (ConnectionClosedError" in m
        for m in retried
    )


def test_a_store_that_keeps_failing_fails_the_save_naming_the_object_and_commits_nothing(
    proxied, monkeypatch
):
    proxy, bucket = proxied
    monkeypatch.setenv("SHARDWISE_STORAGE_ATTEMPTS", "3")
    strategy, model, wrapper, schedulers = _toy(f"{bucket}/run")
    strategy.save_checkpoint("iter_1.pth")
    # (a 500, not a 503 SlowDown: botocore backs off throttling for seconds)
    rule = proxy.add(
        method="PUT", path=r"/run/iter_2\.pth$", status=500, code="InternalError", times=-1
    )
    with pytest.raises(CheckpointError) as failed:
        strategy.save_checkpoint("iter_2.pth")
    assert f"uploading {bucket}/run/iter_2.pth failed 3 times" in str(failed.value)
    assert rule.hits == 3 * REQUEST_ATTEMPTS  # each of shardwise's 3 attempts: the client's 5
    assert "iter_2.pth" not in list_objects(f"{bucket}/run")  # nothing of it is left
    assert find_last_checkpoint(f"{bucket}/run") == f"{bucket}/run/iter_1.pth"
    proxy.clear()
    drop = proxy.add(method="GET", path=r"/run/iter_1\.pth$", drop=True, times=-1)
    with pytest.raises(CheckpointError, match=rf"reading bytes .* of {bucket}/run/iter_1.pth"):
        strategy.resume("iter_1.pth")
    assert drop.hits >= 3
    proxy.clear()
    strategy.save_checkpoint("iter_2.pth")  # the store is back: the run goes on
    assert find_last_checkpoint(f"{bucket}/run") == f"{bucket}/run/iter_2.pth"


# ----------------------------------------------------------------------------- bad input
def test_bad_storage_input_is_one_line_before_anything_is_written(s3, monkeypatch):
    with pytest.raises(StorageConfigError) as failed:
        SingleDeviceStrategy(work_dir="gs://bucket/run")
    assert str(failed.value) == (
        "work_dir='gs://bucket/run': the gs:// protocol needs gcsfs, which is not installed: "
        "pip install 'shardwise[gcs]' (or pip install gcsfs)"
    )
    with pytest.raises(StorageConfigError, match="fsspec knows no nosuch:// protocol"):
        SingleDeviceStrategy(work_dir="nosuch://bucket/run")
    with pytest.raises(StorageConfigError, match="the bucket 'missing-bucket' does not exist"):
        SingleDeviceStrategy(work_dir="s3://missing-bucket/run")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    set_storage_options("s3://no-credentials", dict(skip_instance_cache=True))
    with pytest.raises(StorageConfigError, match="no usable credentials for s3://") as failed:
        SingleDeviceStrategy(work_dir="s3://no-credentials/run")
    set_storage_options("s3://no-credentials", None)
    assert "\n" not in str(failed.value)


def test_shardwise_train_refuses_a_missing_bucket_in_one_line(s3, tmp_path, capsys):
    from shardwise.cli import main

    config = tmp_path / "run.py"
    config.write_text("model = dict(type='ToyNet')\ncustom_imports = dict(imports=['tests.toy'])\n")
    assert main(["train", str(config), "--work-dir", "s3://missing-bucket/run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "shardwise train: error: work_dir='s3://missing-bucket/run': the bucket "
        "'missing-bucket' does not exist (or these credentials cannot see it); create it, or "
        "check the name and the endpoint"
    )


def test_a_memory_url_round_trips_without_a_server(tmp_path):
    work_dir = "memory://shardwise-test/run"
    strategy, model, wrapper, schedulers = _toy(work_dir)
    train_steps(model, wrapper, schedulers, [1])
    strategy.save_checkpoint("iter_1.pth")
    saved = _weights(model)
    strategy, model, *_ = _toy(work_dir)
    strategy.load_or_resume(resume=True)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())


def test_a_url_work_dir_keeps_its_logs_apart_from_a_local_run_of_the_same_name():
    local = SingleDeviceStrategy(work_dir="work_dirs/gpt")
    remote = SingleDeviceStrategy(work_dir="memory://shardwise-test/gpt")
    assert Path(remote.log_dir).parent == Path("work_dirs/memory/shardwise-test/gpt").absolute()
    assert Path(local.log_dir).parent == Path("work_dirs/gpt").absolute()
    # `shardwise plot work_dirs/gpt` reads the local run's logs alone
    assert not Path(remote.log_dir).is_relative_to(Path("work_dirs/gpt").absolute())


def test_retention_on_a_store_names_what_it_deletes():
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("shardwise.checkpoint")
    logger.addHandler(handler)
    work_dir = "memory://shardwise-test/retained"
    try:
        strategy, *_ = _toy(work_dir, max_keep_ckpts=1)
        strategy.save_checkpoint("iter_1.pth")
        strategy.save_checkpoint("iter_2.pth")
    finally:
        logger.removeHandler(handler)
    said = [r.getMessage() for r in records if r.getMessage().startswith("Deleted")]
    assert said == [f"Deleted the outdated checkpoint {work_dir}/iter_1.pth (max_keep_ckpts)"]
