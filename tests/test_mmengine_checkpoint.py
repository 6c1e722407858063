"""Checkpoints written by mmengine 0.10 load without mmengine and without running their pickles.

mmengine is not installed: a file is written with modules named like mmengine's put into
``sys.modules`` for the ``torch.save`` only, holding classes that pickle as mmengine's do.
Crafted files whose unpickling would run code are refused, and their payload (creating a
marker file) never runs.
"""

from __future__ import annotations

import copyreg
import importlib.util
import io
import os
import pickle
import sys
import types
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.full import load_full_checkpoint
from shardwise.checkpoint.mmengine_compat import SAFE_GLOBALS, mmengine_safe_globals
from shardwise.runner import Hook
from shardwise.runner import MessageHub as ShardwiseMessageHub
from shardwise.strategies import SingleDeviceStrategy
from tests.test_runner import _runner
from tests.test_runner_support import DropoutRegressor

HISTORY_BUFFER = "mmengine.logging.history_buffer.HistoryBuffer"
CFG = "model = dict(type='DropoutRegressor')\ntrain_cfg = dict(by_epoch=True, max_epochs=12)\n"


# ----------------------------------------------------------------------------- writing
MODULES = {
    "HistoryBuffer": "mmengine.logging.history_buffer",
    "MessageHub": "mmengine.logging.message_hub",
}


def _fake_mmengine(monkeypatch: pytest.MonkeyPatch, **classes: type) -> None:
    """Put ``mmengine``, ``mmengine.logging`` and the modules of :data:`MODULES` into
    ``sys.modules``, holding ``classes`` by name (pickle finds a class by its module and
    name)."""
    for name in ("mmengine", "mmengine.logging", *MODULES.values()):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for name, cls in classes.items():
        cls.__module__, cls.__qualname__ = MODULES[name], name
        setattr(sys.modules[MODULES[name]], name, cls)


def _history_buffer_class() -> type:
    class HistoryBuffer:
        """mmengine 0.10's HistoryBuffer as it pickles: the attributes ``__init__`` and
        ``update`` set (the statistics methods live on the class)."""

        _statistics_methods: dict = {}

        def __init__(self, log_history=(), count_history=(), max_length=1000000):
            self.max_length = max_length
            self._log_history = np.array(log_history)
            self._count_history = np.array(count_history)

        def update(self, log_val, count=1):
            self._log_history = np.append(self._log_history, log_val)
            self._count_history = np.append(self._count_history, count)

    return HistoryBuffer


def _trained() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = DropoutRegressor()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model(torch.randn(8, 4), torch.randn(8, 1))["loss"].backward()
    optimizer.step()
    return model, optimizer


def _mmengine_checkpoint(history_buffer: type, model, optimizer) -> dict[str, Any]:
    """What mmengine 0.10's ``Runner.save_checkpoint`` writes after one epoch of 8 iterations
    with a best-checkpoint hook on an mmpose-like dataset."""
    loss = history_buffer([0.9], [1])
    loss.update(0.7)
    loss.update(0.41)
    scalars = OrderedDict(
        [
            ("train/lr", history_buffer([0.001], [1])),
            ("train/loss", loss),
            ("train/time", history_buffer([0.021, 0.019], [1, 1])),
            ("val/accuracy", history_buffer([0.8734], [1])),
        ]
    )
    dataset_meta = dict(
        classes=("cat", "dog"),
        palette=[(220, 20, 60), (119, 11, 32)],
        sigmas=np.array([0.026, 0.025], dtype=np.float32),
        keypoint_colors=np.array([[255, 0, 0], [0, 255, 0]], dtype=np.uint8),
    )
    runtime_info = OrderedDict(
        cfg=CFG,
        seed=1234,
        experiment_name="toy_20240601_120000",
        mmengine_version="0.10.4",
        epoch=1,
        iter=8,
        max_epochs=12,
        max_iters=96,
        dataset_meta=dataset_meta,
        best_score=np.float64(0.8734),  # a metric computed with numpy
        best_ckpt="work_dirs/toy/best_accuracy_epoch_1.pth",
        last_ckpt="work_dirs/toy/epoch_1.pth",
    )
    state_dict = OrderedDict((k, v.detach().cpu()) for k, v in model.state_dict().items())
    state_dict._metadata = model.state_dict()._metadata  # mmengine's weights_to_cpu keeps it
    linear = dict(start_factor=0.1, end_factor=1.0, total_iters=4, param_name="lr", begin=0)
    linear.update(end=5, by_epoch=False, base_values=[0.01], last_step=5, _global_step=8)
    linear.update(verbose=False, _last_value=[0.01])
    multistep = dict(milestones=Counter([8, 11]), gamma=0.1, param_name="lr", begin=0)
    multistep.update(end=12, by_epoch=True, base_values=[0.01], last_step=1, _global_step=1)
    multistep.update(verbose=False, _last_value=[0.01])
    return dict(
        meta=dict(
            epoch=1,
            iter=8,
            cfg=CFG,
            seed=1234,
            experiment_name="toy_20240601_120000",
            time="20240601_120512",
            mmengine_version="0.10.4",
            dataset_meta=dataset_meta,
        ),
        state_dict=state_dict,
        message_hub=dict(
            log_scalars=scalars,
            runtime_info=runtime_info,
            resumed_keys=OrderedDict((key, True) for key in [*scalars, *runtime_info]),
        ),
        optimizer=optimizer.state_dict(),
        param_schedulers=[linear, multistep],
    )


def _save_as_mmengine(obj: Any, path: Path, **classes: type) -> None:
    """``torch.save`` with the fake mmengine modules present, removed again afterwards."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fake_mmengine(monkeypatch, **classes)
        torch.save(obj, path)
    assert "mmengine" not in sys.modules and importlib.util.find_spec("mmengine") is None


@pytest.fixture
def saved(tmp_path) -> tuple[Path, dict[str, torch.Tensor], torch.optim.Optimizer]:
    """An mmengine 0.10 checkpoint file, the weights and the optimizer it was written from."""
    model, optimizer = _trained()
    history_buffer = _history_buffer_class()
    path = tmp_path / "epoch_1.pth"
    _save_as_mmengine(
        _mmengine_checkpoint(history_buffer, model, optimizer), path, HistoryBuffer=history_buffer
    )
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return path, weights, optimizer


@pytest.fixture(autouse=True)
def allowlist_scoped():
    """No test leaves an entry of the mmengine allowance in torch's process-wide weights_only
    allowlist, nor removes one that was there (torch adds its own entries as it imports
    parts of itself, e.g. torch._dynamo)."""
    before = set(torch.serialization.get_safe_globals())
    yield
    after = set(torch.serialization.get_safe_globals())
    assert before <= after and not (after - before) & set(SAFE_GLOBALS)


# ----------------------------------------------------------------------------- loading
def _assert_weights(state_dict: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]):
    assert state_dict.keys() == weights.keys()
    for key, value in weights.items():
        assert torch.equal(state_dict[key], value), key


def test_single_device_strategy_loads_the_weights_of_an_mmengine_checkpoint(saved, tmp_path):
    path, weights, _ = saved
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path / "run"))
    torch.manual_seed(1)
    model = strategy.prepare(DropoutRegressor())
    assert not torch.equal(model.state_dict()["net.0.weight"], weights["net.0.weight"])
    rest = strategy.load_checkpoint(path)
    _assert_weights(model.state_dict(), weights)
    assert rest["meta"]["mmengine_version"] == "0.10.4"


class _WeightsAtStart(Hook):
    def before_run(self, runner) -> None:
        self.weights = {k: v.clone() for k, v in runner.strategy.model_state_dict().items()}


def test_runner_load_from_an_mmengine_checkpoint_starts_from_its_weights(saved, tmp_path):
    path, weights, _ = saved
    hook = _WeightsAtStart()
    runner = _runner(
        tmp_path,
        load_from=str(path),
        custom_hooks=[hook],
        train_cfg=dict(by_epoch=False, max_iters=1),
        default_hooks=dict(logger=dict(progress_bar=False), checkpoint=None),
    )
    runner.train()
    _assert_weights(hook.weights, weights)
    assert runner.iter == 1  # load_from loads weights only: training starts at iteration 0


def test_the_ckpt_tools_inspect_verify_and_convert_an_mmengine_checkpoint(saved, tmp_path):
    from shardwise.cli import main

    path, weights, _ = saved
    assert main(["ckpt", "inspect", str(path)]) == 0
    assert main(["ckpt", "verify", str(path)]) == 0
    out = tmp_path / "model.safetensors"
    assert main(["ckpt", "convert", str(path), str(out), "--to", "safetensors"]) == 0
    exported = pytest.importorskip("safetensors.torch").load_file(out)
    _assert_weights({k.removeprefix("state_dict."): v for k, v in exported.items()}, weights)


def test_the_message_hub_optimizer_and_numpy_values_come_back_as_written(saved):
    path, _, optimizer = saved
    checkpoint = load_full_checkpoint(path)
    hub = checkpoint["message_hub"]
    assert hub["log_scalars"]["train/loss"] == {
        "values": [0.9, 0.7, 0.41],
        "counts": [1, 1, 1],
        "max_length": 1000000,
    }
    best = hub["runtime_info"]["best_score"]
    assert type(best) is np.float64 and best == np.float64(0.8734)
    sigmas = checkpoint["meta"]["dataset_meta"]["sigmas"]
    assert sigmas.dtype == np.float32 and sigmas.tolist() == pytest.approx([0.026, 0.025])
    assert checkpoint["meta"]["dataset_meta"]["keypoint_colors"].dtype == np.uint8
    assert checkpoint["param_schedulers"][1]["milestones"] == Counter([8, 11])
    exp_avg = optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(checkpoint["optimizer"]["state"][0]["exp_avg"], exp_avg)
    shardwise_hub = ShardwiseMessageHub()  # plain data that shardwise's hub resumes from
    shardwise_hub.load_state_dict(hub)
    assert shardwise_hub.get_scalar("train/loss").current() == 0.41
    assert shardwise_hub.get_info("last_ckpt") == "work_dirs/toy/epoch_1.pth"


def test_a_checkpoint_pickled_under_numpy_1_loads(tmp_path):
    """numpy 1 names its array and scalar rebuilders ``numpy.core.multiarray.*``."""
    model, optimizer = _trained()
    history_buffer = _history_buffer_class()
    buffer = io.BytesIO()
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fake_mmengine(monkeypatch, HistoryBuffer=history_buffer)
        checkpoint = _mmengine_checkpoint(history_buffer, model, optimizer)
        torch.save(checkpoint, buffer, _use_new_zipfile_serialization=False)
    data = buffer.getvalue()
    assert data.count(b"numpy._core.multiarray") >= 2  # _reconstruct and scalar
    path = tmp_path / "numpy1.pth"
    path.write_bytes(data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    loaded = load_full_checkpoint(path)
    assert loaded["message_hub"]["log_scalars"]["train/time"]["values"] == [0.021, 0.019]
    assert loaded["message_hub"]["runtime_info"]["best_score"] == np.float64(0.8734)
    _assert_weights(loaded["state_dict"], model.state_dict())


def test_a_message_hub_pickled_whole_by_early_mmengine_loads_as_its_state_dict(tmp_path):
    history_buffer = _history_buffer_class()

    class MessageHub:
        def __init__(self) -> None:
            self._log_scalars = OrderedDict([("train/loss", history_buffer([0.5, 0.25], [1, 1]))])
            self._runtime_info = OrderedDict(iter=8, best_score=np.float64(0.75))
            self._resumed_keys = OrderedDict([("train/loss", True), ("iter", True)])

    model, _ = _trained()
    path = tmp_path / "early.pth"
    _save_as_mmengine(
        dict(state_dict=model.state_dict(), message_hub=MessageHub()),
        path,
        HistoryBuffer=history_buffer,
        MessageHub=MessageHub,
    )
    hub = load_full_checkpoint(path)["message_hub"]
    assert hub == {
        "log_scalars": {
            "train/loss": {"values": [0.5, 0.25], "counts": [1, 1], "max_length": 1000000}
        },
        "runtime_info": {"iter": 8, "best_score": 0.75},
        "resumed_keys": {"train/loss": True, "iter": True},
    }
    shardwise_hub = ShardwiseMessageHub()
    shardwise_hub.load_state_dict(hub)
    assert shardwise_hub.get_scalar("train/loss").mean() == 0.375


def test_globals_allowed_before_a_load_stay_allowed_after_it(saved):
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([SAFE_GLOBALS[0]])
    try:
        load_full_checkpoint(saved[0])
        assert set(torch.serialization.get_safe_globals()) == {*before, SAFE_GLOBALS[0]}
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


# ----------------------------------------------------------------------------- refusing
def _reducing_class() -> type:
    class Reduce:
        """Pickles as the call ``reduce`` describes (a ``__reduce__`` tuple)."""

        def __init__(self, reduce: tuple) -> None:
            self.reduce = reduce

        def __reduce__(self) -> tuple:
            return self.reduce

    return Reduce


_Reduce = _reducing_class()


@pytest.fixture
def marker(tmp_path) -> Path:
    """The file a payload would create; it must never appear."""
    path = tmp_path / "PWNED"
    yield path
    assert not path.exists(), "a payload ran while loading"


def _evil_hub(payload: Any) -> dict[str, Any]:
    """A checkpoint shaped like mmengine's with ``payload`` among the logged scalars."""
    return dict(
        state_dict={"net.0.weight": torch.zeros(2)},
        message_hub=dict(log_scalars={"train/loss": payload}, runtime_info={}, resumed_keys={}),
    )


def _payloads(marker: Path) -> dict[str, tuple]:
    return {
        "os.system": (os.system, (f"touch {marker}",)),
        "exec": (exec, (f"open({str(marker)!r}, 'w').close()",)),
        "Path.write_text": (Path.write_text, (marker, "x")),
    }


@pytest.mark.parametrize("name", ["os.system", "exec", "Path.write_text"])
def test_a_pickle_that_calls_a_function_is_refused_naming_it(tmp_path, marker, name):
    path = tmp_path / "evil.pth"
    torch.save(_evil_hub(_Reduce(_payloads(marker)[name])), path)
    with pytest.raises(CheckpointError) as refused:
        load_full_checkpoint(path)
    message = str(refused.value)
    assert str(path) in message and "weights_only=False" in message
    assert {"os.system": "posix.system", "exec": "exec", "Path.write_text": "getattr"}[
        name
    ] in message


def test_a_bare_malicious_pickle_is_refused(tmp_path, marker):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_Reduce((os.system, (f"touch {marker}",))), protocol=2))
    with pytest.raises(CheckpointError, match="posix.system"):
        load_full_checkpoint(path)


def test_an_installed_mmengine_class_never_runs_while_loading(tmp_path, marker):
    """A class under mmengine's name whose methods write the marker: the file gets the inert
    stand-in, even while that module is importable."""

    class HistoryBuffer:
        def __init__(self, *args) -> None:
            self.max_length = 10

        def __setstate__(self, state) -> None:
            marker.touch()

    path = tmp_path / "epoch_1.pth"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fake_mmengine(monkeypatch, HistoryBuffer=HistoryBuffer)
        torch.save(_evil_hub(HistoryBuffer()), path)
        loaded = load_full_checkpoint(path)
    assert loaded["message_hub"]["log_scalars"]["train/loss"]["max_length"] == 10


def _stand_in_abuses(marker: Path) -> dict[str, Any]:
    """Reduce tuples that use the class pickled as ``mmengine...HistoryBuffer`` (``named``)
    in ways mmengine never does."""
    return {
        "called with arguments": lambda named: (named, (f"touch {marker}",)),
        "a dunder in its state": lambda named: (
            copyreg.__newobj__,
            (named,),
            {"__class__": OrderedDict},
        ),
        "a state that is no dict": lambda named: (
            copyreg.__newobj__,
            (named,),
            ({}, {"__class__": OrderedDict}),
        ),
        "a call hidden in its state": lambda named: (
            copyreg.__newobj__,
            (named,),
            {"max_length": _Reduce((os.system, (f"touch {marker}",)))},
        ),
    }


@pytest.mark.parametrize(
    "abuse",
    [
        "called with arguments",
        "a dunder in its state",
        "a state that is no dict",
        "a call hidden in its state",
    ],
)
def test_a_file_abusing_the_history_buffer_name_is_refused(tmp_path, marker, abuse):
    named = _reducing_class()
    path = tmp_path / "evil.pth"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fake_mmengine(monkeypatch, HistoryBuffer=named)
        torch.save(_evil_hub(named(_stand_in_abuses(marker)[abuse](named))), path)
    with pytest.raises(CheckpointError) as refused:
        load_full_checkpoint(path)
    assert str(path) in str(refused.value)
    expected = "posix.system" if abuse == "a call hidden in its state" else HISTORY_BUFFER
    assert expected in str(refused.value)


def test_weights_only_still_refuses_other_globals_inside_the_mmengine_allowance(tmp_path, marker):
    path = tmp_path / "evil.pth"
    torch.save(_evil_hub(_Reduce((os.system, (f"touch {marker}",)))), path)
    with mmengine_safe_globals():
        with pytest.raises(pickle.UnpicklingError, match="posix.system"):
            torch.load(path, weights_only=True)
