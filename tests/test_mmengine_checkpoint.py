"""Checkpoints written by mmengine 0.10 load without mmengine and without running their pickles.

Real files: mmengine 0.10.7's own Runner trains a tiny model (tests/data/make_mmengine_fixture.py,
with and without EMAHook) in a subprocess where mmengine is installed, and once for the
committed fixture tests/data/mmengine_0.10.7_ema/ so that these tests also run without it;
shardwise's Runner then loads the file for ``load_from`` and ``resume`` and must hold what
mmengine's runner held.

Crafted files: modules named like mmengine's are put into ``sys.modules`` for a ``torch.save``
only, holding classes that pickle byte for byte as mmengine's do, to write what real runs
rarely write (numpy 1 names, a message hub pickled whole, numpy arrays in the dataset meta) and
files whose unpickling would run code. Those are refused, naming the global, their payload
(creating a marker file) never runs, and the file's bytes are unchanged.
"""

from __future__ import annotations

import copy
import copyreg
import hashlib
import io
import os
import pickle
import shutil
import subprocess
import sys
import types
from collections import Counter, OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.full import load_full_checkpoint
from shardwise.checkpoint.mmengine_compat import (
    SAFE_GLOBALS,
    mmengine_safe_globals,
    optimizer_state_by_name,
)
from shardwise.runner import Hook
from shardwise.runner import MessageHub as ShardwiseMessageHub
from shardwise.strategies import SingleDeviceStrategy
from tests.test_runner import _runner
from tests.test_runner_support import DropoutRegressor

HISTORY_BUFFER = "mmengine.logging.history_buffer.HistoryBuffer"
ONE_CYCLE = "mmengine.optim.scheduler.param_scheduler.OneCycleParamScheduler"
CFG = "model = dict(type='DropoutRegressor')\ntrain_cfg = dict(by_epoch=True, max_epochs=12)\n"
DATA = Path(__file__).parent / "data"
MAKE_FIXTURE = DATA / "make_mmengine_fixture.py"
COMMITTED = DATA / "mmengine_0.10.7_ema"


# ----------------------------------------------------------------------------- real mmengine runs
@pytest.fixture(scope="module", params=["committed", "trained", "trained-ema"])
def mmengine_run(request, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """A checkpoint mmengine's Runner wrote after training, and what the runner held then
    (``expected.pt``, see make_mmengine_fixture.py). ``committed`` is the fixture in
    tests/data; the others are trained now, with mmengine 0.10.7, without and with EMAHook."""
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "committed":
        shutil.copytree(COMMITTED, out, dirs_exist_ok=True)
    else:
        pytest.importorskip("mmengine")
        ema = ["--ema"] if request.param == "trained-ema" else []
        done = subprocess.run(
            [sys.executable, str(MAKE_FIXTURE), str(out), *ema],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return out / "epoch_2.pth", torch.load(out / "expected.pt", weights_only=True)


SCHEDULERS = [
    dict(type="LinearLR", start_factor=0.1, by_epoch=False, begin=0, end=4),
    dict(type="MultiStepLR", milestones=[1], by_epoch=True),
]


def _runner_like_mmengine(tmp_path: Path, **overrides: Any):
    """shardwise's Runner configured as make_mmengine_fixture.py configured mmengine's, for
    three epochs of three iterations (one more epoch than mmengine trained)."""
    kwargs = dict(
        model=dict(type="DropoutRegressor", width=4),
        train_dataloader=dict(dataset=dict(type="RegressionData", n=24), batch_size=8),
        param_scheduler=SCHEDULERS,
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(logger=dict(progress_bar=False), checkpoint=None),
    )
    return _runner(tmp_path, **{**kwargs, **overrides})


class _StateAtStart(Hook):
    """What the runner holds when training starts, after ``load_from`` or ``resume``."""

    def before_train(self, runner) -> None:
        self.weights = {k: v.clone() for k, v in runner.strategy.model_state_dict().items()}
        self.optimizer = copy.deepcopy(runner.optim_wrapper.optimizer.state_dict())
        self.last_steps = [scheduler.last_step for scheduler in runner.param_schedulers]
        self.epoch, self.iter = runner.epoch, runner.iter
        losses = runner.message_hub.log_scalars.get("train/loss")
        self.losses = losses.data[0].tolist() if losses is not None else []


def _assert_tensors_equal(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


def _assert_optimizer_state(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    """Equal ``Optimizer.state_dict()``s (a list and a tuple of the same betas are equal)."""
    assert actual["state"].keys() == expected["state"].keys()
    for index, state in expected["state"].items():
        _assert_tensors_equal(actual["state"][index], state)

    def plain(group: dict[str, Any]) -> dict[str, Any]:
        return {k: tuple(v) if isinstance(v, list) else v for k, v in group.items()}

    assert [plain(g) for g in actual["param_groups"]] == [
        plain(g) for g in expected["param_groups"]
    ]


def _checksum(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_mmengine_checkpoint_loads_as_mmengine_wrote_it(mmengine_run):
    path, expected = mmengine_run
    before = _checksum(path)
    checkpoint = load_full_checkpoint(path)
    assert _checksum(path) == before
    _assert_tensors_equal(checkpoint["state_dict"], expected["weights"])
    _assert_optimizer_state(checkpoint["optimizer"], expected["optimizer"])
    assert [s["last_step"] for s in checkpoint["param_schedulers"]] == expected["last_steps"]
    meta = checkpoint["meta"]
    assert (meta["epoch"], meta["iter"]) == (expected["epoch"], expected["iter"])
    assert meta["mmengine_version"] == expected["mmengine_version"]
    hub = checkpoint["message_hub"]
    assert hub["log_scalars"]["train/loss"]["values"] == expected["losses"].tolist()
    assert type(hub["runtime_info"]["eta"]) is np.float64  # a numpy scalar
    if "ema_state_dict" in expected:
        _assert_tensors_equal(checkpoint["ema_state_dict"], expected["ema_state_dict"])
        assert not torch.equal(  # the EMA weights differ from the trained model's
            expected["weights"]["net.0.weight"], expected["ema_state_dict"]["module.net.0.weight"]
        )
    else:
        assert "ema_state_dict" not in checkpoint


def test_single_device_strategy_loads_the_weights_of_an_mmengine_checkpoint(mmengine_run, tmp_path):
    path, expected = mmengine_run
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path / "run"))
    torch.manual_seed(1)
    model = strategy.prepare(DropoutRegressor(width=4))
    assert not torch.equal(model.state_dict()["net.0.weight"], expected["weights"]["net.0.weight"])
    rest = strategy.load_checkpoint(path)
    _assert_tensors_equal(model.state_dict(), expected["weights"])
    assert rest["meta"]["mmengine_version"] == expected["mmengine_version"]


def test_runner_load_from_an_mmengine_checkpoint_starts_from_its_weights(mmengine_run, tmp_path):
    path, expected = mmengine_run
    start = _StateAtStart()
    runner = _runner_like_mmengine(tmp_path, load_from=str(path), custom_hooks=[start])
    runner.train()
    _assert_tensors_equal(start.weights, expected["weights"])
    assert (start.epoch, start.iter, start.optimizer["state"]) == (0, 0, {})
    assert [step for step in start.last_steps] == [0, 0]
    assert (runner.epoch, runner.iter) == (3, 9)  # load_from loads weights only


def test_runner_resumes_an_mmengine_checkpoint_where_it_stopped(mmengine_run, tmp_path):
    """Weights (with EMAHook: the EMA weights mmengine saved as ``state_dict``, which is what
    mmengine's Runner resumes without an EMAHook), optimizer, schedulers, position, logs."""
    path, expected = mmengine_run
    start = _StateAtStart()
    runner = _runner_like_mmengine(tmp_path, resume=str(path), custom_hooks=[start])
    runner.train()
    _assert_tensors_equal(start.weights, expected["weights"])
    _assert_optimizer_state(start.optimizer, expected["optimizer"])
    assert start.last_steps == expected["last_steps"]
    assert (start.epoch, start.iter) == (expected["epoch"], expected["iter"])
    assert start.losses == expected["losses"].tolist()
    assert (runner.epoch, runner.iter) == (3, expected["iter"] + 3)  # one more epoch


def test_a_strategy_resumes_weights_and_schedulers_of_an_mmengine_checkpoint(
    mmengine_run, tmp_path
):
    path, expected = mmengine_run
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path / "run"))
    model, _, schedulers = strategy.prepare(
        dict(type="DropoutRegressor", width=4),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        param_scheduler=SCHEDULERS,
        dispatch_kwargs=dict(epoch_length=3, max_epochs=3),
    )
    rest = strategy.resume(path, resume_optimizer=False)
    _assert_tensors_equal(model.state_dict(), expected["weights"])
    assert [scheduler.last_step for scheduler in schedulers] == expected["last_steps"]
    assert (rest["meta"]["epoch"], rest["meta"]["iter"]) == (expected["epoch"], expected["iter"])


def _fresh_adamw(**frozen: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = DropoutRegressor(width=4)
    for name, param in model.named_parameters():
        param.requires_grad_(not frozen.get(name.replace(".", "_"), False))
    params = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(params, lr=0.01)


def test_an_mmengine_optimizer_state_keyed_by_name_loads_as_torch_loads_it(mmengine_run):
    path, _ = mmengine_run
    model, optimizer = _fresh_adamw()
    optimizer.load_state_dict(load_full_checkpoint(path)["optimizer"])  # torch's own reading
    by_torch = optimizer.state_dict()
    saved = load_full_checkpoint(path)["optimizer"]
    model, optimizer = _fresh_adamw()
    by_name = optimizer_state_by_name(saved, optimizer, model)
    assert list(by_name["state"]) == ["net.0.weight", "net.0.bias", "net.3.weight", "net.3.bias"]
    set_optimizer_state_dict(model, optimizer, by_name)
    _assert_optimizer_state(optimizer.state_dict(), by_torch)
    assert optimizer_state_by_name(by_name, optimizer, model) == by_name  # already by name


def test_an_optimizer_state_from_other_parameter_groups_is_refused_naming_their_sizes():
    saved = _fresh_adamw()[1]
    saved.step()
    model, optimizer = _fresh_adamw(net_0_weight=True)
    with pytest.raises(ValueError, match=r"sizes \[4\], the optimizer \[3\]"):
        optimizer_state_by_name(saved.state_dict(), optimizer, model)


# ----------------------------------------------------------------------------- crafted files
MODULES = {
    "HistoryBuffer": "mmengine.logging.history_buffer",
    "MessageHub": "mmengine.logging.message_hub",
    "OneCycleParamScheduler": "mmengine.optim.scheduler.param_scheduler",
}


def _fake_mmengine(monkeypatch: pytest.MonkeyPatch, **classes: type) -> None:
    """Put the modules of :data:`MODULES` and their packages into ``sys.modules`` (in place of
    the real ones, if imported), holding ``classes`` by name (pickle finds a class, and a
    function defined in it, by its module and qualified name)."""
    for module in MODULES.values():
        parts = module.split(".")
        for end in range(1, len(parts) + 1):
            name = ".".join(parts[:end])
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for name, cls in classes.items():
        cls.__module__, cls.__qualname__ = MODULES[name], name
        for attribute, value in vars(cls).items():
            function = value.__func__ if isinstance(value, staticmethod) else value
            if isinstance(function, types.FunctionType):
                function.__module__, function.__qualname__ = cls.__module__, f"{name}.{attribute}"
        setattr(sys.modules[MODULES[name]], name, cls)


def _history_buffer_class() -> type:
    class HistoryBuffer:
        """mmengine 0.10's HistoryBuffer as it pickles (byte for byte, see
        ``test_the_stand_in_writer_pickles_a_history_buffer_as_mmengine_does``): the attributes
        ``__init__`` and ``update`` set, and ``statistics_methods``, its four statistic
        methods, which pickle as ``getattr(HistoryBuffer, name)``."""

        def __init__(self, log_history=(), count_history=(), max_length=1000000):
            self.max_length = max_length
            self._log_history = np.array(log_history)
            self._count_history = np.array(count_history)

        def update(self, log_val, count=1):
            self._log_history = np.append(self._log_history, log_val)
            self._count_history = np.append(self._count_history, count)

        def min(self):
            return self._log_history.min()

        def max(self):
            return self._log_history.max()

        def current(self):
            return self._log_history[-1]

        def mean(self):
            return self._log_history.mean()

        def __getstate__(self) -> dict:
            cls = type(self)
            methods = dict(min=cls.min, max=cls.max, current=cls.current, mean=cls.mean)
            return {**self.__dict__, "statistics_methods": methods}

    return HistoryBuffer


def test_the_stand_in_writer_pickles_a_history_buffer_as_mmengine_does():
    """The fake HistoryBuffer writes the bytes mmengine's own writes (torch.save's protocol)."""
    real = pytest.importorskip("mmengine.logging.history_buffer").HistoryBuffer

    def pickled(cls: type) -> bytes:
        buffer = cls([0.9], [1])
        buffer.update(0.7)
        return pickle.dumps(buffer, protocol=2)

    expected = pickled(real)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fake_mmengine(monkeypatch, HistoryBuffer=_history_buffer_class())
        assert pickled(sys.modules[MODULES["HistoryBuffer"]].HistoryBuffer) == expected
    assert b"getattr" in expected


def _one_cycle_class() -> type:
    class OneCycleParamScheduler:
        """mmengine 0.10's OneCycle scheduler as its state pickles: ``anneal_func`` is one of
        these static methods."""

        @staticmethod
        def _annealing_cos(start, end, pct):
            return end + (start - end) / 2.0 * (np.cos(np.pi * pct) + 1)

        @staticmethod
        def _annealing_linear(start, end, pct):
            return (end - start) * pct + start

    return OneCycleParamScheduler


def test_the_stand_in_writer_pickles_a_one_cycle_anneal_func_as_mmengine_does():
    mmengine_one_cycle = pytest.importorskip("mmengine.optim.scheduler").OneCycleLR
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)
    anneal_func = mmengine_one_cycle(optimizer, eta_max=0.1, total_steps=10).anneal_func
    expected = pickle.dumps(anneal_func, protocol=2)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fake_mmengine(monkeypatch, OneCycleParamScheduler=_one_cycle_class())
        fake = sys.modules[MODULES["OneCycleParamScheduler"]].OneCycleParamScheduler
        assert pickle.dumps(fake._annealing_cos, protocol=2) == expected


FAKES = {
    "HistoryBuffer": _history_buffer_class(),
    "OneCycleParamScheduler": _one_cycle_class(),
}
"""Fakes shared by the refusal tests (module-level: ``_fake_mmengine`` renames them once)."""


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
    before = {name: sys.modules.get(name) for name in ("mmengine", *MODULES.values())}
    with pytest.MonkeyPatch.context() as monkeypatch:
        _fake_mmengine(monkeypatch, **classes)
        torch.save(obj, path)
    assert {name: sys.modules.get(name) for name in before} == before


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
def test_the_ckpt_tools_inspect_verify_and_convert_an_mmengine_checkpoint(mmengine_run, tmp_path):
    from shardwise.cli import main

    path, expected = mmengine_run
    assert main(["ckpt", "inspect", str(path)]) == 0
    assert main(["ckpt", "verify", str(path)]) == 0
    out = tmp_path / "model.safetensors"
    assert main(["ckpt", "convert", str(path), str(out), "--to", "safetensors"]) == 0
    exported = pytest.importorskip("safetensors.torch").load_file(out)
    weights = {k.removeprefix("state_dict."): v for k, v in exported.items()}
    _assert_tensors_equal(
        {k: v for k, v in weights.items() if k in expected["weights"]}, expected["weights"]
    )


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
    _assert_tensors_equal(loaded["state_dict"], model.state_dict())


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


def test_a_one_cycle_scheduler_state_loads_with_its_anneal_func_named(tmp_path):
    one_cycle = _one_cycle_class()
    path = tmp_path / "epoch_1.pth"
    state = dict(eta_max=0.1, total_steps=10, anneal_func=one_cycle._annealing_linear)
    _save_as_mmengine(dict(param_schedulers=[state]), path, OneCycleParamScheduler=one_cycle)
    assert load_full_checkpoint(path)["param_schedulers"][0]["anneal_func"] == (
        "mmengine.optim.scheduler.param_scheduler.OneCycleParamScheduler._annealing_linear"
    )


def test_shardwise_continues_a_one_cycle_schedule_from_mmengine_as_mmengine_does(tmp_path):
    """mmengine's own OneCycleLR, three steps in, saved; the next steps' learning rates of
    mmengine's scheduler loading it (the oracle) and of shardwise's loading it agree."""
    mmengine_one_cycle = pytest.importorskip("mmengine.optim.scheduler").OneCycleLR
    from shardwise.optim.scheduler import OneCycleLR

    def optimizer() -> torch.optim.Optimizer:
        return torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1, momentum=0.9)

    def next_lrs(scheduler, steps: int = 6) -> list[float]:
        lrs = []
        for _ in range(steps):
            scheduler.optimizer.step()
            scheduler.step()
            lrs.append(scheduler.optimizer.param_groups[0]["lr"])
        return lrs

    saving = mmengine_one_cycle(optimizer(), eta_max=0.1, total_steps=10)
    next_lrs(saving, steps=3)
    path = tmp_path / "epoch_1.pth"
    torch.save(dict(param_schedulers=[saving.state_dict()]), path)
    oracle = mmengine_one_cycle(optimizer(), eta_max=0.1, total_steps=10)
    oracle.load_state_dict(torch.load(path, weights_only=False)["param_schedulers"][0])
    shardwise = OneCycleLR(optimizer(), eta_max=0.1, total_steps=10)
    shardwise.load_state_dict(load_full_checkpoint(path)["param_schedulers"][0])
    assert next_lrs(shardwise) == pytest.approx(next_lrs(oracle), rel=1e-12)


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


def _refusal(path: Path) -> str:
    """The error a load of ``path`` raises, after checking that the load left its bytes as
    they were."""
    before = _checksum(path)
    with pytest.raises(CheckpointError) as refused:
        load_full_checkpoint(path)
    assert _checksum(path) == before
    message = str(refused.value)
    assert str(path) in message and "weights_only=False" in message
    return message


def _payloads(marker: Path) -> dict[str, tuple[tuple, str]]:
    """Reduce tuples that would create ``marker``, with the global the refusal names."""
    return {
        "os.system": ((os.system, (f"touch {marker}",)), "posix.system"),
        "exec": ((exec, (f"open({str(marker)!r}, 'w').close()",)), "exec"),
        "Path.write_text": ((Path.write_text, (marker, "x")), f"{Path.__module__}.Path"),
    }


@pytest.mark.parametrize("name", ["os.system", "exec", "Path.write_text"])
def test_a_pickle_that_calls_a_function_is_refused_naming_it(tmp_path, marker, name):
    path = tmp_path / "evil.pth"
    reduce, refused_global = _payloads(marker)[name]
    torch.save(_evil_hub(_Reduce(reduce)), path)
    assert f"GLOBAL {refused_global} " in _refusal(path)


def test_a_bare_malicious_pickle_is_refused(tmp_path, marker):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(_Reduce((os.system, (f"touch {marker}",))), protocol=2))
    assert "posix.system" in _refusal(path)


def _getattr_abuses() -> dict[str, tuple[tuple, str]]:
    """``getattr`` calls in ways mmengine's checkpoints never pickle, on globals that are
    allowed themselves (``HistoryBuffer`` and ``OneCycleParamScheduler`` are the fakes
    pickled under mmengine's names), with the call the refusal names."""
    return {
        "on a torch class": (
            (getattr, (torch.Tensor, "min")),
            "builtins.getattr(torch.Tensor, 'min')",
        ),
        "on a numpy class": (
            (getattr, (np.ndarray, "tofile")),
            "builtins.getattr(numpy.ndarray, 'tofile')",
        ),
        "another method of HistoryBuffer": (
            (getattr, (FAKES["HistoryBuffer"], "update")),
            f"builtins.getattr({HISTORY_BUFFER}, 'update')",
        ),
        "a dunder of HistoryBuffer": (
            (getattr, (FAKES["HistoryBuffer"], "__class__")),
            f"builtins.getattr({HISTORY_BUFFER}, '__class__')",
        ),
        "a statistic of OneCycleParamScheduler": (
            (getattr, (FAKES["OneCycleParamScheduler"], "mean")),
            f"builtins.getattr({ONE_CYCLE}, 'mean')",
        ),
        "a name that is no string": (
            (getattr, (FAKES["HistoryBuffer"], ["mean"])),
            f"builtins.getattr({HISTORY_BUFFER}, ['mean'])",
        ),
        "on a value": (
            (getattr, (torch.zeros(1), "min")),
            "builtins.getattr(a torch.Tensor object, 'min')",
        ),
    }


@pytest.mark.parametrize(
    "abuse",
    [
        "on a torch class",
        "on a numpy class",
        "another method of HistoryBuffer",
        "a dunder of HistoryBuffer",
        "a statistic of OneCycleParamScheduler",
        "a name that is no string",
        "on a value",
    ],
)
def test_getattr_other_than_mmengine_s_is_refused_naming_the_call(tmp_path, abuse):
    path = tmp_path / "evil.pth"
    reduce, refused_call = _getattr_abuses()[abuse]
    _save_as_mmengine(_evil_hub(_Reduce(reduce)), path, **FAKES)
    assert refused_call in _refusal(path)


def test_a_file_building_a_one_cycle_scheduler_is_refused(tmp_path):
    named = _reducing_class()
    path = tmp_path / "evil.pth"
    _save_as_mmengine(
        _evil_hub(named((copyreg.__newobj__, (named,)))), path, OneCycleParamScheduler=named
    )
    assert f"the file builds a {ONE_CYCLE}" in _refusal(path)


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
    _save_as_mmengine(
        _evil_hub(named(_stand_in_abuses(marker)[abuse](named))), path, HistoryBuffer=named
    )
    expected = "posix.system" if abuse == "a call hidden in its state" else HISTORY_BUFFER
    assert expected in _refusal(path)


def test_weights_only_still_refuses_other_globals_inside_the_mmengine_allowance(tmp_path, marker):
    path = tmp_path / "evil.pth"
    torch.save(_evil_hub(_Reduce((os.system, (f"touch {marker}",)))), path)
    with mmengine_safe_globals():
        with pytest.raises(pickle.UnpicklingError, match="posix.system"):
            torch.load(path, weights_only=True)
