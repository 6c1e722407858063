"""The examples run anywhere with no download, as their configs say, in short versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shardwise.config import Config
from tests.distributed import REPO
from tests.test_cli_train import ok, shardwise

EXAMPLES = REPO / "examples"

# A few iterations of the GPT: the warm-up and the cosine schedule fit in them.
SHORT_GPT = [
    "train_cfg.max_iters=30",
    "train_cfg.val_interval=15",
    "param_scheduler.0.end=5",
    "param_scheduler.1.begin=5",
    "default_hooks.logger.interval=5",
    "default_hooks.checkpoint.interval=15",
    "custom_hooks.0.max_new_tokens=60",
    "train_dataloader.dataset.max_chars=300000",
    "val_dataloader.dataset.max_chars=300000",
]


def read(work_dir: Path, mode: str) -> list[dict]:
    return [
        record
        for log in sorted(work_dir.glob("*/metrics.jsonl"))
        for record in map(json.loads, log.read_text().splitlines())
        if record["mode"] == mode
    ]


def test_the_gpt_configs_differ_only_in_the_strategy():
    fsdp = Config.fromfile(EXAMPLES / "gpt_fsdp.py", import_custom_modules=False).to_dict()
    single = Config.fromfile(EXAMPLES / "gpt_single.py", import_custom_modules=False).to_dict()
    tp = Config.fromfile(EXAMPLES / "gpt_tp.py", import_custom_modules=False).to_dict()
    assert fsdp.pop("strategy")["type"] == "FSDPStrategy"
    assert single.pop("strategy") == {"type": "SingleDeviceStrategy"}
    tp_strategy = tp.pop("strategy")
    assert tp_strategy["parallelism"] == {"dp_shard": -1, "tp": 2}
    assert tp_strategy["tp_plan"] == "auto"
    assert fsdp == single == tp


def test_the_new_style_gpt_config_is_the_single_device_one_with_imported_types():
    lazy = Config.fromfile(EXAMPLES / "gpt_lazy.py").to_dict()
    single = Config.fromfile(EXAMPLES / "gpt_single.py", import_custom_modules=False).to_dict()
    assert lazy.pop("strategy") == {"type": "shardwise.strategies.SingleDeviceStrategy"}
    assert lazy["model"].pop("type") == "chargpt.CharGPT"
    assert lazy["optim_wrapper"]["optimizer"].pop("type") == "torch.optim.AdamW"
    for tree in (single["model"], single["optim_wrapper"]["optimizer"]):
        tree.pop("type")
    for tree in (single, lazy):
        tree.pop("strategy", None)
        tree.pop("custom_imports", None)
    assert lazy == single


def test_the_digits_config_uses_synchronised_batchnorm_with_ddp():
    cfg = Config.fromfile(EXAMPLES / "digits_ddp.py", import_custom_modules=False)
    assert cfg.strategy == {"type": "DDPStrategy", "sync_bn": "torch"}


def test_the_gpt_learns_on_one_device_and_prints_generated_text(tmp_path):
    work_dir = tmp_path / "gpt"
    proc = ok(
        shardwise(
            "train",
            str(EXAMPLES / "gpt_single.py"),
            "--work-dir",
            str(work_dir),
            "--cfg-options",
            *SHORT_GPT,
            "model.n_layer=2",
        )
    )
    train = read(work_dir, "train")
    assert [r["iter"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5  # from ~4 (uniform over 96) downwards
    assert [r["iter"] for r in read(work_dir, "val")] == [15, 30]
    assert "Generated text (prompt 'def '):\n" in proc.stdout
    assert "tokens_per_sec" in train[0]


def test_the_digits_example_reaches_95_percent_validation_accuracy(tmp_path):
    work_dir = tmp_path / "digits"
    ok(
        shardwise(
            "train",
            str(EXAMPLES / "digits_ddp.py"),
            "--work-dir",
            str(work_dir),
            "--nproc-per-node",
            "2",
            "--cfg-options",
            "train_cfg.max_epochs=5",
        )
    )
    accuracy = [r["accuracy"] for r in read(work_dir, "val")]
    assert len(accuracy) == 5 and max(accuracy) >= 0.95
    best = list(work_dir.glob("best_accuracy_epoch_*.pth"))
    assert len(best) == 1


@pytest.mark.slow
def test_the_gpt_trains_fully_sharded_on_two_processes(tmp_path):
    work_dir = tmp_path / "gpt"
    proc = ok(
        shardwise(
            "train",
            str(EXAMPLES / "gpt_fsdp.py"),
            "--work-dir",
            str(work_dir),
            "--nproc-per-node",
            "2",
            "--cfg-options",
            *SHORT_GPT,
        )
    )
    assert "FSDPStrategy on 2 rank(s)" in proc.stdout
    train = read(work_dir, "train")
    assert train[-1]["loss"] < train[0]["loss"] - 0.5
    assert "Generated text" in proc.stdout
    # and the sharded checkpoint resumes: two more iterations
    ok(
        shardwise(
            "train",
            str(EXAMPLES / "gpt_fsdp.py"),
            "--work-dir",
            str(work_dir),
            "--nproc-per-node",
            "2",
            "--resume",
            "--cfg-options",
            *SHORT_GPT,
            "train_cfg.max_iters=32",
        )
    )
    assert read(work_dir, "train")[-1]["iter"] == 32


def test_the_gpt_trains_tensor_parallel_on_two_processes(tmp_path):
    work_dir = tmp_path / "gpt_tp"
    proc = ok(
        shardwise(
            "train",
            str(EXAMPLES / "gpt_tp.py"),
            "--work-dir",
            str(work_dir),
            "--nproc-per-node",
            "2",
            "--cfg-options",
            *SHORT_GPT,
            "model.n_layer=2",
        )
    )
    assert "{'dp_shard': 1, 'tp': 2}" in proc.stdout  # one tensor-parallel pair
    train = read(work_dir, "train")
    assert [r["iter"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5
    assert "Generated text (prompt 'def '):\n" in proc.stdout
    # its sharded checkpoint resumes without tensor parallelism (FSDP alone): 5 more iterations
    resumed = tmp_path / "gpt_fsdp"
    proc = ok(
        shardwise(
            "train",
            str(EXAMPLES / "gpt_fsdp.py"),
            "--work-dir",
            str(resumed),
            "--nproc-per-node",
            "2",
            "--resume",
            str(work_dir / "iter_30.pth"),
            "--cfg-options",
            *SHORT_GPT,
            "model.n_layer=2",
            "train_cfg.max_iters=35",
            "custom_hooks=[]",
        )
    )
    assert "{'dp_shard': 2}" in proc.stdout
    (after,) = read(resumed, "train")
    assert after["iter"] == 35
    assert after["loss"] < train[0]["loss"] - 0.5  # it goes on from the trained weights


@pytest.mark.slow  # two spawned ranks, then one more process: ~1 minute on 2 cores
def test_the_gpt_trains_in_two_pipeline_stages_and_resumes_on_one_device(tmp_path):
    work_dir = tmp_path / "gpt_pp"
    short = [o for o in SHORT_GPT if not o.startswith(("val_", "train_cfg.val_"))]  # no val
    proc = ok(
        shardwise(
            "train",
            str(EXAMPLES / "gpt_pp.py"),
            "--work-dir",
            str(work_dir),
            "--nproc-per-node",
            "2",
            "--cfg-options",
            *short,
            "model.n_layer=2",
        )
    )
    assert "{'pp': 2, 'dp_shard': 1}" in proc.stdout  # two stages, nothing left to shard
    assert "pipeline stages (0,) of 2, 1F1B" in proc.stdout
    train = read(work_dir, "train")
    assert [r["iter"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5  # from ~4 (uniform over 96) downwards
    assert "no sample, the model is split into pipeline stages" in proc.stdout
    # the stages' sharded checkpoint holds the whole model: it resumes on one device
    resumed = tmp_path / "gpt_single"
    proc = ok(
        shardwise(
            "train",
            str(EXAMPLES / "gpt_single.py"),
            "--work-dir",
            str(resumed),
            "--resume",
            str(work_dir / "iter_30.pth"),
            "--cfg-options",
            *SHORT_GPT,
            "model.n_layer=2",
            "train_cfg.max_iters=35",
        )
    )
    (after,) = read(resumed, "train")
    assert after["iter"] == 35
    assert after["loss"] < train[0]["loss"] - 0.5  # it goes on from the trained weights
    assert "Generated text (prompt 'def '):\n" in proc.stdout
