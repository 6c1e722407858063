"""Experiment trackers (mmengine's ``visualizer=dict(vis_backends=[...])``): one short Runner
run sends its scalars and config to local files, TensorBoard, W&B (offline) and MLflow (a
local file store); each is read back through its own library's reader and compared with the
run's JSON-lines log. Nothing is downloaded or sent."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from shardwise.cli import main
from shardwise.config import Config
from shardwise.runner import Runner
from shardwise.runner.checks import check_config
from shardwise.visualization import LocalVisBackend, Visualizer
from tests.distributed import run_distributed
from tests.test_checkpoint_safety import tree_digest
from tests.test_cli_train import TINY
from tests.test_runner_support import BlobData  # noqa: F401 - registers the test data and models

pytest.importorskip("tensorboard")
wandb = pytest.importorskip("wandb")
pytest.importorskip("mlflow")

BACKENDS = ["LocalVisBackend", "TensorboardVisBackend", "WandbVisBackend", "MLflowVisBackend"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-epoch run (4 iterations each, a record every 2, validation after each epoch)
    with all four trackers; returns the runner, its JSONL records and the MLflow store."""
    tmp = tmp_path_factory.mktemp("trackers")
    store = f"file://{tmp}/mlruns"
    cfg = Config(
        dict(
            custom_imports=dict(imports=["tests.test_runner_support"]),
            model=dict(type="BlobClassifier"),
            work_dir=str(tmp / "work"),
            train_dataloader=dict(dataset=dict(type="BlobData", n=64), batch_size=16),
            val_dataloader=dict(dataset=dict(type="BlobData", n=30, seed=1), batch_size=8),
            val_evaluator=dict(type="Accuracy"),
            optim_wrapper=dict(
                optimizer=dict(type="AdamW", lr=0.01), clip_grad=dict(max_norm=10.0)
            ),
            train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
            default_hooks=dict(logger=dict(interval=2, progress_bar=False), checkpoint=None),
            randomness=dict(seed=0),
            visualizer=dict(
                type="Visualizer",
                vis_backends=[
                    dict(type="LocalVisBackend"),
                    dict(type="TensorboardVisBackend"),
                    dict(type="WandbVisBackend", init_kwargs=dict(project="shardwise-test")),
                    dict(
                        type="MLflowVisBackend",
                        exp_name="trackers",
                        run_name="toy",
                        tags=dict(team="shardwise"),
                        tracking_uri=store,
                    ),
                ],
            ),
        )
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        env.setenv("WANDB_CONSOLE", "off")
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
        runner = Runner.from_cfg(cfg)
        runner.train()
    (log,) = Path(runner.log_dir).glob("metrics.jsonl")
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["mode"], r["iter"]) for r in records] == [
        ("train", 2),
        ("train", 4),
        ("val", 4),
        ("train", 6),
        ("train", 8),
        ("val", 8),
    ]
    return runner, records, store


def expected(records):
    """What each tracker must have received: every JSONL record's numbers but ``mode``
    (mmengine's names: no ``train/`` prefix), at the record's ``iter``."""
    return [(r["iter"], {k: v for k, v in r.items() if k != "mode"}) for r in records]


def series(records) -> dict[str, list[tuple[int, float]]]:
    """The expected (step, value) series of each key, in the order they were logged."""
    out: dict[str, list[tuple[int, float]]] = {}
    for step, scalars in expected(records):
        for key, value in scalars.items():
            out.setdefault(key, []).append((step, value))
    return out


def test_the_visualizer_is_built_from_the_config_with_the_log_dir(run):
    runner, _, _ = run
    assert isinstance(runner.visualizer, Visualizer)
    assert sorted(runner.visualizer.vis_backends) == sorted(BACKENDS)
    local = runner.visualizer.get_backend("LocalVisBackend")
    assert Path(local.save_dir) == Path(runner.log_dir) / "vis_data"


def test_local_backend_writes_mmengine_s_scalars_json_and_config(run):
    runner, records, _ = run
    vis_data = Path(runner.log_dir) / "vis_data"
    lines = [json.loads(x) for x in (vis_data / "scalars.json").read_text().splitlines()]
    assert lines == [{**scalars, "step": step} for step, scalars in expected(records)]
    assert {"loss", "lr", "grad_norm", "time", "samples_per_sec"} <= set(lines[0])
    assert "accuracy" in lines[2]
    assert Config.fromfile(vis_data / "config.py").train_cfg.max_epochs == 2


def test_tensorboard_receives_the_jsonl_scalars_and_the_config(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runner, records, _ = run
    events = EventAccumulator(str(Path(runner.log_dir) / "vis_data"))
    events.Reload()
    want = series(records)
    assert sorted(events.Tags()["scalars"]) == sorted(want)
    for key, values in want.items():
        got = [(e.step, e.value) for e in events.Scalars(key)]
        assert got == [(s, pytest.approx(v, rel=1e-6)) for s, v in values], key
    (text,) = events.Tensors("config/text_summary")
    assert "max_epochs=2" in text.tensor_proto.string_val[0].decode()


def _wandb_records(path: Path):
    """The records of an offline W&B run (``run-<id>.wandb``): wandb's LevelDB-style log of
    ``wandb_internal_pb2.Record`` protobufs (7-byte ``:W&B`` header; 32 KiB blocks of
    chunks with a 7-byte header: CRC-32C, length, type FULL=1/FIRST=2/MIDDLE=3/LAST=4)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # the rest of a block is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += left
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_holds_the_jsonl_scalars_at_their_steps_and_the_config(run):
    runner, records, _ = run
    (path,) = (Path(runner.log_dir) / "vis_data" / "wandb").glob("offline-run-*/run-*.wandb")
    rows, config, finished = {}, {}, False
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            rows[row.pop("_step")] = {k: v for k, v in row.items() if not k.startswith("_")}
        elif kind in ("run", "config"):
            items = record.run.config.update if kind == "run" else record.config.update
            config.update({i.key: json.loads(i.value_json) for i in items})
        elif kind == "exit":
            finished = True
    want: dict[int, dict] = {}
    for step, scalars in expected(records):
        want.setdefault(step, {}).update(scalars)  # W&B keeps one row per step
    assert rows == want
    assert config["train_cfg"] == {"by_epoch": True, "max_epochs": 2, "val_interval": 1}
    assert finished  # wandb.finish() ran at the end of the run


def test_mlflow_run_holds_the_jsonl_scalars_params_and_config(run):
    from mlflow.tracking import MlflowClient

    runner, records, store = run
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("trackers")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.run_name == "toy" and found.data.tags["team"] == "shardwise"
    assert found.info.status == "FINISHED"
    for key, values in series(records).items():
        history = client.get_metric_history(found.info.run_id, key)
        got = sorted((m.step, m.value) for m in history)
        assert got == sorted(values), key
    assert found.data.params["train_cfg.max_epochs"] == "2"
    assert found.data.params["optim_wrapper.optimizer.type"] == "AdamW"
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert "config.py" in artifacts
    assert any(name.endswith(".log") for name in artifacts)  # the run's log file


def _train_on_two_ranks(tmp: str) -> list[dict]:
    """One DDP rank of a short run whose tracker writes under a per-rank directory; returns
    this rank's JSONL records (rank 0's; none on rank 1)."""
    from tests.test_runner_support import RegressionData  # noqa: F401 - registers it

    rank = int(os.environ["RANK"])  # set by run_distributed before the Runner starts the group
    runner = Runner(
        model=dict(type="DropoutRegressor"),
        work_dir=f"{tmp}/work",
        strategy=dict(type="DDPStrategy"),
        launcher="pytorch",
        train_dataloader=dict(dataset=dict(type="RegressionData", n=32), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        train_cfg=dict(by_epoch=False, max_iters=4),
        default_hooks=dict(logger=dict(interval=2, progress_bar=False), checkpoint=None),
        visualizer=dict(vis_backends=[dict(type="LocalVisBackend", save_dir=f"{tmp}/rank{rank}")]),
        cfg=dict(note="config"),
    )
    runner.train()
    if rank != 0:
        return []
    log = Path(runner.log_dir) / "metrics.jsonl"
    return [json.loads(x) for x in log.read_text().splitlines()]


@pytest.mark.slow  # two spawned ranks: ~25 s on 2 shared cores
def test_on_two_ranks_only_rank_0_sends_the_scalars_and_the_config(tmp_path):
    records, nothing = run_distributed(_train_on_two_ranks, 2, str(tmp_path))
    assert [r["iter"] for r in records] == [2, 4] and nothing == []
    assert not (tmp_path / "rank1").exists()
    lines = (tmp_path / "rank0" / "scalars.json").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [
        {**{k: v for k, v in r.items() if k != "mode"}, "step": r["iter"]} for r in records
    ]
    assert (tmp_path / "rank0" / "config.py").exists()


def test_only_rank_0_writes(tmp_path, monkeypatch):
    from shardwise import dist

    visualizer = Visualizer(vis_backends=[dict(type="LocalVisBackend")], save_dir=tmp_path)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    visualizer.add_config(Config(dict(a=1)))
    visualizer.add_scalars({"loss": 1.0}, step=1)
    assert not (tmp_path / "vis_data").exists()
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 0)
    visualizer.add_scalars({"loss": 1.0, "note": "text"}, step=1)
    lines = (tmp_path / "vis_data" / "scalars.json").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [{"loss": 1.0, "step": 1}]


def test_building_a_backend_writes_and_imports_nothing(tmp_path):
    import sys

    before = {name for name in sys.modules if name.split(".")[0] in ("wandb", "mlflow")}
    Visualizer(
        vis_backends=[dict(type="WandbVisBackend"), dict(type="MLflowVisBackend")],
        save_dir=tmp_path / "never",
    )
    after = {name for name in sys.modules if name.split(".")[0] in ("wandb", "mlflow")}
    assert after == before
    assert not (tmp_path / "never").exists()
    backend = LocalVisBackend(save_dir=tmp_path / "local")
    assert not (tmp_path / "local").exists()
    backend.close()


@pytest.mark.parametrize(
    "backend, words",
    [
        (
            "dict(type='NeptuneVisBackend')",
            ["vis_backends[0].type='NeptuneVisBackend'", "mmengine's backends", *BACKENDS],
        ),
        ("dict(type='WandBVisBackend')", ["'WandBVisBackend' is not", "WandbVisBackend"]),
        (
            "dict(type='WandbVisBackend', init_kwarg=dict(project='p'))",
            ["vis_backends[0]", "init_kwarg"],
        ),
    ],
)
def test_an_unknown_backend_is_one_line_before_any_worker_starts(tmp_path, capsys, backend, words):
    config = tmp_path / "tiny.py"
    config.write_text(TINY + f"\nvisualizer = dict(type='Visualizer', vis_backends=[{backend}])\n")
    before = tree_digest(tmp_path)
    args = ["train", str(config), "--work-dir", str(tmp_path / "never"), "--nproc-per-node", "2"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("shardwise train: error: visualizer.vis_backends[0]"), err
    assert err.count("\n") == 1, err
    for word in words:
        assert word in err
    assert tree_digest(tmp_path) == before and not (tmp_path / "never").exists()


def test_a_backend_whose_package_is_missing_is_refused_by_the_config_check(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    cfg = Config.fromstring(
        TINY + "\nvisualizer = dict(vis_backends=[dict(type='WandbVisBackend')])\n", ".py"
    )
    with pytest.raises(ImportError, match=r"vis_backends\[0\].*needs the wandb package.*pip"):
        check_config(cfg)
