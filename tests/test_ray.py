"""Ray Train: shardwise as the per-worker loop of ``ray.train.torch.TorchTrainer`` on a local
Ray cluster (``ray.init(num_cpus=2)``, 2 CPU workers, gloo), and
:mod:`shardwise.integrations.ray`.

- an ``FSDPStrategy`` inside the loop adopts Ray's process group, trains, saves a sharded
  checkpoint that Ray reports, and a single process resumes it;
- a config trained through :func:`~shardwise.integrations.ray.fit` reports each committed
  checkpoint; killed after its first checkpoint, Ray restarts the trial, which resumes from
  ``ray.train.get_checkpoint()`` and reproduces the uninterrupted run's losses exactly; so
  does a runner built in the worker by a function;
- without Ray, importing the integration says what to install.

One Ray instance serves the module (its start-up takes 5-10 s on 2 cores); each
``TorchTrainer`` run takes 15-25 s, so the three runs through ``fit`` (about 70 s in all) are
marked slow.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from shardwise.registry import HOOKS
from shardwise.runner import Hook

REPO = Path(__file__).resolve().parents[1]
HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(
    not HAS_RAY, reason="Ray Train is not installed: pip install 'shardwise[ray]'"
)


@HOOKS.register_module()
class KillOnceHook(Hook):
    """Kills rank ``rank`` (``os._exit``: no clean-up, as a lost node) after iteration
    ``at_iter``, the first time only (``marker`` records that it happened), once Ray has
    registered the checkpoints reported so far (its controller polls the workers)."""

    def __init__(self, marker: str, at_iter: int, rank: int = 1) -> None:
        self.marker, self.at_iter, self.rank = marker, at_iter, rank

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 != self.at_iter or runner.rank != self.rank:
            return
        if not os.path.exists(self.marker):
            import ray.train

            ray.train.get_all_reported_checkpoints(
                consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED, timeout_s=60
            )
            Path(self.marker).write_text(f"killed rank {self.rank} after iteration {self.at_iter}")
            os._exit(1)


def _cfg(work_dir, **overrides) -> dict:
    """12 iterations of a small regression (64 samples, batch 8 per rank: 4 iterations per
    epoch on 2 ranks), a checkpoint every 4, every loss logged; DDP under Ray's launcher, so
    each checkpoint is one .pth file."""
    cfg = dict(
        custom_imports=dict(imports=["tests.test_runner_support", "tests.test_ray"]),
        model=dict(type="DropoutRegressor"),
        work_dir=str(work_dir),
        train_dataloader=dict(dataset=dict(type="RegressionData", n=64), batch_size=8),
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        param_scheduler=[dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=5)],
        train_cfg=dict(by_epoch=False, max_iters=12),
        default_hooks=dict(
            logger=dict(interval=1, progress_bar=False),
            checkpoint=dict(by_epoch=False, interval=4),
        ),
        randomness=dict(seed=0),
    )
    cfg.update(overrides)
    return cfg


def _losses(work_dir) -> dict[int, float]:
    """The logged training losses of every attempt in ``work_dir``, by iteration (a later
    attempt's win)."""
    out = {}
    for log in sorted(Path(work_dir).glob("*/metrics.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record["mode"] == "train":
                out[record["iter"]] = record["loss"]
    return out


# ----------------------------------------------------------------------------- a local cluster


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray Train is not installed")
    saved = {k: os.environ.get(k) for k in ("RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE")}
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no network here, nor in CI
    os.environ["RAY_AUTH_MODE"] = "disabled"  # no token written to ~/.ray
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        logging_level="WARNING",
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}},
    )
    yield ray
    ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _run_config(tmp_path, name, max_failures=0):
    from ray.train import FailureConfig, RunConfig

    return RunConfig(
        name=name,
        storage_path=str(tmp_path / "ray_results"),
        failure_config=FailureConfig(max_failures=max_failures),
    )


# ----------------------------------------------------------------------------- FSDP in the loop


def _fsdp_worker(config) -> None:
    """Ray's per-worker loop: an FSDPStrategy in Ray's process group, 3 steps, a sharded
    checkpoint reported by rank 0, the weights it holds saved for the test to compare (a
    model without BatchNorm: FSDP leaves each rank its own running statistics)."""
    import ray.train
    import torch.distributed as torch_dist

    from shardwise.strategies import FSDPStrategy
    from tests.test_fsdp import full_weights
    from tests.test_runner_support import DropoutRegressor
    from tests.toy import toy_batch

    rank = ray.train.get_context().get_world_rank()
    strategy = FSDPStrategy(
        work_dir=config["work_dir"],
        state_dict_cfg="sharded",
        env_kwargs=dict(randomness=dict(seed=0)),
    )
    model, wrapper = strategy.prepare(DropoutRegressor(), optim_wrapper=config["optim_wrapper"])
    losses = []
    for step in range(3):
        with wrapper.optim_context(model):
            loss = model(*toy_batch(step, rank))["loss"]
        wrapper.update_params(loss)
        losses.append(loss.item())
    strategy.save_checkpoint("step_3")
    path = os.path.join(config["work_dir"], "step_3")
    saved = full_weights(model)
    if rank == 0:
        torch.save(saved, os.path.join(config["work_dir"], "saved_weights.pt"))
    metrics = dict(
        loss=losses[-1],
        rank=strategy.rank,
        world_size=strategy.world_size,
        backend=torch_dist.get_backend(),
        group_alive=torch_dist.is_initialized(),
        is_dir=os.path.isdir(path),
    )
    checkpoint = ray.train.Checkpoint.from_directory(path) if rank == 0 else None
    ray.train.report(metrics, checkpoint=checkpoint)


@needs_ray
def test_fsdp_in_a_torch_trainer_saves_a_sharded_checkpoint_a_single_process_resumes(
    ray_cluster, tmp_path
):
    from ray.train import ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from shardwise.integrations.ray import checkpoint_in
    from shardwise.strategies import SingleDeviceStrategy
    from tests.test_runner_support import DropoutRegressor

    optim = dict(optimizer=dict(type="AdamW", lr=0.01))
    trainer = TorchTrainer(
        _fsdp_worker,
        train_loop_config=dict(work_dir=str(tmp_path / "work"), optim_wrapper=optim),
        scaling_config=ScalingConfig(num_workers=2),
        torch_config=TorchConfig(backend="gloo"),
        run_config=_run_config(tmp_path, "fsdp"),
    )
    result = trainer.fit()
    assert result.error is None
    metrics = result.metrics  # rank 0's
    assert (metrics["rank"], metrics["world_size"], metrics["backend"]) == (0, 2, "gloo")
    assert metrics["group_alive"] and metrics["is_dir"]  # Ray's group adopted and left alive
    with result.checkpoint.as_directory() as directory:
        names = sorted(p.name for p in Path(directory).iterdir())
        assert {"__0.metadata", "__0_0.distcp", "__1_0.distcp", "manifest.json"} <= set(names)
        strategy = SingleDeviceStrategy(work_dir=str(tmp_path / "single"))
        strategy.prepare(DropoutRegressor(), optim_wrapper=optim)
        meta = strategy.resume(checkpoint_in(directory))["meta"]
    assert (meta["format"], meta["world_size"]) == ("sharded", 2)
    saved = torch.load(tmp_path / "work" / "saved_weights.pt", weights_only=True)
    resumed = strategy.model_state_dict()
    assert sorted(resumed) == sorted(saved)
    assert [k for k in saved if not torch.equal(resumed[k], saved[k])] == []  # bit for bit
    assert strategy.optim_state_dict()["state"]  # the optimizer state came back too


# ----------------------------------------------------------------------------- a config via fit()


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory):
    from ray.train import ScalingConfig

    from shardwise.integrations.ray import fit

    tmp_path = tmp_path_factory.mktemp("ray_uninterrupted")
    result = fit(
        _cfg(tmp_path / "work"),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, "uninterrupted"),
    )
    return result, tmp_path / "work" / "uninterrupted"


@needs_ray
@pytest.mark.slow
def test_fit_reports_every_committed_checkpoint_with_its_metrics(uninterrupted):
    result, work_dir = uninterrupted
    assert result.error is None
    assert result.metrics["iter"] == 12 and result.metrics["checkpoint"] == "iter_12.pth"
    assert result.metrics["loss"] == pytest.approx(_losses(work_dir)[12], abs=0, rel=1e-12)
    reported = sorted(metrics["iter"] for _, metrics in result.best_checkpoints)
    assert reported == [4, 8, 12]
    with result.checkpoint.as_directory() as directory:  # a file checkpoint: its own folder
        assert sorted(p.name for p in Path(directory).iterdir()) == [
            "iter_12.pth",
            "iter_12.pth.manifest.json",
        ]
    assert not (work_dir / ".ray_report").exists()  # the staging links are gone
    assert {p.name for p in work_dir.glob("iter_*.pth")} == {
        "iter_4.pth",
        "iter_8.pth",
        "iter_12.pth",
    }


@needs_ray
@pytest.mark.slow
def test_a_killed_trial_resumes_from_rays_checkpoint_with_the_uninterrupted_losses(
    uninterrupted, tmp_path
):
    from ray.train import ScalingConfig

    from shardwise.integrations.ray import fit

    want, want_dir = uninterrupted
    marker = tmp_path / "killed"
    hooks = [dict(type="KillOnceHook", marker=str(marker), at_iter=6)]
    checkpoint = dict(by_epoch=False, interval=4, max_keep_ckpts=1)
    result = fit(
        _cfg(
            tmp_path / "work",
            custom_hooks=hooks,
            default_hooks=dict(logger=dict(interval=1, progress_bar=False), checkpoint=checkpoint),
        ),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, "interrupted", max_failures=1),
    )
    assert result.error is None
    assert marker.exists()  # rank 1 was killed after iteration 6 (iter_4 committed)
    work_dir = tmp_path / "work" / "interrupted"
    attempts = sorted(work_dir.glob("*/metrics.jsonl"))
    assert len(attempts) == 2
    first_iters = [json.loads(line)["iter"] for line in attempts[1].read_text().splitlines()]
    assert first_iters[0] == 5  # the restarted trial resumed from iter_4, Ray's checkpoint
    assert result.metrics["loss"] == want.metrics["loss"]  # the same final loss, exactly
    assert _losses(work_dir) == _losses(want_dir)  # and every loss before it
    final = torch.load(work_dir / "iter_12.pth", weights_only=True)["state_dict"]
    expected = torch.load(want_dir / "iter_12.pth", weights_only=True)["state_dict"]
    assert all(torch.equal(final[k], expected[k]) for k in expected)
    # max_keep_ckpts=1 prunes what the resumed attempt saved (iter_8), never Ray's copies;
    # iter_4 stays: the attempt resumed from Ray's copy of it, which does not hand over the
    # first attempt's retention list (shardwise's rule for a checkpoint copied elsewhere)
    assert {p.name for p in work_dir.glob("iter_*.pth")} == {"iter_4.pth", "iter_12.pth"}
    reported = sorted(metrics["iter"] for _, metrics in result.best_checkpoints)
    assert reported == [4, 8, 12]
    for ray_checkpoint, metrics in result.best_checkpoints:
        with ray_checkpoint.as_directory() as directory:
            assert (Path(directory) / f"iter_{metrics['iter']}.pth").is_file()


def _build_runner(work_dir, resume):
    """A runner built in the worker (the config of :func:`_cfg` as objects), killed once
    after iteration 10."""
    import tests.test_runner_support  # noqa: F401 - registers the model and the dataset
    from shardwise.runner import Runner

    kwargs = _cfg(work_dir, resume=resume)
    del kwargs["custom_imports"]
    marker = os.path.join(os.path.dirname(work_dir), "killed")
    return Runner(**kwargs, custom_hooks=[KillOnceHook(marker, at_iter=10)])


@needs_ray
@pytest.mark.slow
def test_a_runner_built_in_the_worker_is_reported_and_resumed_as_a_config_is(
    uninterrupted, tmp_path
):
    from ray.train import ScalingConfig

    from shardwise.integrations.ray import fit

    want, want_dir = uninterrupted
    result = fit(
        _build_runner,
        scaling_config=ScalingConfig(num_workers=2),
        run_config=_run_config(tmp_path, "factory", max_failures=1),
        work_dir=tmp_path / "work",
    )
    assert result.error is None
    assert (tmp_path / "work" / "killed").exists()
    work_dir = tmp_path / "work" / "factory"
    attempts = sorted(work_dir.glob("*/metrics.jsonl"))
    assert len(attempts) == 2
    assert json.loads(attempts[1].read_text().splitlines()[0])["iter"] == 9  # from iter_8
    assert _losses(work_dir) == _losses(want_dir)
    assert result.metrics["loss"] == want.metrics["loss"]
    assert sorted(metrics["iter"] for _, metrics in result.best_checkpoints) == [4, 8, 12]


# ----------------------------------------------------------------------------- without a cluster


@needs_ray
def test_checkpoint_in_finds_a_file_checkpoint_and_names_what_a_folder_holds(tmp_path):
    from shardwise.integrations.ray import _as_ray_directory, checkpoint_in
    from shardwise.strategies import SingleDeviceStrategy

    strategy = SingleDeviceStrategy(work_dir=str(tmp_path))
    strategy.prepare(nn.Linear(2, 1), optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)))
    strategy.save_checkpoint("iter_2.pth")
    with _as_ray_directory(str(tmp_path / "iter_2.pth")) as directory:
        assert Path(directory).parent == tmp_path / ".ray_report"
        assert sorted(p.name for p in Path(directory).iterdir()) == [
            "iter_2.pth",
            "iter_2.pth.manifest.json",
        ]
        assert checkpoint_in(directory) == str(Path(directory) / "iter_2.pth")
        linked = (Path(directory) / "iter_2.pth").stat().st_ino
        assert linked == (tmp_path / "iter_2.pth").stat().st_ino  # hard-linked, not copied
        strategy.resume(checkpoint_in(directory))
    assert not (tmp_path / ".ray_report").exists()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("")
    with pytest.raises(FileNotFoundError, match=r"no committed shardwise checkpoint.*notes\.txt"):
        checkpoint_in(tmp_path / "empty")


@needs_ray
def test_the_report_hook_does_nothing_outside_a_ray_worker(tmp_path):
    from shardwise.integrations.ray import RayReportHook
    from shardwise.runner import Runner

    runner = Runner.from_cfg(_cfg(tmp_path, custom_hooks=[dict(type="RayReportHook")]))
    assert any(isinstance(hook, RayReportHook) for hook in runner.hooks)
    runner.train()
    assert runner.iter == 12 and (tmp_path / "iter_12.pth").is_file()


@needs_ray
def test_fit_refuses_a_bad_config_on_the_driver_before_any_worker_starts(tmp_path):
    from shardwise.integrations.ray import fit

    bad = _cfg(tmp_path, optim_wrapper=dict(optimizer=dict(type="NoSuchOptimizer", lr=0.1)))
    with pytest.raises(KeyError, match="NoSuchOptimizer"):
        fit(bad)  # no ray.init: refused before Ray is asked for anything


def test_without_ray_the_import_error_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    monkeypatch.delitem(sys.modules, "shardwise.integrations.ray", raising=False)
    with pytest.raises(ImportError) as excinfo:
        importlib.import_module("shardwise.integrations.ray")
    message = str(excinfo.value)
    assert "pip install 'shardwise[ray]'" in message
    assert "'ray'" in message and "not installed" in message
