"""A package's hooks and loops under ``shardwise train``, on the stand-in package
(``tests/fake_openmmlab/fakemm``, its ``compat_parts``), against mmengine's Runner.

- A hook that works only under mmengine's epoch-based loop (``isinstance(runner.train_loop,
  mmengine.runner.EpochBasedTrainLoop)``, as mmpretrain's ``PreciseBNHook``) runs after every
  epoch, as under mmengine's Runner: the same BatchNorm statistics, losses and weights; the
  iterator it opens over the training data draws from torch's generator as under mmengine's
  Runner (a model with dropout: the same losses from the next epoch on).
- A package's own validation loop (mmengine's ``ValLoop`` subclassed, in the package's
  ``LOOPS``) validates as under mmengine's Runner; its own training loop (mmengine's
  ``EpochBasedTrainLoop`` subclassed) is refused in one line naming it.
- mmengine's ``EMAHook`` under ``DDPStrategy`` on 2 ranks: every rank's
  ``before_save_checkpoint`` hooks see the model's keys, the checkpoint holds the EMA weights
  as mmengine's does (swapped into ``state_dict``), and a resume continues bit for bit.
- mmengine's ``EMAHook`` under ``FSDPStrategy``: refused in one line naming it, exit code 2,
  before anything is written.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.openmmlab_support import REPO, train_with_mmengine, train_with_shardwise

pytest.importorskip("mmengine", reason="mmengine's Runner is the oracle")

FAKE = REPO / "tests" / "fake_openmmlab"
LOSS_TOLERANCE = 1e-5

EPOCHS_CONFIG = """
default_scope = 'fakemm'
custom_imports = dict(imports=['fakemm.compat_parts'])
model = dict(type='{model}')
train_dataloader = dict(
    batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='Blobs', n=24, pipeline=[dict(type='Jitter'), dict(type='Pack')]))
val_dataloader = dict(
    batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='Blobs', n=12, pipeline=[dict(type='Pack')]))
val_evaluator = dict(type='Accuracy')
val_cfg = dict(type='CountingValLoop', out='{out}')
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.2, momentum=0.9))
train_cfg = dict(by_epoch=True, max_epochs=3)
randomness = dict(seed=0)
custom_hooks = [dict(type='RecordLosses', out='{out}'), dict(type='PreciseStats', out='{out}')]
"""


def _train(trainer, tmp_path: Path, name: str, text: str, *args: str):
    out = tmp_path / f"{name}_record"
    config = tmp_path / f"{name}_config.py"  # not mmengine.py: it would shadow mmengine
    config.write_text(text.format(out=out))
    proc = trainer(config, tmp_path / name, FAKE, *args)
    return proc, out


def _read(out: Path, name: str):
    return json.loads((out / name).read_text())


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=False)["state_dict"]


def test_a_hook_that_tests_for_mmengine_s_epoch_loop_and_a_package_s_val_loop_run_as_under_mmengine(
    tmp_path,
):
    """The PreciseBN-like hook runs after each of the 3 epochs (its log line, its forward
    passes moving the BatchNorm statistics), the package's ValLoop validates after each: the
    losses, metrics, BatchNorm statistics and weights are mmengine's Runner's."""
    text = EPOCHS_CONFIG.replace("{model}", "NormClassifier")
    runs = {}
    for name, trainer in (("mmengine", train_with_mmengine), ("shardwise", train_with_shardwise)):
        proc, out = _train(trainer, tmp_path, name, text)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        runs[name] = out
    ours, oracle = runs["shardwise"], runs["mmengine"]
    assert _read(ours, "precise.json") == _read(oracle, "precise.json") == [0, 1, 2]
    assert _read(ours, "val_passes.json") == _read(oracle, "val_passes.json") == 3
    losses = _read(ours, "losses.json")
    assert len(losses) == 18
    assert losses == pytest.approx(_read(oracle, "losses.json"), abs=LOSS_TOLERANCE, rel=0)
    assert _read(ours, "metrics.json") == _read(oracle, "metrics.json")
    log = next((tmp_path / "shardwise").glob("*/*.log")).read_text()
    assert log.count("Running Precise BN") == 3
    mine, theirs = (_weights(tmp_path / n / "epoch_3.pth") for n in ("shardwise", "mmengine"))
    assert sorted(mine) == sorted(theirs) and "net.2.running_mean" in mine
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_package_s_own_training_loop_is_refused_in_one_line_naming_it(tmp_path):
    """mmengine's ``EpochBasedTrainLoop`` subclassed by the package: shardwise's Runner trains
    with its own loops (their position is what checkpoints resume from); refused before any
    worker starts, exit code 2."""
    text = EPOCHS_CONFIG.replace("{model}", "NormClassifier").replace(
        "train_cfg = dict(by_epoch=True, max_epochs=3)",
        "train_cfg = dict(type='TaggedEpochLoop', max_epochs=3)",
    )
    proc, out = _train(train_with_shardwise, tmp_path, "tagged", text)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert proc.stderr.count("\n") == 1, proc.stderr[-4000:]
    assert "train_cfg.type='TaggedEpochLoop' is fakemm.compat_parts.TaggedEpochLoop" in proc.stderr
    assert "use type='EpochBasedTrainLoop' or 'IterBasedTrainLoop'" in proc.stderr
    assert not (tmp_path / "tagged").exists() and not out.exists()


def test_a_package_hook_that_opens_the_training_data_draws_as_under_mmengine(tmp_path):
    """The PreciseBN-like hook opens an iterator over the training data after every epoch:
    under mmengine's Runner that opening draws one int64 from torch's generator, and so it
    does under shardwise's (the loader reports it to the compatibility policy); the dropout
    of the next epochs follows."""
    text = EPOCHS_CONFIG.replace("{model}", "TinyClassifier")  # dropout: draws every step
    text = text.replace("val_cfg = dict(type='CountingValLoop', out='{out}')", "val_cfg = dict()")
    runs = {}
    for name, trainer in (("mmengine", train_with_mmengine), ("shardwise", train_with_shardwise)):
        proc, out = _train(trainer, tmp_path, name, text)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        runs[name] = _read(out, "losses.json")
    assert runs["shardwise"] == pytest.approx(runs["mmengine"], abs=LOSS_TOLERANCE, rel=0)


def test_a_package_hook_whose_loop_test_fails_is_named_in_one_warning(caplog, monkeypatch):
    """A training loop that stands in for none of mmengine's (the fault-tolerant loop): the
    hooks that test the loop's class are named, once, before the run."""
    monkeypatch.syspath_prepend(str(FAKE))
    import fakemm.compat_parts

    from shardwise.runner.hooks import package_hooks

    hook = fakemm.compat_parts.PreciseStats(out="unused")
    runner = SimpleNamespace(
        model=torch.nn.Linear(2, 2),
        strategy=SimpleNamespace(),
        optim_wrapper=object(),
        train_loop=object(),
        logger=logging.getLogger("test_package_hooks"),
    )
    with caplog.at_level(logging.WARNING, logger="test_package_hooks"):
        package_hooks.check(runner, [hook])
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith("PreciseStats test(s) the training loop's class")
    assert "EpochBasedTrainLoop and IterBasedTrainLoop" in message and "object" in message


# ----------------------------------------------------------------------------- EMAHook

EMA_CONFIG = """
default_scope = 'fakemm'
model = dict(type='TinyClassifier')
train_dataloader = dict(
    batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='Blobs', n=24, pipeline=[dict(type='Jitter'), dict(type='Pack')]))
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.2, momentum=0.9))
train_cfg = dict(by_epoch=True, max_epochs=2)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1))
randomness = dict(seed=0)
strategy = dict(type='{strategy}')
custom_hooks = [dict(type='RecordLosses', out='{out}'), dict(type='EMAHook', momentum=0.1)]
"""


def test_ema_hook_on_two_ddp_ranks_saves_the_ema_weights_and_resumes_bit_exactly(tmp_path):
    """Rank 1's EMAHook swaps the EMA weights into ``state_dict`` (mmengine's checkpoint
    layout) as rank 0's does: no KeyError at the first checkpoint; the checkpoint holds both
    sets; a resume from epoch 1 ends with the same weights and EMA weights."""
    text = EMA_CONFIG.replace("{strategy}", "DDPStrategy")
    ranks = ("--nproc-per-node", "2")
    proc, whole = _train(train_with_shardwise, tmp_path, "whole", text, *ranks)
    assert proc.returncode == 0, proc.stderr[-4000:]
    checkpoint = torch.load(tmp_path / "whole" / "epoch_2.pth", weights_only=False)
    ema, weights = checkpoint["ema_state_dict"], checkpoint["state_dict"]
    assert sorted(ema) == sorted(["steps", *(f"module.{k}" for k in weights)])
    assert not all(torch.equal(ema[f"module.{k}"], weights[k]) for k in weights)

    resume = ("--resume", str(tmp_path / "whole" / "epoch_1.pth"))
    proc, resumed = _train(train_with_shardwise, tmp_path, "resumed", text, *ranks, *resume)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert _read(resumed, "losses.json") == _read(whole, "losses.json")[3:]
    again = torch.load(tmp_path / "resumed" / "epoch_2.pth", weights_only=False)
    for key in ("state_dict", "ema_state_dict"):
        assert all(torch.equal(checkpoint[key][k], again[key][k]) for k in checkpoint[key])


def test_ema_hook_under_fsdp_is_refused_in_one_line_before_anything_is_written(tmp_path):
    text = EMA_CONFIG.replace("{strategy}", "FSDPStrategy")
    proc, out = _train(train_with_shardwise, tmp_path, "fsdp", text, "--nproc-per-node", "2")
    assert proc.returncode == 2, proc.stderr[-4000:]
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1, proc.stderr[-4000:]
    assert "EMAHook (mmengine's EMAHook) cannot run under FSDPStrategy" in lines[0]
    assert "train with DDPStrategy" in lines[0]
    assert "Traceback" not in proc.stderr
    assert not out.exists() and not list((tmp_path / "fsdp").glob("*.pth"))
