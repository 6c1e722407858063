"""shardwise's strategies under mmengine's FlexibleRunner (shardwise.integrations.mmengine).

An mmengine project (tests/mmengine_support.py: a ``BaseModel``, a dataset, a config with
mmengine's default ``env_cfg``) switches to a shardwise strategy with ``custom_imports`` and
``strategy=dict(type=...)``, and goes through one scenario with each strategy: 1 process, and
DDP and FSDP on 2 gloo ranks under torchrun. The oracle is the same run uninterrupted: a run
interrupted after its checkpoint at iteration 3 and resumed with ``resume=True`` must continue
with the same learning rates and losses and end with the same weights, bit for bit.
Checkpoints also cross between FlexibleRunner and shardwise's own Runner, both ways.
"""

from __future__ import annotations

import copy
import importlib
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from shardwise.checkpoint import find_last_checkpoint
from shardwise.checkpoint.manifest import is_committed
from tests.distributed import run_torchrun
from tests.openmmlab_support import import_or_unavailable

RUNS = ("full", "first_half", "resumed", "loaded")
SCRIPT = Path(__file__).with_name("mmengine_train.py")
SINGLE = "ShardwiseSingleDeviceStrategy"
NCCL_WARNING = "env_cfg.dist_cfg.backend='nccl' needs CUDA; using gloo"


@pytest.fixture(scope="module", autouse=True)
def shardwise_logger_restored():
    """The integration routes the 'shardwise' logger to mmengine's MMLogger: put it back as it
    was for the other test files."""
    logger = logging.getLogger("shardwise")
    saved = logger.handlers[:], logger.level, logger.propagate
    yield
    for handler in logger.handlers:
        if handler not in saved[0]:
            handler.close()
    logger.handlers[:], logger.level, logger.propagate = saved


@pytest.fixture(scope="module")
def support():
    """tests/mmengine_support.py, which needs mmengine; the strategies registered (as a
    config's ``custom_imports`` registers them)."""
    import_or_unavailable("mmengine", "the integration runs under mmengine's FlexibleRunner")
    importlib.import_module("shardwise.integrations.mmengine")
    return importlib.import_module("tests.mmengine_support")


@pytest.fixture(scope="module")
def single_process_root(support, tmp_path_factory) -> Path:
    """The scenario (``run_scenario``) with ShardwiseSingleDeviceStrategy, in this process."""
    root = tmp_path_factory.mktemp("single")
    support.run_scenario(support.write_config(root / "config.py", SINGLE), root)
    return root


@pytest.fixture(scope="module", params=[SINGLE, "ShardwiseDDPStrategy", "ShardwiseFSDPStrategy"])
def scenario(request, support, tmp_path_factory) -> tuple[str, Path, dict[str, Any]]:
    """The scenario with one strategy (DDP and FSDP on 2 ranks under torchrun):
    ``(strategy, root, records by run name)``."""
    strategy = request.param
    if strategy == SINGLE:
        root = request.getfixturevalue("single_process_root")
    else:
        root = tmp_path_factory.mktemp(strategy)
        config = support.write_config(
            root / "config.py", strategy, launcher="pytorch", batch_size=2
        )
        run_torchrun(SCRIPT, 2, str(config), str(root), timeout=240)
    return strategy, root, _records(root)


def _records(root: Path) -> dict[str, Any]:
    return {name: torch.load(root / f"{name}.pt", weights_only=True) for name in RUNS}


def assert_same(actual: Any, expected: Any, where: str = "") -> None:
    """Equal trees: tensors bit for bit, lists and tuples alike."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor) and torch.equal(actual, expected), where
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), where
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list | tuple):
        assert isinstance(actual, list | tuple) and len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, where


# ------------------------------------------------------------------------- without mmengine
def test_importing_the_integration_without_mmengine_names_the_package_and_pip_command(
    monkeypatch,
):
    monkeypatch.setitem(sys.modules, "mmengine", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "shardwise.integrations.mmengine", raising=False)
    with pytest.raises(ImportError, match=r"'mmengine'.*pip install mmengine==0\.10\.7"):
        importlib.import_module("shardwise.integrations.mmengine")


def test_shardwise_itself_never_imports_mmengine():
    code = (
        "import sys, shardwise, shardwise.cli, shardwise.runner, shardwise.strategies, "
        "shardwise.checkpoint, shardwise.config, shardwise.optim, shardwise.integrations\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mmengine'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ------------------------------------------------------------------------- registration
def test_the_strategies_are_registered_in_mmengine_beside_its_own(support):
    from mmengine._strategy import DDPStrategy as MMEngineDDPStrategy
    from mmengine.registry import STRATEGIES

    from shardwise import strategies
    from shardwise.integrations import mmengine as integration

    expected = {
        "ShardwiseSingleDeviceStrategy": strategies.SingleDeviceStrategy,
        "ShardwiseDDPStrategy": strategies.DDPStrategy,
        "ShardwiseFSDPStrategy": strategies.FSDPStrategy,
    }
    for name, shardwise_class in expected.items():
        registered = STRATEGIES.get(name)
        assert registered is getattr(integration, name)
        assert issubclass(registered, shardwise_class)
    assert STRATEGIES.get("DDPStrategy") is MMEngineDDPStrategy


def test_message_hub_state_round_trips_through_plain_data(support):
    from mmengine.logging import MessageHub

    from shardwise.integrations.mmengine import message_hub_to_mmengine, message_hub_to_plain

    hub = MessageHub(name="integration-round-trip")
    for value in (3.0, 2.0, 1.5):
        hub.update_scalar("train/loss", value)
    hub.update_info("iter", 3)
    plain = message_hub_to_plain(hub.state_dict())
    assert plain["log_scalars"]["train/loss"] == {
        "values": [3.0, 2.0, 1.5],
        "counts": [1, 1, 1],
        "max_length": hub.get_scalar("train/loss").max_length,
    }
    restored = MessageHub(name="integration-round-trip-restored")
    restored.load_state_dict(message_hub_to_mmengine(plain))
    assert restored.get_scalar("train/loss").data[0].tolist() == [3.0, 2.0, 1.5]
    assert restored.get_info("iter") == 3
    assert restored.state_dict()["resumed_keys"] == hub.state_dict()["resumed_keys"]


def test_flexible_runner_takes_a_built_strategy_and_logs_the_clipped_grad_norm(support, tmp_path):
    from mmengine.runner import FlexibleRunner

    from shardwise.integrations.mmengine import ShardwiseSingleDeviceStrategy

    strategy = ShardwiseSingleDeviceStrategy(work_dir=str(tmp_path), experiment_name="built")
    runner = FlexibleRunner(
        model=dict(type="IntegrationRegressor"),
        work_dir=str(tmp_path),
        strategy=strategy,
        train_dataloader=dict(
            dataset=dict(type="IntegrationData"),
            sampler=dict(type="DefaultSampler", shuffle=False),
            collate_fn=dict(type="default_collate"),
            batch_size=4,
        ),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.01), clip_grad=dict(max_norm=1.0)),
        train_cfg=dict(by_epoch=False, max_iters=2),
        default_hooks=dict(checkpoint=None),
    )
    assert runner.strategy is strategy
    assert runner.experiment_name == f"built_{strategy.timestamp}"  # as mmengine names it
    runner.train()
    norms = runner.message_hub.get_scalar("train/grad_norm").data[0]
    assert len(norms) == 2 and all(norm > 0 for norm in norms)


def test_an_optimizer_registered_in_mmengine_only_is_found_there(support, tmp_path):
    from shardwise.integrations.mmengine import ShardwiseSingleDeviceStrategy

    strategy = ShardwiseSingleDeviceStrategy(work_dir=str(tmp_path))
    _, optim_wrapper = strategy.prepare(
        dict(type="IntegrationRegressor"),
        optim_wrapper=dict(optimizer=dict(type="IntegrationSGD", lr=0.1, momentum=0.9)),
    )
    assert type(optim_wrapper.optimizer) is support.IntegrationSGD
    assert optim_wrapper.get_lr() == {"lr": [0.1]}


# ------------------------------------------------------------------------- the scenario
def test_checkpoint_hook_saves_committed_checkpoints_in_the_strategy_format(scenario):
    strategy, root, _ = scenario
    for iteration in (3, 6):
        path = root / "full" / f"iter_{iteration}.pth"
        assert is_committed(path)
        assert path.is_dir() == (strategy == "ShardwiseFSDPStrategy")  # sharded by default
    assert (root / "full" / "last_checkpoint").read_text() == str(root / "full" / "iter_6.pth")


def test_resume_continues_as_the_uninterrupted_run(scenario):
    _, _, records = scenario
    full, first, resumed = records["full"], records["first_half"], records["resumed"]
    assert first["losses"] == full["losses"][:3]
    assert resumed["start"]["iter"] == 3
    assert_same(resumed["start"]["weights"], first["end"]["weights"])
    assert_same(resumed["start"]["optimizer"], first["end"]["optimizer"])
    assert resumed["lrs"] == full["lrs"][3:]
    assert resumed["losses"] == full["losses"][3:]
    assert resumed["history"] == full["history"]  # the message hub's losses came back too
    assert resumed["end"]["iter"] == full["end"]["iter"] == 6
    assert_same(resumed["end"]["weights"], full["end"]["weights"])
    assert_same(resumed["end"]["optimizer"], full["end"]["optimizer"])


def test_load_from_starts_from_the_checkpoint_weights_with_a_fresh_optimizer(scenario):
    _, _, records = scenario
    loaded = records["loaded"]
    assert loaded["start"]["iter"] == 0
    assert_same(loaded["start"]["weights"], records["full"]["end"]["weights"])
    assert loaded["start"]["optimizer"]["state"] == {}
    assert loaded["lrs"] == records["full"]["lrs"][:1]


def test_mmengine_default_nccl_backend_becomes_gloo_with_one_warning(scenario):
    """Also: the log file is mmengine's (work_dir/TIMESTAMP/TIMESTAMP.log) and holds
    shardwise's own lines."""
    _, root, _ = scenario
    (log,) = (root / "full").glob("*/*.log")
    assert log.name == f"{log.parent.name}.log"
    text = log.read_text()
    assert text.count(NCCL_WARNING) == 1
    assert "dist_cfg: {'backend': 'gloo'}" in text
    assert f"Saved checkpoint {root / 'full' / 'iter_6.pth'}" in text


# ------------------------------------------------------------------------- across runners
def _shardwise_runner(support, work_dir: Path, hook: Any, **overrides: Any):
    """shardwise's Runner with the mmengine project's model, data, optimizer and schedulers."""
    from shardwise.runner import Runner

    return Runner(
        model=support.IntegrationRegressor(),
        work_dir=str(work_dir),
        train_dataloader=dict(dataset=support.IntegrationData(n=16), batch_size=4),
        optim_wrapper=copy.deepcopy(support.OPTIM_WRAPPER),
        param_scheduler=copy.deepcopy(support.PARAM_SCHEDULER),
        train_cfg=dict(by_epoch=False, max_iters=support.TOTAL_ITERS),
        default_hooks=dict(
            checkpoint=dict(interval=support.HALF, by_epoch=False),
            logger=dict(progress_bar=False),
        ),
        custom_hooks=[hook],
        randomness=dict(seed=0),
        **overrides,
    )


def test_a_flexible_runner_checkpoint_resumes_in_shardwise_runner(
    support, single_process_root, tmp_path
):
    records = _records(single_process_root)
    first, full = records["first_half"], records["full"]
    record = support.RecordRun()
    checkpoint = single_process_root / "halves" / "iter_3.pth"
    _shardwise_runner(support, tmp_path / "shardwise", record, resume=str(checkpoint)).train()
    assert record.start["iter"] == 3
    assert_same(record.start["weights"], first["end"]["weights"])
    assert_same(record.start["optimizer"], first["end"]["optimizer"])
    assert record.lrs == full["lrs"][3:]
    assert record.history[:3] == first["history"]


def test_a_shardwise_runner_checkpoint_resumes_in_flexible_runner(support, tmp_path):
    first = support.RecordRun(stop_at=support.HALF)
    with pytest.raises(support.Interrupted):
        _shardwise_runner(support, tmp_path / "shardwise", first).train()
    checkpoint = find_last_checkpoint(tmp_path / "shardwise")
    assert checkpoint == str(tmp_path / "shardwise" / "iter_3.pth")
    config = support.write_config(tmp_path / "config.py", SINGLE)
    record = tmp_path / "resumed.pt"
    support.train_flexible(
        config, tmp_path / "flexible", max_iters=6, resume=checkpoint, record=record
    )
    resumed = torch.load(record, weights_only=True)
    assert resumed["start"]["iter"] == 3
    assert_same(resumed["start"]["weights"], first.end["weights"])
    assert_same(resumed["start"]["optimizer"], first.end["optimizer"])
    assert resumed["history"][:3] == first.history
    assert resumed["end"]["iter"] == 6


def test_a_checkpoint_of_mmengine_own_runner_resumes_under_flexible_runner(support, tmp_path):
    """The committed fixture of tests/test_mmengine_checkpoint.py: mmengine's Runner (with
    EMAHook) after two epochs; its message hub's histories are mmengine HistoryBuffers."""
    from mmengine.runner import FlexibleRunner

    fixture = Path(__file__).parent / "data" / "mmengine_0.10.7_ema"
    expected = torch.load(fixture / "expected.pt", weights_only=True)
    record = support.RecordRun()
    FlexibleRunner(
        model=dict(type="IntegrationRegressor", width=4),
        work_dir=str(tmp_path),
        strategy=dict(type=SINGLE),
        train_dataloader=dict(
            dataset=dict(type="IntegrationData", n=24),
            sampler=dict(type="DefaultSampler", shuffle=True),
            collate_fn=dict(type="default_collate"),
            batch_size=8,
        ),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=4),
            dict(type="MultiStepLR", milestones=[1], by_epoch=True),
        ],
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(checkpoint=None),
        custom_hooks=[record],
        resume=str(fixture / "epoch_2.pth"),
    ).train()
    assert record.start["iter"] == expected["iter"]
    assert_same(record.start["weights"], expected["weights"])
    names = list(record.start["weights"])  # mmengine keys the state by parameter position
    by_name = {names[i]: state for i, state in expected["optimizer"]["state"].items()}
    assert_same(record.start["optimizer"]["state"], by_name)
    assert record.history[: expected["iter"]] == expected["losses"].tolist()
    assert record.end["iter"] == expected["iter"] + 3
