"""The Runner's compatibility policy (``shardwise.integrations.openmmlab_compat``): where
mmengine 0.10.7's Runner opens a DataLoader iterator, torch draws one int64 from its default
generator, except where it reuses the iterator (``persistent_workers=True`` with workers) and
where mmengine's ``InfiniteSampler`` never lets the iterator end. Each draw point of the policy
is checked against what torch's DataLoader really draws (the oracle: the same loader without a
generator of its own, opened at the same points), then whole runs on the stand-in package
against mmengine's Runner: persistent workers over 3 epochs with validation, an
iteration-based ``InfiniteSampler`` config over 2+ data epochs (and its resume), a plain one.

Slow suite: the same two configurations on a real mmpretrain child config.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from shardwise.integrations.openmmlab_compat import OpenMMLabCompat, PlainRun, compat_for
from shardwise.runner.data import ResumableInfiniteSampler, build_dataloader, pseudo_collate
from shardwise.runner.loops import _EndlessBatches
from tests.openmmlab_support import (
    REPO,
    Record,
    build_env,
    child_config,
    make_images,
    train_with_mmengine,
    train_with_shardwise,
)

pytest.importorskip("mmengine", reason="mmengine's Runner is the oracle")

FAKE = REPO / "tests" / "fake_openmmlab"
LOSS_TOLERANCE = 1e-5


@pytest.fixture
def blobs(monkeypatch):
    """A dataset of the stand-in package (an mmengine ``BaseDataset``), 24 samples."""
    monkeypatch.syspath_prepend(str(FAKE))
    from fakemm.parts import Blobs, Pack

    return Blobs(n=24, pipeline=[Pack()])


def _loaders(dataset, compat, *, workers: int, persistent: bool, sampler: str = "DefaultSampler"):
    """shardwise's loader (its own generator, built by the policy ``compat``) and the oracle:
    mmengine's Runner's loader of the same config (no generator: torch draws its workers'
    base seed from the global one)."""
    from mmengine.registry import DATA_SAMPLERS

    mine = build_dataloader(
        dict(
            dataset=dataset,
            batch_size=4,
            num_workers=workers,
            persistent_workers=persistent,
            sampler=dict(type=sampler, shuffle=True),
        ),
        seed=0,
        compat=compat,
    )
    theirs = DataLoader(
        dataset,
        batch_size=4,
        num_workers=workers,
        persistent_workers=persistent and workers > 0,
        sampler=DATA_SAMPLERS.build(dict(type=sampler, dataset=dataset, seed=0)),
        collate_fn=pseudo_collate,
    )
    return mine, theirs


def _rng_after(steps) -> torch.Tensor:
    torch.manual_seed(123)
    steps()
    return torch.get_rng_state()


def _one_draw() -> None:
    torch.empty((), dtype=torch.int64).random_()


def _loop(loader, *, iteration_based: bool) -> SimpleNamespace:
    return SimpleNamespace(dataloader=loader, opens_data_when_built=iteration_based)


# ----------------------------------------------------------------------------- the draw points


def test_every_opening_of_the_loader_draws_as_torch_opens_a_new_iterator(blobs):
    """Whoever calls ``iter()``: the loops, a package's hook (``PreciseBNHook``), its loop."""
    mine, theirs = _loaders(blobs, OpenMMLabCompat(), workers=0, persistent=False)

    def shardwise_epochs():
        for _ in range(3):
            next(iter(mine))

    def mmengine_epochs():
        for _ in range(3):
            next(iter(theirs))

    assert torch.equal(_rng_after(shardwise_epochs), _rng_after(mmengine_epochs))


def test_persistent_workers_draw_only_when_their_iterator_first_opens(blobs):
    """Two epochs and two validation passes over loaders with one persistent worker: torch
    draws once per loader (``DataLoader.__iter__`` resets the iterator after that)."""
    compat = OpenMMLabCompat()
    mine, theirs = _loaders(blobs, compat, workers=1, persistent=True)
    mine_val, theirs_val = _loaders(blobs, compat, workers=1, persistent=True)

    def shardwise_run():
        for _ in range(2):
            list(mine)
            list(mine_val)

    def mmengine_run():
        for _ in range(2):
            list(theirs)
            list(theirs_val)

    expected = _rng_after(mmengine_run)
    assert torch.equal(_rng_after(shardwise_run), expected)
    assert torch.equal(_rng_after(lambda: (_one_draw(), _one_draw())), expected)  # two in all


def test_a_resumed_run_continues_the_draws_of_persistent_workers(blobs):
    """A run resumed at epoch 1 had opened both loaders before its checkpoint: no draw;
    the validation pass due at the checkpoint draws only if it was the loader's first."""
    compat = OpenMMLabCompat()
    mine, _ = _loaders(blobs, compat, workers=1, persistent=True)
    mine_val, _ = _loaders(blobs, compat, workers=1, persistent=True)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    compat.resume_train(_loop(mine, iteration_based=False), epoch=1, skip=0)
    compat.resume_eval_passes(mine_val, opened_before=True, replay=True)
    list(mine)
    list(mine_val)
    assert torch.equal(torch.get_rng_state(), before)
    fresh = OpenMMLabCompat()
    fresh_val, _ = _loaders(blobs, fresh, workers=1, persistent=True)
    fresh.resume_eval_passes(fresh_val, opened_before=False, replay=True)  # its first pass
    assert not torch.equal(torch.get_rng_state(), before)


def test_a_run_resumed_mid_epoch_draws_from_its_next_opening_on(blobs):
    """The resumed epoch's iterator drew before the checkpoint; the next epoch's draws."""
    compat = OpenMMLabCompat()
    mine, _ = _loaders(blobs, compat, workers=0, persistent=False)
    compat.resume_train(_loop(mine, iteration_based=False), epoch=1, skip=3)
    after = _rng_after(lambda: (next(iter(mine)), next(iter(mine))))
    assert torch.equal(after, _rng_after(_one_draw))


def _iteration_based(compat, mine, steps: int) -> None:
    """shardwise's iteration-based loop over ``mine``: built (the policy's first draw), then
    ``steps`` batches."""
    compat.model_to_prepare(dict(type="M"), _loop(mine, iteration_based=True), lambda cfg: "m")
    batches = _EndlessBatches(mine, 0, 0)
    for _ in range(steps):
        next(batches)


def _mmengine_iteration_based(theirs, steps: int) -> None:
    from mmengine.runner.loops import _InfiniteDataloaderIterator

    batches = _InfiniteDataloaderIterator(theirs)
    for _ in range(steps):
        next(batches)


@pytest.mark.parametrize("sampler", ["InfiniteSampler", "DefaultSampler"])
def test_the_iteration_based_loop_draws_as_mmengine_s_endless_iterator(blobs, sampler):
    """mmengine's ``IterBasedTrainLoop``: one draw when the loop is built; over
    ``InfiniteSampler`` none at later data epochs (its ``_InfiniteDataloaderIterator`` never
    sees ``StopIteration``), over a sampler that ends one at every new data epoch."""
    compat = OpenMMLabCompat()
    mine, theirs = _loaders(blobs, compat, workers=0, persistent=False, sampler=sampler)
    assert torch.equal(
        _rng_after(lambda: _iteration_based(compat, mine, 14)),  # 6 batches a data epoch
        _rng_after(lambda: _mmengine_iteration_based(theirs, 14)),
    )


def test_the_iteration_based_first_draw_comes_between_building_and_init_weights(blobs):
    compat = OpenMMLabCompat()
    mine, _ = _loaders(blobs, compat, workers=0, persistent=False)
    order = []

    def build(cfg):
        order.append(("built", torch.get_rng_state()))
        return "model"

    torch.manual_seed(0)
    loop = _loop(mine, iteration_based=True)
    assert compat.model_to_prepare(dict(type="M"), loop, build) == "model"
    assert not torch.equal(order[0][1], torch.get_rng_state())  # the draw after the build
    loop = _loop(mine, iteration_based=False)  # an epoch-based loop: the config goes to prepare
    assert compat.model_to_prepare(dict(type="M"), loop, build) == dict(type="M")


def test_the_plain_policy_draws_nothing_and_is_chosen_without_a_package_scope(blobs):
    plain = PlainRun()
    mine, _ = _loaders(blobs, plain, workers=0, persistent=False)
    before = _rng_after(lambda: None)
    after = _rng_after(
        lambda: (
            iter(mine),  # the draw of torch's (from the loader's generator) is made here
            plain.resume_train(_loop(mine, iteration_based=True), epoch=1, skip=0),
            plain.resume_eval_passes(mine, opened_before=False, replay=True),
            iter(mine),
        )
    )
    assert torch.equal(before, after)
    assert type(mine) is DataLoader
    assert isinstance(compat_for("mmpretrain"), OpenMMLabCompat)


@pytest.mark.parametrize("world", [1, 2])
def test_the_infinite_sampler_gives_mmengine_s_endless_order_and_resumes_anywhere(blobs, world):
    from mmengine.dataset import InfiniteSampler

    for rank in range(world):
        theirs = InfiniteSampler(blobs, shuffle=True, seed=3)
        theirs.rank, theirs.world_size = rank, world
        theirs.indices = theirs._indices_of_rank()
        expected = [next(theirs.indices) for _ in range(80)]
        mine = ResumableInfiniteSampler(blobs, seed=3, num_replicas=world, rank=rank)
        assert len(mine) == len(theirs) == 24
        stream = iter(mine)
        assert [next(stream) for _ in range(80)] == expected
        for start in (0, 5, 12, 25, 47):
            mine.skip(start)
            stream = iter(mine)
            assert [next(stream) for _ in range(20)] == expected[start : start + 20]


def test_an_infinite_sampler_under_an_epoch_based_loop_is_refused_in_one_line():
    """Its first epoch would never end (under mmengine's Runner too)."""
    from shardwise.runner.checks import check_components

    loader = dict(batch_size=4, dataset=dict(type="X"), sampler=dict(type="InfiniteSampler"))
    args = dict(model=dict(type="M"), optim_wrapper=dict(), val_dataloader=None)
    args.update(val_evaluator=None, val_cfg=None, load_from=None, resume=False)
    with pytest.raises(ValueError, match="'InfiniteSampler' never ends an epoch"):
        check_components(
            train_dataloader=loader, train_cfg=dict(by_epoch=True, max_epochs=2), **args
        )
    check_components(train_dataloader=loader, train_cfg=dict(by_epoch=False, max_iters=2), **args)


# ----------------------------------------------------------------------------- whole runs


CONFIG = """
default_scope = 'fakemm'
model = dict(type='TinyClassifier')
train_dataloader = dict(
    batch_size=4, num_workers={workers}, persistent_workers={persistent},
    sampler=dict(type='{sampler}', shuffle=True),
    dataset=dict(type='Blobs', n=24, pipeline={pipeline}))
val_dataloader = dict(
    batch_size=4, num_workers={workers}, persistent_workers={persistent},
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='Blobs', n=12, pipeline=[dict(type='Pack')]))
val_evaluator = dict(type='Accuracy')
val_cfg = dict()
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.2, momentum=0.9))
train_cfg = {train_cfg}
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', by_epoch={by_epoch}, interval={interval}))
randomness = dict(seed=0)
custom_hooks = [dict(type='RecordLosses', out='{out}')]
"""


JITTER = "[dict(type='Jitter'), dict(type='Pack')]"  # NumPy's generator, in the workers


def _run(trainer, tmp_path: Path, name: str, *args: str, **fields):
    out = tmp_path / f"{name}_record"
    config = tmp_path / f"{name}.py"
    fields = dict(dict(pipeline=JITTER, interval=4), **fields)
    config.write_text(CONFIG.format(out=out, **fields))
    proc = trainer(config, tmp_path / name, FAKE, *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = json.loads((out / "losses.json").read_text())
    return losses, json.loads((out / "metrics.json").read_text())


def _against_mmengine(tmp_path: Path, **fields):
    oracle = _run(train_with_mmengine, tmp_path, "oracle", **fields)
    mine = _run(train_with_shardwise, tmp_path, "shardwise", **fields)
    assert mine[0] == pytest.approx(oracle[0], abs=LOSS_TOLERANCE, rel=0)
    assert mine[1] == oracle[1]
    return mine


def test_persistent_workers_train_as_under_mmengine_over_epochs_and_validation(tmp_path):
    """One persistent worker for each loader, 3 epochs, validation after each: the dropout
    masks of epochs 2 and 3 follow torch's generator as mmengine's Runner leaves it."""
    train_cfg = "dict(by_epoch=True, max_epochs=3, val_interval=1)"
    losses, _ = _against_mmengine(
        tmp_path,
        workers=1,
        persistent=True,
        sampler="DefaultSampler",
        train_cfg=train_cfg,
        by_epoch=True,
    )
    assert len(losses) == 18


def test_a_run_with_persistent_workers_resumes_with_mmengine_s_draws(tmp_path):
    """Resumed from epoch 1's checkpoint (saved before that epoch's validation pass, the
    loader's first: its draw is replayed; epoch 2's start and its validation draw nothing),
    bit for bit. The training pipeline draws nothing in the workers: a resumed run starts new
    worker processes, whose generators start again (under mmengine's Runner too)."""
    fields = dict(
        workers=1,
        persistent=True,
        sampler="DefaultSampler",
        train_cfg="dict(by_epoch=True, max_epochs=3, val_interval=1)",
        by_epoch=True,
        pipeline="[dict(type='Pack')]",
        interval=1,
    )
    losses, _ = _against_mmengine(tmp_path, **fields)
    checkpoint = tmp_path / "shardwise" / "epoch_1.pth"
    resumed, _ = _run(
        train_with_shardwise, tmp_path, "resumed", "--resume", str(checkpoint), **fields
    )
    assert resumed == losses[6:]


def test_an_iteration_based_infinite_sampler_config_trains_as_under_mmengine_and_resumes(
    tmp_path,
):
    """``InfiniteSampler``, 14 iterations over data epochs of 6 batches, validation every 4:
    mmengine's endless order and no draw between data epochs; resumed from iteration 8
    (mid data epoch) and from iteration 12 (a data epoch's start), bit for bit."""
    fields = dict(
        workers=0,
        persistent=False,
        sampler="InfiniteSampler",
        train_cfg="dict(by_epoch=False, max_iters=14, val_interval=4)",
        by_epoch=False,
    )
    losses, _ = _against_mmengine(tmp_path, **fields)
    assert len(losses) == 14
    for start in (8, 12):
        checkpoint = tmp_path / "shardwise" / f"iter_{start}.pth"
        resumed, _ = _run(
            train_with_shardwise, tmp_path, f"resumed{start}", "--resume", str(checkpoint), **fields
        )
        assert resumed == losses[start:]


def test_a_plain_epoch_based_config_with_workers_trains_as_under_mmengine(tmp_path):
    """Non-persistent workers: every epoch and every validation pass draws."""
    losses, _ = _against_mmengine(
        tmp_path,
        workers=1,
        persistent=False,
        sampler="DefaultSampler",
        train_cfg="dict(by_epoch=True, max_epochs=3, val_interval=1)",
        by_epoch=True,
    )
    assert len(losses) == 18


# ----------------------------------------------------------------------------- mmpretrain


@pytest.fixture(scope="module")
def openmmlab_env() -> Path:
    env_dir, reason = build_env()
    if env_dir is None:
        pytest.skip(reason)
    return env_dir


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, extra",
    [
        (
            "mobilenet_v3",  # dropout in its head; one persistent worker per loader
            """
            train_dataloader.update(num_workers=1, persistent_workers=True)
            val_dataloader.update(num_workers=1, persistent_workers=True)
            """,
        ),
        (
            "mobilenet_v3",  # iteration-based over mmengine's InfiniteSampler, 2+ data epochs
            """
            train_dataloader.update(sampler=dict(type='InfiniteSampler', shuffle=True))
            train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=12,
                             val_interval=6)
            param_scheduler = [dict(type='MultiStepLR', by_epoch=False, milestones=[8])]
            default_hooks = dict(checkpoint=dict(by_epoch=False, interval=6))
            """,
        ),
    ],
    ids=["persistent_workers", "infinite_sampler"],
)
def test_mmpretrain_trains_as_under_mmengine_with_persistent_workers_or_infinite_sampler(
    tmp_path, openmmlab_env, kind, extra
):
    images = make_images(tmp_path / "images")
    records = {}
    for trainer in (train_with_mmengine, train_with_shardwise):
        name = trainer.__name__
        out = tmp_path / f"{name}_record"
        config = child_config(kind, tmp_path, images, out, epochs=3, extra=extra, name=name)
        proc = trainer(config, tmp_path / name, openmmlab_env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        records[name] = Record.read(out)
    oracle, mine = records["train_with_mmengine"], records["train_with_shardwise"]
    assert len(mine.losses) == len(oracle.losses) >= 12
    assert mine.losses == pytest.approx(oracle.losses, abs=LOSS_TOLERANCE, rel=0)
    assert mine.metrics == pytest.approx(oracle.metrics, abs=1e-6)


def test_a_batch_sampler_is_refused_in_one_line_naming_it():
    """mmdet's dataset configs set AspectRatioBatchSampler; shardwise's Runner batches with
    its own sampler (whose position its checkpoints resume)."""
    from shardwise.runner.data import check_dataloader_cfg

    loader = dict(
        batch_size=2, dataset=dict(type="X"), batch_sampler=dict(type="AspectRatioBatchSampler")
    )
    with pytest.raises(ValueError) as info:
        check_dataloader_cfg(loader, "train_dataloader")
    message = str(info.value)
    assert "\n" not in message
    assert "train_dataloader.batch_sampler 'AspectRatioBatchSampler' is not supported" in message
    assert "_delete_=True" in message
