"""OpenMMLab projects through ``shardwise train``: what mmengine's registries hold is built and
trained as mmengine's ``Runner`` trains it, against that Runner as the oracle.

Default suite (mmengine only): a stand-in OpenMMLab package (``tests/fake_openmmlab/fakemm``:
its registries in mmengine's tree; a ``BaseModel`` with dropout and a data preprocessor, a
``BaseDataset`` with a random transform, its own ``Accuracy``, optimizer wrapper constructor,
scheduler and hook) resolves under its
``default_scope``, and trains under shardwise's Runner with mmengine's Runner's per-iteration
losses and metrics, and resumes bit-exactly; a config that names no OpenMMLab class never
imports mmengine.

Slow suite, with mmpretrain 1.2.0 on mmcv-lite 2.2.0 (``tools/openmmlab_env.sh``, built once
into ``.openmmlab/env``; skipped where it cannot be built or the shared corpus is absent, failed
there under CI, ``CI`` set): child
configs of the corpus's ResNet-18, DeiT-tiny and MobileNetV3 configs on
generated images give mmengine's Runner's losses and accuracy on one process; under DDP-2 and
FSDP-2 ResNet-18 trains, resumes bit-exactly, and its checkpoint loads into mmpretrain with
mmengine's ``load_checkpoint``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardwise.cli import main
from tests.openmmlab_support import (
    REPO,
    Record,
    build_env,
    child_config,
    import_or_unavailable,
    make_images,
    run_env,
    train_with_mmengine,
    train_with_shardwise,
    unavailable,
)

import_or_unavailable("mmengine", "mmengine's Runner is the oracle")

FAKE = REPO / "tests" / "fake_openmmlab"
LOSS_TOLERANCE = 1e-5


# ----------------------------------------------------------------------------- the registries


@pytest.fixture
def fakemm(monkeypatch):
    """The stand-in package importable, and no default scope before or after (shardwise's
    and mmengine's)."""
    from mmengine.registry import DefaultScope as MMEngineDefaultScope

    from shardwise.registry import DefaultScope

    monkeypatch.syspath_prepend(str(FAKE))
    for scope in (DefaultScope, MMEngineDefaultScope):
        monkeypatch.setattr(scope, "_instance_dict", type(scope._instance_dict)())
    import fakemm.parts

    return fakemm.parts


def test_a_name_the_default_scope_s_package_registers_is_the_package_s(fakemm):
    from mmengine.hooks import EMAHook
    from mmengine.registry import DefaultScope as MMEngineDefaultScope

    from shardwise.registry import HOOKS, METRICS, MODELS, TRANSFORMS, DefaultScope
    from shardwise.runner import Accuracy as ShardwiseAccuracy
    from shardwise.runner.hooks import LoggerHook

    assert METRICS.get("Accuracy") is ShardwiseAccuracy  # no default scope: shardwise's
    assert MODELS.get("TinyClassifier") is None
    assert MODELS.get("fakemm.TinyClassifier") is fakemm.TinyClassifier
    with DefaultScope.overwrite_default_scope("fakemm"):
        assert METRICS.get("Accuracy") is fakemm.Accuracy  # the package's own, first
        assert MODELS.get("TinyClassifier") is fakemm.TinyClassifier
        assert TRANSFORMS.get("Jitter") is fakemm.Jitter
        assert HOOKS.get("LoggerHook") is LoggerHook  # shardwise's before mmengine's
        assert HOOKS.get("EMAHook") is EMAHook  # what only mmengine has
        assert HOOKS.get("torch.float32") is None  # an attribute, not a class
    # what the package's classes build inside them resolves in its scope, as under mmengine
    assert MMEngineDefaultScope.get_current_instance().scope_name == "fakemm"


def test_an_openmmlab_name_that_does_not_resolve_is_one_line_naming_the_fix(tmp_path, capsys):
    config = tmp_path / "typo.py"
    config.write_text(
        "default_scope = 'mmpretrian'\nmodel = dict(type='ImageClassifier')\n"
        "train_dataloader = dict(dataset=dict(type='CustomDataset'), batch_size=2)\n"
        "optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))\n"
        "train_cfg = dict(max_epochs=1)\n"
    )
    assert main(["train", str(config), "--work-dir", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "model.type: ImageClassifier is not in the shardwise::model registry" in err
    assert "the default scope's package 'mmpretrian' is not installed" in err
    config.write_text(config.read_text().replace("default_scope = 'mmpretrian'\n", ""))
    assert main(["train", str(config), "--work-dir", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert "set the config's default_scope (e.g. default_scope='mmpretrain')" in err, err
    assert not (tmp_path / "never").exists()


NO_OPENMMLAB = """
import sys
import torch
from shardwise.runner import Runner

class Regressor(torch.nn.Linear):
    def forward(self, x, y):
        return dict(loss=(super().forward(x) - y).pow(2).mean())

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        x = torch.full((4,), float(i))
        return x, x.sum(0, keepdim=True)

runner = Runner(
    model=Regressor(4, 1), work_dir=sys.argv[1],
    train_dataloader=dict(dataset=Data(), batch_size=4),
    optim_wrapper=dict(optimizer=dict(type='SGD', lr=1e-3)),
    train_cfg=dict(by_epoch=True, max_epochs=1),
    val_dataloader=dict(dataset=Data(), batch_size=4), val_evaluator=dict(type='MeanLoss'),
    default_hooks=dict(logger=dict(interval=1)),
)
runner.train()
loaded = sorted(name for name in sys.modules if name.split('.')[0] == 'mmengine')
print('MMENGINE_MODULES', loaded)
"""


def test_a_run_that_names_no_openmmlab_class_never_imports_mmengine(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", NO_OPENMMLAB, str(tmp_path / "work")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MMENGINE_MODULES []" in proc.stdout, proc.stdout[-2000:]


# ----------------------------------------------------------------------------- the stand-in package


FAKE_CONFIG = """
default_scope = 'fakemm'
model = dict(type='TinyClassifier')
train_dataloader = dict(
    batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='Blobs', n=24, pipeline=[dict(type='Jitter'), dict(type='Pack')]))
val_dataloader = dict(
    batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='Blobs', n=12, pipeline=[dict(type='Pack')]))
val_evaluator = dict(type='Accuracy')
val_cfg = dict()
optim_wrapper = dict(constructor='SlowFirstLayer', optimizer=dict(type='SGD', lr=0.2, momentum=0.9))
param_scheduler = dict(type='HalvingLR', by_epoch=False)
train_cfg = dict(by_epoch=False, max_iters={iters}, val_interval=4)
default_hooks = dict(checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=4))
randomness = dict(seed=0)
custom_hooks = [dict(type='RecordLosses', out='{out}')]
"""


def _fake_run(trainer, tmp_path: Path, name: str, iters: int, *args: str):
    out = tmp_path / f"{name}_record"
    config = tmp_path / f"{name}.py"
    config.write_text(FAKE_CONFIG.format(iters=iters, out=out))
    proc = trainer(config, tmp_path / name, FAKE, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "losses.json").read_text()), json.loads(
        (out / "metrics.json").read_text()
    )


def test_a_package_s_model_data_metric_and_hook_train_as_under_mmengine_and_resume(tmp_path):
    """Iteration-based: the draw before init_weights, a validation pass after iteration 4
    (mmengine's Evaluator over the package's Accuracy), a new data epoch at iteration 7
    (24 samples in batches of 4), the package's constructor's parameter groups under
    shardwise's wrapper, the package's scheduler; then the same run resumed from its
    iteration-4 checkpoint."""
    oracle, oracle_metrics = _fake_run(train_with_mmengine, tmp_path, "oracle", 8)
    losses, metrics = _fake_run(train_with_shardwise, tmp_path, "shardwise", 8)
    assert len(losses) == len(oracle) == 8
    assert losses == pytest.approx(oracle, abs=LOSS_TOLERANCE, rel=0)
    assert metrics == oracle_metrics and list(metrics) == ["fakemm/top1"]
    records = (tmp_path / "shardwise").glob("*/metrics.jsonl")
    logged = {
        key for log in records for line in log.read_text().splitlines() for key in json.loads(line)
    }
    assert "samples_per_sec" in logged and "tokens_per_sec" not in logged  # images, not tokens

    checkpoint = tmp_path / "shardwise" / "iter_4.pth"
    resumed, _ = _fake_run(
        train_with_shardwise, tmp_path, "resumed", 8, "--resume", str(checkpoint)
    )
    assert resumed == losses[4:]  # bit for bit: the random state continues
    whole = torch.load(tmp_path / "shardwise" / "iter_8.pth")["state_dict"]
    again = torch.load(tmp_path / "resumed" / "iter_8.pth")["state_dict"]
    assert all(torch.equal(whole[key], again[key]) for key in whole)


# ----------------------------------------------------------------------------- mmpretrain


@pytest.fixture(scope="session")
def openmmlab_env() -> Path:
    env_dir, reason = build_env()
    if env_dir is None:
        unavailable(reason)
    return env_dir


def test_a_missing_openmmlab_environment_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set, so this does not skip: no corpus"):
        unavailable("no corpus")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no corpus"):
        unavailable("no corpus")


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> Path:
    return make_images(tmp_path_factory.mktemp("images"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["resnet18", "deit_tiny", "mobilenet_v3"])
def test_shardwise_train_gives_mmengine_runner_s_losses_on_a_real_config(
    kind, openmmlab_env, images, tmp_path
):
    """One process, the same seed: the same starting weights, the same loss at every
    iteration (to 1e-5; within the same random draws) and the same validation accuracy."""
    runs = {}
    for name, trainer in (("mmengine", train_with_mmengine), ("shardwise", train_with_shardwise)):
        out = tmp_path / f"{name}_record"
        config = child_config(kind, tmp_path, images, out, name=f"{name}_config")
        proc = trainer(config, tmp_path / f"{name}_run", openmmlab_env)
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        runs[name] = Record.read(out)
    ours, oracle = runs["shardwise"], runs["mmengine"]
    assert sorted(ours.init) == sorted(oracle.init)
    assert all(torch.equal(ours.init[key], oracle.init[key]) for key in oracle.init)
    assert len(ours.losses) == len(oracle.losses) >= 4
    assert ours.losses == pytest.approx(oracle.losses, abs=LOSS_TOLERANCE, rel=0)
    assert ours.metrics == oracle.metrics and "accuracy/top1" in ours.metrics
    drawn = {n: list((tmp_path / f"{n}_run").glob("*/vis_data/vis_image/*.png")) for n in runs}
    assert len(drawn["shardwise"]) == len(drawn["mmengine"])  # mmpretrain's VisualizationHook
    assert (len(drawn["shardwise"]) > 0) == (kind == "resnet18")


LOAD_INTO_MMPRETRAIN = """
import sys, torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import load_checkpoint
from mmpretrain.registry import MODELS
cfg = Config.fromfile(sys.argv[1])
init_default_scope('mmpretrain')
model = MODELS.build(dict(cfg.model, data_preprocessor=cfg.data_preprocessor))
load_checkpoint(model, sys.argv[2], map_location='cpu', strict=True)  # raises on any key
saved = torch.load(sys.argv[2], weights_only=True)['state_dict']
loaded = model.state_dict()
assert sorted(loaded) == sorted(saved), set(loaded) ^ set(saved)
assert all(torch.equal(loaded[k], saved[k]) for k in saved)
model.eval()
x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
assert torch.isfinite(model(x, mode='tensor')).all()
print('LOADED', len(saved))
"""


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["DDPStrategy", "FSDPStrategy"])
def test_two_ranks_train_resume_bit_exactly_and_load_into_mmpretrain(
    strategy, openmmlab_env, images, tmp_path
):
    """ResNet-18 on 2 ranks for 2 epochs; the same run resumed from its first epoch's
    checkpoint gives the second epoch's losses and the last weights bit for bit; the last
    checkpoint (FSDP's sharded one converted with ``shardwise ckpt convert --to full``) loads
    into mmpretrain's model with mmengine's ``load_checkpoint``, strictly, and its logits are
    those of the saved weights."""
    extra = f"strategy = dict(type='{strategy}')\n"
    whole = child_config(
        "resnet18", tmp_path, images, tmp_path / "whole_record", batch=4, extra=extra, name="whole"
    )
    proc = train_with_shardwise(whole, tmp_path / "whole", openmmlab_env, "--nproc-per-node", "2")
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = json.loads((tmp_path / "whole_record" / "losses.json").read_text())
    assert len(losses) == 2 * 5  # 36 images in batches of 4 on 2 ranks: 5 iterations an epoch

    resumed = child_config(
        "resnet18",
        tmp_path,
        images,
        tmp_path / "resumed_record",
        batch=4,
        extra=extra,
        name="resumed",
    )
    args = ["--nproc-per-node", "2", "--resume", str(tmp_path / "whole" / "epoch_1.pth")]
    proc = train_with_shardwise(resumed, tmp_path / "resumed", openmmlab_env, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads((tmp_path / "resumed_record" / "losses.json").read_text()) == losses[5:]

    full = {}
    for name in ("whole", "resumed"):
        checkpoint = tmp_path / name / "epoch_2.pth"
        if checkpoint.is_dir():  # FSDP's sharded checkpoint: one file for mmengine
            target = tmp_path / f"{name}_full.pth"
            proc = subprocess.run(
                [sys.executable, "-m", "shardwise.cli", "ckpt", "convert", str(checkpoint)]
                + [str(target), "--to", "full"],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert proc.returncode == 0, proc.stderr[-3000:]
            checkpoint = target
        full[name] = checkpoint
    weights = {n: torch.load(p, weights_only=True)["state_dict"] for n, p in full.items()}
    assert all(torch.equal(weights["whole"][k], weights["resumed"][k]) for k in weights["whole"])

    proc = subprocess.run(
        [sys.executable, "-c", LOAD_INTO_MMPRETRAIN, str(whole), str(full["whole"])],
        cwd=REPO,
        env=run_env(openmmlab_env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"LOADED {len(weights['whole'])}" in proc.stdout
