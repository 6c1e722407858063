"""``shardwise train`` and ``shardwise plot`` as a user runs them: real processes, real files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from shardwise.cli import build_parser, main
from shardwise.runner.commands import _worker_argv, load_train_config
from shardwise.runner.launch import LaunchOptions, forwarded_signals, launch, torchrun_args
from shardwise.runner.plot import read_metrics
from tests.distributed import REPO, run_torchrun
from tests.test_checkpoint_safety import tree_digest

# A tiny iteration-based run: 64 samples, batch 8 -> 8 iterations per epoch (4 per rank on 2).
# STOP_AT / CRASH_AT in the environment add a hook that interrupts the run.
TINY = """
import os
custom_imports = dict(imports=["tests.test_runner_support"])
model = dict(type="DropoutRegressor")
strategy = dict(type="DDPStrategy")
train_dataloader = dict(dataset=dict(type="RegressionData", n=64), batch_size=8)
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=0.01))
param_scheduler = [dict(type="LinearLR", start_factor=0.1, by_epoch=False, end=5)]
train_cfg = dict(by_epoch=False, max_iters=12)
default_hooks = dict(
    logger=dict(interval=2), checkpoint=dict(by_epoch=False, interval=4)
)
randomness = dict(seed=0)
custom_hooks = []
if "STOP_AT" in os.environ:
    custom_hooks = [dict(type="StopAfterHook", at_iter=int(os.environ["STOP_AT"]))]
if "CRASH_AT" in os.environ:
    custom_hooks = [dict(type="CrashOnceHook", at_iter=int(os.environ["CRASH_AT"]), rank=1)]
"""


def shardwise(*args: str, env: dict[str, str] | None = None, timeout: float = 180):
    """Run ``python -m shardwise.cli ARGS`` in the test's working directory (the repository's
    root, or a temporary one: see ``outside_the_repository`` in conftest.py), the repository
    importable."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(env or {})}
    for name in ("STOP_AT", "CRASH_AT"):
        if env is None or name not in env:
            full_env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "shardwise.cli", *args],
        cwd=os.getcwd(),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


def train(config: str, work_dir, *args: str, env: dict[str, str] | None = None):
    """``shardwise train CONFIG --work-dir WORK_DIR ARGS``."""
    return shardwise("train", config, "--work-dir", str(work_dir), *args, env=env)


@pytest.fixture
def config(tmp_path) -> str:
    path = tmp_path / "tiny.py"
    path.write_text(TINY)
    return str(path)


def records(work_dir, mode="train") -> dict[int, dict]:
    out = {}
    for log in sorted(Path(work_dir).glob("*/metrics.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            if record["mode"] == mode:
                out[record["iter"]] = record
    return out


def losses(work_dir) -> list[tuple[int, float]]:
    return [(i, r["loss"]) for i, r in sorted(records(work_dir).items())]


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, (
        f"rc {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


# ----------------------------------------------------------------------------- one process
def test_train_runs_in_this_process_and_writes_logs_checkpoints_and_the_config(tmp_path, config):
    work_dir = tmp_path / "work"
    proc = ok(train(config, work_dir))
    assert "Iter(train) [12/12]" in proc.stdout
    assert sorted(records(work_dir)) == [2, 4, 6, 8, 10, 12]
    assert {p.name for p in work_dir.glob("*.pth")} == {"iter_4.pth", "iter_8.pth", "iter_12.pth"}
    assert (work_dir / "last_checkpoint").read_text().endswith("iter_12.pth")
    assert (work_dir / "tiny.py").is_file()  # the config, as it ran


def test_cfg_options_override_the_config_in_process(tmp_path, config):
    work_dir = tmp_path / "work"
    overrides = ["train_cfg.max_iters=6", "default_hooks.logger.interval=3"]
    assert main(["train", config, "--work-dir", str(work_dir), "--cfg-options", *overrides]) == 0
    assert sorted(records(work_dir)) == [3, 6]


def test_an_interrupted_run_resumed_with_resume_continues_with_the_same_losses(tmp_path, config):
    ok(train(config, tmp_path / "whole"))
    stopped = train(config, tmp_path / "parts", env=dict(STOP_AT="7"))
    assert stopped.returncode == 3
    assert max(records(tmp_path / "parts")) == 6
    ok(train(config, tmp_path / "parts", "--resume"))
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


def _parsed(*argv: str):
    return build_parser().parse_args(["train", *argv])


def test_resume_and_load_from_flags_set_mmengine_s_resume_and_load_from(tmp_path, config):
    ckpt = tmp_path / "iter_4.pth"
    torch.save({"state_dict": {}}, ckpt)
    Path(config).write_text(TINY + f"\nload_from = {str(ckpt)!r}\n")
    auto = load_train_config(_parsed(config, "--resume"))  # the latest in work_dir, as mmengine
    assert (auto.resume, auto.load_from) == (True, None)
    given = load_train_config(_parsed(config, "--resume", str(ckpt)))
    assert (given.resume, given.load_from) == (True, str(ckpt))
    weights = load_train_config(_parsed(config, "--load-from", str(ckpt)))
    assert (weights.get("resume", False), weights.load_from) == (False, str(ckpt))
    default = load_train_config(_parsed(config))
    assert default.work_dir == str(Path("work_dirs/tiny").absolute())


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "edit, extra, words",
    [
        ("model = None", [], ["has no 'model'", "model=dict(type="]),
        ("train_cfg = dict(by_epoch=False)", [], ["no max_iters", "max_iters=N"]),
        (
            "train_cfg = dict(by_epoch=False, max_iters=4, val_interval=2)",
            [],
            ["val_interval=2", "no val_dataloader"],
        ),
        (
            "",
            ["--resume", "/nowhere/iter_4.pth"],
            ["--resume /nowhere/iter_4.pth", "no such checkpoint"],
        ),
        ("", ["--cfg-options", "optim_wraper.lr=3"], ["optim_wraper", "optim_wrapper"]),
        ('model = dict(type="DropoutRegresor")', [], ["'DropoutRegresor'", "DropoutRegressor"]),
        ("", ["--nnodes", "2"], ["--rdzv-endpoint"]),
        ("", ["--resume", "--load-from", "x.pth"], ["--resume and --load-from"]),
        ("", ["--launcher", "none", "--nproc-per-node", "2"], ["--launcher none"]),
        (
            'optim_wrapper = dict(optimizer=dict(type="AdamW", lr=0.01), accumulative_counts=0)',
            [],
            ["optim_wrapper", "accumulative_counts", "got 0", ">= 1"],
        ),
        (
            'strategy = dict(type="FSDPStrategy", state_dict_cfg="bogus")',
            [],
            ["strategy", "state_dict_cfg='bogus'", "'sharded'"],
        ),
        (
            'strategy = dict(type="FSDPStrategy", model_wrapper=dict(sharding_strategy="FOO"))',
            [],
            ["strategy", "sharding_strategy='FOO'", "FULL_SHARD"],
        ),
        (
            'strategy = dict(type="FSDPStrategy", '
            'model_wrapper=dict(mixed_precision=dict(param_dtype="float12")))',
            [],
            ["param_dtype='float12'", "bfloat16"],
        ),
        (
            "param_scheduler = [dict(type='LinearLR', by_epoch=False, begin=5, end=2)]",
            [],
            ["param_scheduler[0]", "begin=5, end=2", "end after begin"],
        ),
        (
            'optim_wrapper = dict(optimizer=dict(type="AdamWW", lr=0.01))',
            [],
            ["optim_wrapper.optimizer.type", "AdamWW", "'AdamW'"],
        ),
        (
            "param_scheduler = [dict(type='LinearLRR', by_epoch=False, end=5)]",
            [],
            ["param_scheduler[0].type", "LinearLRR", "'LinearLR'"],
        ),
        (
            'optim_wrapper = dict(optimizer=dict(type="AdamW", lr="fast"))',
            [],
            ["optim_wrapper.optimizer.lr='fast'", "expected a number"],
        ),
        (
            'strategy = dict(type="FSDPStrategy", '
            'model_wrapper=dict(sharding_strategy="HYBRID_SHARD", replicate_size=3))',
            [],
            ["replicate_size=3", "but 2 ranks run", "divisor of 2"],
        ),
        (
            'strategy = dict(type="FSDPStrategy", state_dict_cgf="full")',
            [],
            ["no keyword 'state_dict_cgf'", "'state_dict_cfg'"],
        ),
        (
            'optim_wrapper = dict(type="AmpOptimWrapper", dtype="float12", '
            'optimizer=dict(type="AdamW", lr=0.01))',
            [],
            ["optim_wrapper", "'float12'", "bfloat16"],
        ),
        (
            "default_hooks = dict(checkpoint=dict(interval=4, max_keep_ckpts=0))",
            [],
            ["default_hooks.checkpoint", "max_keep_ckpts", "got 0"],
        ),
        ("", ["--preempt-signals", "SIGTERM,SIGKILL"], ["--preempt-signals", "'SIGKILL'"]),
        ("", ["--nnodes", "2:1"], ["--nnodes", "'2:1'"]),
    ],
    ids=[
        "no-model",
        "no-max-iters",
        "val-interval-without-val-data",
        "resume-missing-path",
        "typo-in-override-path",
        "typo-in-model-type",
        "multi-node-without-endpoint",
        "resume-and-load-from",
        "launcher-none-with-processes",
        "accumulative-counts-0",
        "unknown-state-dict-cfg",
        "unknown-sharding-strategy",
        "unknown-mixed-precision-dtype",
        "scheduler-ends-before-it-begins",
        "typo-in-optimizer-type",
        "typo-in-scheduler-type",
        "lr-not-a-number",
        "hybrid-replicas-do-not-divide-the-world",
        "typo-in-strategy-keyword",
        "unknown-amp-dtype",
        "max-keep-ckpts-0",
        "uncatchable-preempt-signal",
        "nnodes-min-above-max",
    ],
)
def test_bad_input_fails_before_any_process_starts_with_a_clear_message(
    tmp_path, config, capsys, edit, extra, words
):
    if edit:
        Path(config).write_text(TINY + "\n" + edit + "\n")
    args = ["train", config, "--work-dir", str(tmp_path / "never"), *extra]
    if "--nproc-per-node" not in extra:
        args += ["--nproc-per-node", "2"]  # refused before any process is launched
    before = tree_digest(tmp_path)
    assert main(args) == 2
    assert tree_digest(tmp_path) == before  # nothing written, nothing changed
    err = capsys.readouterr().err
    assert err.startswith("shardwise train: error:"), err
    assert err.count("\n") == 1, err  # one line, no traceback
    for word in words:
        assert word in err
    assert not (tmp_path / "never").exists()


def test_load_from_a_file_that_is_no_checkpoint_is_one_line_and_leaves_it(tmp_path, config, capsys):
    junk = tmp_path / "weights.pth"
    junk.write_bytes(os.urandom(4096))
    before = junk.read_bytes()
    code = main(["train", config, "--work-dir", str(tmp_path / "never"), "--load-from", str(junk)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "weights.pth is not a checkpoint" in err and "zip archive" in err
    assert junk.read_bytes() == before and not (tmp_path / "never").exists()


def test_a_model_whose_forward_returns_no_loss_stops_the_run_with_the_fix(tmp_path, config):
    Path(config).write_text(TINY + '\nmodel = dict(type="LosslessModel")\n')
    with pytest.raises(ValueError, match="none of which contains 'loss'.*train_step"):
        main(["train", config, "--work-dir", str(tmp_path / "w")])
    assert not list((tmp_path / "w").glob("*.pth"))


def test_requeue_and_preempt_signals_set_the_config_s_preemption(tmp_path, config):
    cfg = load_train_config(_parsed(config, "--requeue", "--preempt-signals", "term, SIGUSR1"))
    assert cfg.preemption == {"requeue": True, "signals": ["SIGTERM", "SIGUSR1"]}
    Path(config).write_text(TINY + "\npreemption = dict(signals=['SIGINT'])\n")
    merged = load_train_config(_parsed(config, "--requeue"))
    assert merged.preemption == {"signals": ["SIGINT"], "requeue": True}
    Path(config).write_text(TINY)
    assert load_train_config(_parsed(config)).get("preemption") is None
    args = _parsed(config, "--requeue", "--preempt-signals", "SIGTERM")
    argv = _worker_argv(args, str(tmp_path))  # the workers torchrun starts get them too
    assert argv[-3:] == ["--requeue", "--preempt-signals", "SIGTERM"]


def test_torchrun_forwards_sigusr1_and_the_run_s_preemption_signals():
    signals = forwarded_signals(["usr2", "SIGTERM"])
    assert signals == ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"]
    args = torchrun_args(LaunchOptions(nproc_per_node=2), ["train", "cfg.py"], signals)
    assert "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2" in args


def _failure(exitcode: int):
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    return ProcessFailure(local_rank=0, pid=1, exitcode=exitcode, error_file="/nonexistent")


@pytest.mark.parametrize(
    "raised, code",
    [
        ("preempted", 143),  # every failed worker committed a preemption checkpoint
        ("mixed", 1),
        ("signal", 128 + 10),  # the launcher itself got SIGUSR1 and forwarded it
    ],
)
def test_the_launcher_s_exit_code_says_how_the_workers_ended(monkeypatch, capsys, raised, code):
    import signal

    import torch.distributed.run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    def run(args):
        if raised == "signal":
            raise SignalException("got it", sigval=signal.SIGUSR1)
        codes = [143, 143] if raised == "preempted" else [143, 1]
        raise ChildFailedError("w", {i: _failure(c) for i, c in enumerate(codes)})

    monkeypatch.setattr(torchrun, "run", run)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert launch(LaunchOptions(nproc_per_node=2), ["train", "cfg.py"]) == code


def test_torchrun_command_line_carries_the_launch_options():
    options = LaunchOptions(
        nproc_per_node=4,
        nnodes="2",
        rdzv_backend="c10d",
        rdzv_endpoint="head:29400",
        rdzv_id="job7",
        max_restarts=2,
    )
    args = torchrun_args(options, ["train", "cfg.py"])
    assert args[:3] == ["--nproc-per-node=4", "--nnodes=2", "--max-restarts=2"]
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=head:29400", "--rdzv-id=job7"} <= set(args)
    assert args[-4:] == ["--module", "shardwise.cli", "train", "cfg.py"]


# ----------------------------------------------------------------------------- processes
def test_nproc_per_node_launches_the_processes_through_torchrun(tmp_path, config):
    work_dir = tmp_path / "work"
    proc = ok(train(config, work_dir, "--nproc-per-node", "2"))
    assert "DDPStrategy on 2 rank(s)" in proc.stdout
    assert sorted(records(work_dir)) == [2, 4, 6, 8, 10, 12]
    assert list(work_dir.glob("*/*_rank1.log"))  # every rank logged into its own file


def test_a_killed_worker_is_restarted_and_the_run_resumes_to_the_end(tmp_path, config):
    work_dir = tmp_path / "work"
    two = ("--nproc-per-node", "2")
    # rank 1 dies after iteration 7, on the first attempt only
    proc = ok(train(config, work_dir, *two, "--max-restarts", "1", env=dict(CRASH_AT="7")))
    assert "Restart 1: resuming from" in proc.stdout and "iter_4.pth" in proc.stdout
    logged: dict[int, list[float]] = {}  # every attempt's records, in order
    for log in sorted(work_dir.glob("*/metrics.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            logged.setdefault(record["iter"], []).append(record["loss"])
    assert sorted(logged) == [2, 4, 6, 8, 10, 12]  # every iteration ran
    assert len(logged[6]) == 2 and logged[6][0] == logged[6][1]  # redone exactly after resume
    assert (work_dir / "last_checkpoint").read_text().endswith("iter_12.pth")


@pytest.mark.slow
def test_an_interrupted_two_process_run_resumes_with_the_same_losses(tmp_path, config):
    two = ("--nproc-per-node", "2")
    ok(train(config, tmp_path / "whole", *two))
    stopped = train(config, tmp_path / "parts", *two, env=dict(STOP_AT="7"))
    assert stopped.returncode == 1
    ok(train(config, tmp_path / "parts", *two, "--resume"))
    assert losses(tmp_path / "parts") == losses(tmp_path / "whole")


@pytest.mark.slow
def test_train_runs_in_process_under_an_existing_torchrun(tmp_path, config):
    work_dir = tmp_path / "work"
    args = ("train", config, "--work-dir", str(work_dir))
    proc = run_torchrun("shardwise.cli", 2, *args, torchrun_args=["--module"])
    assert "DDPStrategy on 2 rank(s) (launcher pytorch" in proc.stdout
    assert sorted(records(work_dir)) == [2, 4, 6, 8, 10, 12]


# ----------------------------------------------------------------------------- plot
def test_plot_draws_the_logged_curves_of_a_resumed_run_into_a_png(tmp_path, config):
    work_dir = tmp_path / "work"
    assert train(config, work_dir, env=dict(STOP_AT="5")).returncode == 3  # interrupted ...
    ok(train(config, work_dir, "--resume"))  # ... and resumed: a log per run, one curve
    proc = ok(shardwise("plot", str(work_dir)))
    png = Path(proc.stdout.strip())
    assert png == work_dir / "metrics.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    curves = read_metrics(work_dir)["train"]
    assert [r["iter"] for r in curves] == [2, 4, 6, 8, 10, 12]


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    log = tmp_path / "20260101_000000" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text('{"mode": "train", "iter": 1, "epoch": 0, "loss": 1.0, "lr": 0.1}\n')
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "shardwise[plot]" in err


def test_plot_of_a_directory_without_logs_names_what_it_looked_for(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err
