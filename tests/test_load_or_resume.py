"""Where a run starts, by mmengine's rules, for the strategy and the Runner alike:

| resume | load_from | starts from |
|---|---|---|
| ``'PATH'`` | any | a resume of PATH |
| ``True`` | given | a resume of ``load_from`` (not the newest checkpoint in work_dir) |
| ``True`` | None | a resume of the newest committed checkpoint in work_dir (none: scratch) |
| ``False`` | given | the weights of ``load_from`` only |
"""

from __future__ import annotations

import pytest

from shardwise.strategies import SingleDeviceStrategy
from tests.test_runner import _runner
from tests.toy import ToyNet, train_steps

OPTIM = dict(optimizer=dict(type="AdamW", lr=0.01))


def _strategy(work_dir) -> SingleDeviceStrategy:
    strategy = SingleDeviceStrategy(work_dir=str(work_dir), log_kwargs=dict(log_level="ERROR"))
    strategy.prepare(ToyNet(), optim_wrapper=OPTIM)
    return strategy


@pytest.fixture
def saved(tmp_path):
    """work_dir holds 'old' (saved at iteration 1) and then 'new' (iteration 2, the newest)."""
    strategy = _strategy(tmp_path)
    for step in (1, 2):
        train_steps(strategy.model, strategy.optim_wrapper, [], [step])
        name = "old.pth" if step == 1 else "new.pth"
        strategy.save_checkpoint(name, extra_ckpt=dict(meta=dict(iter=step)))
    return tmp_path


@pytest.mark.parametrize(
    "resume, load_from, expected",
    [
        ("old.pth", "new.pth", ("resume", 1)),
        (True, "old.pth", ("resume", 1)),
        (True, None, ("resume", 2)),
        (False, "old.pth", ("weights", 1)),
        (False, None, None),
    ],
    ids=["resume-path", "resume-true-with-load-from", "resume-true", "load-from", "neither"],
)
def test_strategy_and_runner_start_from_the_same_checkpoint(saved, resume, load_from, expected):
    resume = str(saved / resume) if isinstance(resume, str) else resume
    load_from = str(saved / load_from) if load_from else None

    strategy = _strategy(saved)
    checkpoint = strategy.load_or_resume(load_from=load_from, resume=resume)
    if expected is None:
        assert checkpoint is None
    else:
        kind, step = expected
        assert checkpoint["meta"]["iter"] == step
        assert bool(strategy.optim_wrapper.optimizer.state) is (kind == "resume")

    runner = _runner(saved, ".", resume=resume, load_from=load_from, train_cfg=dict(max_epochs=1))
    calls = []
    runner.resume = lambda path: calls.append(("resume", str(path))) or {}
    runner.load_checkpoint = lambda path, **_: calls.append(("weights", str(path))) or {}
    runner.train()
    names = {1: str(saved / "old.pth"), 2: str(saved / "new.pth")}
    assert calls == ([] if expected is None else [(expected[0], names[expected[1]])])


def test_runner_loads_weights_only_when_it_does_not_train(saved):
    runner = _runner(
        saved,
        name=".",
        resume=True,
        train_dataloader=None,
        train_cfg=None,
        optim_wrapper=None,
        param_scheduler=None,
    )
    calls = []
    runner.load_checkpoint = lambda path, **_: calls.append(str(path)) or {}
    runner.load_or_resume()
    assert calls == [str(saved / "new.pth")]  # what a resume would pick, weights only


# ----------------------------------------------------------------------------- a missing path
@pytest.mark.parametrize("call", ["load_checkpoint", "resume"])
@pytest.mark.parametrize("prepared", [False, True], ids=["unprepared", "prepared"])
def test_a_missing_checkpoint_is_named_before_anything_else(call, prepared, tmp_path):
    """Not 'call prepare() first': the path is what to fix first."""
    strategy = (
        _strategy(tmp_path)
        if prepared
        else SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="ERROR"))
    )
    with pytest.raises(FileNotFoundError) as info:
        getattr(strategy, call)("missing.pth")
    message = str(info.value)
    assert "checkpoint 'missing.pth' does not exist" in message
    assert str(tmp_path / "missing.pth") in message  # looked for in work_dir too
    assert "give the path of a checkpoint file or directory" in message


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(resume="missing.pth"), "resume checkpoint 'missing.pth'"),
        (dict(resume="missing.pth", load_from="old.pth"), "resume checkpoint 'missing.pth'"),
        (dict(load_from="missing.pth"), "load_from checkpoint 'missing.pth'"),
        (dict(resume=True, load_from="missing.pth"), "load_from checkpoint 'missing.pth'"),
    ],
    ids=["resume", "resume-over-load-from", "load-from", "resume-true-with-load-from"],
)
def test_load_or_resume_names_a_missing_path_and_the_argument_that_gave_it(saved, kwargs, named):
    unprepared = SingleDeviceStrategy(work_dir=str(saved), log_kwargs=dict(log_level="ERROR"))
    with pytest.raises(FileNotFoundError, match=f"^{named} does not exist"):
        unprepared.load_or_resume(**kwargs)
