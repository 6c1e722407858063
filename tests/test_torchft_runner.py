"""The Runner under fault tolerance, end to end through the command line: a lighthouse
started with ``shardwise ft lighthouse``, each replica group with ``shardwise train CONFIG
--replica-group g`` (one process, DDP, CPU gloo; no torchrun: the command gives the group its
own store; or, FT-HSDP, two processes under torchrun, FSDP over the group's ranks), the data
and model of tests/torchft_parts.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchft")

from tests.test_torchft import _assert_same_state, _free_port, _records, _wait  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
N, BATCH = 96, 4  # samples; batch per replica group (a step reads BATCH * groups samples)
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
_LAUNCH_VARS += ("MASTER_PORT", "TORCHFT_LIGHTHOUSE", "REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS")


def _config(
    tmp: Path,
    name: str,
    iters: int,
    ft: dict | None,
    sleep=0.0,
    hold=None,
    accumulate=1,
    parallelism: dict | None = None,
) -> Path:
    """The config of a run of ``iters`` iterations (< 0: of ``-iters`` epochs); DDP, or
    FSDP with ``parallelism``."""
    strategy = dict(type="DDPStrategy")
    if parallelism is not None:
        strategy = dict(type="FSDPStrategy", parallelism=parallelism)
    by_epoch = iters < 0
    loop = (
        f"by_epoch=True, max_epochs={-iters}" if by_epoch else f"by_epoch=False, max_iters={iters}"
    )
    every = "step_size=1" if by_epoch else "step_size=5"
    save = "interval=1" if by_epoch else "interval=10"
    if ft is not None:
        strategy["fault_tolerance"] = dict(timeout=10, quorum_timeout=60, connect_timeout=5, **ft)
    text = f"""
custom_imports = dict(imports=["tests.torchft_parts"])
model = dict(type="FTTinyNet")
train_dataloader = dict(dataset=dict(type="FTTinyRegression", n={N}), batch_size={BATCH},
                        sampler=dict(type="DefaultSampler", shuffle=True))
optim_wrapper = dict(optimizer=dict(type="AdamW", lr=0.01), accumulative_counts={accumulate})
param_scheduler = dict(type="StepLR", {every}, gamma=0.5, by_epoch={by_epoch})
train_cfg = dict({loop})
randomness = dict(seed=0)
default_hooks = dict(checkpoint=dict(type="CheckpointHook", {save}, by_epoch={by_epoch}),
                     logger=dict(type="LoggerHook", interval=5))
custom_hooks = [dict(type="FTRecordHook", out={str(tmp)!r}, name={name!r}, sleep={sleep},
                     hold={hold!r})]
strategy = {strategy!r}
"""
    path = tmp / f"{name}_cfg.py"
    path.write_text(text)
    return path


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'src'}")
    return env


def _shardwise(args: list[str], log: Path) -> subprocess.Popen:
    """``shardwise ARGS`` in a fresh process, its output in ``log`` (``.err``)."""
    out = open(log.with_suffix(".err"), "a")
    cmd = [sys.executable, "-m", "shardwise.cli", *args]
    return subprocess.Popen(cmd, env=_env(), stdout=out, stderr=out, cwd=ROOT)


def _lighthouse(tmp: Path, min_replicas: int) -> tuple[subprocess.Popen, str]:
    """``shardwise ft lighthouse`` on a free port of 127.0.0.1; the process and address."""
    log = tmp / "lighthouse.jsonl"
    args = ["ft", "lighthouse", "--bind", "127.0.0.1:0", "--min-replicas", str(min_replicas)]
    proc = _shardwise([*args, "--join-timeout-ms", "1000", "--heartbeat-timeout-ms", "2000"], log)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None:
        match = re.search(r"listening on http://[^:\s]+:(\d+)", log.with_suffix(".err").read_text())
        if match:
            return proc, f"http://127.0.0.1:{match[1]}"
        time.sleep(0.1)
    proc.kill()
    pytest.fail("the lighthouse did not start:\n" + log.with_suffix(".err").read_text())


def _stop(lighthouse: subprocess.Popen) -> None:
    lighthouse.send_signal(signal.SIGTERM)
    assert lighthouse.wait(timeout=30) == 0  # stops cleanly on SIGTERM


def _train_group(cfg: Path, tmp: Path, g: int, groups: int, nproc: int = 1) -> subprocess.Popen:
    """Replica group ``g``: one process, or ``nproc`` under torchrun (its own port)."""
    args = ["train", str(cfg), "--replica-group", str(g), "--num-replica-groups", str(groups)]
    if nproc > 1:
        args += ["--nproc-per-node", str(nproc), "--master-port", str(_free_port())]
    return _shardwise([*args, "--work-dir", str(tmp / f"wd{g}")], tmp / f"g{g}.jsonl")


def _release_when_ready(
    procs: list[subprocess.Popen], logs: list[Path], hold: Path, ranks: int = 1
) -> None:
    """Remove ``hold`` once every rank of every replica group waits on it (so that all start
    their first quorum together)."""
    deadline = time.time() + 240
    while not all(
        len({r["pid"] for r in _records(log) if r.get("ready")}) >= ranks for log in logs
    ):
        assert time.time() < deadline and all(p.poll() is None for p in procs), [
            log.with_suffix(".err").read_text()[-3000:] for log in logs
        ]
        time.sleep(0.1)
    hold.unlink()


def _plain_steps(tmp: Path, cfg: Path, nproc: list[str]) -> dict:
    """The reference: ``cfg`` trained without fault tolerance (``--nproc-per-node`` and what
    follows it: ``nproc``), its step records by (iteration, part)."""
    log = tmp / "plain.jsonl"
    plain = _shardwise(
        ["train", str(cfg), "--nproc-per-node", *nproc, "--work-dir", str(tmp / "wdp")], log
    )
    _wait([plain], time.time() + 300, "the plain run", [str(log)])
    assert plain.returncode == 0
    return {(r["iter"], r["part"]): r for r in _steps(log)}


def _steps(path: Path) -> list[dict]:
    return [r for r in _records(path) if "iter" in r and "loss" in r]


# ---------------------------------------------------------------------- fast checks
@pytest.mark.parametrize("n, drop_last", [(96, False), (50, False), (50, True)])
def test_a_step_reads_what_a_distributed_sampler_gives_each_rank(n, drop_last) -> None:
    """All groups live: part r of iteration i is what rank r of a plain run of as many ranks
    reads in its i-th batch (the oracle: torch's DistributedSampler and DataLoader, padding
    and drop_last included); fewer live parts split the same samples, disjointly."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from shardwise.runner.ft_loop import QuorumBatchSampler

    world, batch = 3, 4
    data = TensorDataset(torch.arange(n))
    ours = QuorumBatchSampler(n, batch, world, shuffle=True, seed=5, drop_last=drop_last)
    for rank in range(world):
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=5)
        loader = DataLoader(data, batch_size=batch, sampler=sampler, drop_last=drop_last)
        assert ours.epoch_length == len(loader)
        for epoch in range(2):
            sampler.set_epoch(epoch)
            for b, (x,) in enumerate(loader):
                assert ours.indices(epoch * len(loader) + b, rank, world) == x.tolist()
    for i in range(2 * ours.epoch_length):
        whole = sorted(x for r in range(world) for x in ours.indices(i, r, world))
        for live in (1, 2):
            assert sorted(x for r in range(live) for x in ours.indices(i, r, live)) == whole


def _cfg_file(tmp: Path, ft: bool) -> Path:
    path = tmp / "cfg.py"
    strategy = "dict(type='DDPStrategy'"
    if ft:
        strategy += ", fault_tolerance=dict(num_replica_groups=3, lighthouse='http://h:1')"
    path.write_text(
        f"model = dict(type='Linear', in_features=2, out_features=1)\nstrategy = {strategy})\n"
    )
    return path


def test_replica_group_flags_and_torchft_variables_set_fault_tolerance(tmp_path, monkeypatch):
    from shardwise.cli import build_parser
    from shardwise.runner.commands import _read_train_config

    cfg_path = _cfg_file(tmp_path, ft=True)
    for var in ("REPLICA_GROUP_ID", "NUM_REPLICA_GROUPS"):
        monkeypatch.delenv(var, raising=False)
    args = build_parser().parse_args(["train", str(cfg_path), "--replica-group", "2"])
    ft = _read_train_config(args).strategy.fault_tolerance
    assert ft.replica_group == 2 and ft.num_replica_groups == 3
    monkeypatch.setenv("REPLICA_GROUP_ID", "1")
    monkeypatch.setenv("NUM_REPLICA_GROUPS", "4")
    args = build_parser().parse_args(["train", str(cfg_path)])
    ft = _read_train_config(args).strategy.fault_tolerance
    assert (ft.replica_group, ft.num_replica_groups) == (1, 4)
    args = build_parser().parse_args(["train", str(cfg_path), "--replica-group", "0"])
    assert _read_train_config(args).strategy.fault_tolerance.replica_group == 0  # flag first
    monkeypatch.setenv("REPLICA_GROUP_ID", "one")
    with pytest.raises(ValueError, match="REPLICA_GROUP_ID='one' is not an int"):
        _read_train_config(build_parser().parse_args(["train", str(cfg_path)]))


def test_replica_group_flag_without_fault_tolerance_is_refused(tmp_path, capsys) -> None:
    from shardwise.cli import main

    cfg_path = _cfg_file(tmp_path, ft=False)
    assert main(["train", str(cfg_path), "--replica-group", "0"]) == 2
    err = capsys.readouterr().err
    assert "--replica-group set fault_tolerance keys, but the config's strategy has no " in err


def test_lighthouse_refuses_min_replicas_below_one(capsys) -> None:
    from shardwise.cli import main

    assert main(["ft", "lighthouse", "--min-replicas", "0"]) == 2
    assert "--min-replicas 0 must be >= 1" in capsys.readouterr().err


# ---------------------------------------------------------------------- end to end
@pytest.mark.slow
@pytest.mark.parametrize("by_epoch", [False, True])
def test_runner_without_failures_equals_a_plain_ddp_run(tmp_path, by_epoch) -> None:
    """Two replica groups under the Runner read, step for step, the samples a plain DDP run of
    two ranks reads, and give its losses and learning rates (iteration- or epoch-based loop,
    schedulers and checkpoints); their weights end bit-identical."""
    groups = 2
    iters = 2 * N // (BATCH * groups) if by_epoch else 16
    length = -2 if by_epoch else iters  # _config's epochs
    hold = tmp_path / "hold"
    hold.touch()  # both groups start their first quorum together
    lighthouse, address = _lighthouse(tmp_path, min_replicas=1)
    try:
        ft = dict(num_replica_groups=groups, min_replicas=1, lighthouse=address)
        procs = [
            _train_group(_config(tmp_path, f"g{g}", length, ft, hold=str(hold)), tmp_path, g, 2)
            for g in range(groups)
        ]
        logs = [tmp_path / f"g{g}.jsonl" for g in range(groups)]
        _release_when_ready(procs, logs, hold)
        _wait(procs, time.time() + 300, "the FT run", [str(log) for log in logs])
        assert [p.returncode for p in procs] == [0] * groups
        _stop(lighthouse)
    finally:
        lighthouse.kill()
    plain_steps = _plain_steps(tmp_path, _config(tmp_path, "plain", length, None), ["2"])
    ft_steps = {(r["iter"], r["part"]): r for log in logs for r in _steps(log)}
    assert len(plain_steps) == iters * 2 and sorted(ft_steps) == sorted(plain_steps)
    for key, rec in plain_steps.items():
        assert ft_steps[key]["parts"] == 2
        assert ft_steps[key]["idx"] == rec["idx"], key  # the same samples, rank for rank
        assert ft_steps[key]["lr"] == rec["lr"]
    for i in range(iters):  # the plain run logs the mean over its ranks
        mean = (ft_steps[(i, 0)]["loss"] + ft_steps[(i, 1)]["loss"]) / 2
        assert abs(mean - plain_steps[(i, 0)]["loss"]) <= 1e-6, (i, mean, plain_steps[(i, 0)])
    states = [torch.load(tmp_path / f"g{g}.pt", weights_only=True) for g in range(groups)]
    _assert_same_state(states[0], states[1])
    reference = torch.load(tmp_path / "plain.pt", weights_only=True)
    for key, value in reference["model"].items():
        torch.testing.assert_close(states[0]["model"][key], value)
    # one replica group writes the periodic checkpoints: rank 0 of the quorum
    saved = ["epoch_1.pth", "epoch_2.pth"] if by_epoch else ["iter_10.pth", "iter_16.pth"]
    assert sorted(p.name for p in (tmp_path / "wd0").glob("*.pth")) == saved
    assert not list((tmp_path / "wd1").glob("*.pth"))


@pytest.mark.slow
def test_runner_ft_hsdp_without_failures_equals_a_plain_hsdp_run(tmp_path) -> None:
    """FT-HSDP: two replica groups of two ranks, each FSDP over its own ranks, under the
    Runner read, rank for rank, the samples a plain HSDP run of four ranks (dp_replicate=2 x
    dp_shard=2) reads, and give its losses and learning rates; their weights end
    bit-identical, equal to the plain run's."""
    groups, dp, iters = 2, 2, 10
    ranks = groups * dp
    hold = tmp_path / "hold"
    hold.touch()  # both groups start their first quorum together
    lighthouse, address = _lighthouse(tmp_path, min_replicas=1)
    try:
        ft = dict(num_replica_groups=groups, min_replicas=1, lighthouse=address)
        shard = dict(dp_shard=dp)
        cfgs = [
            _config(tmp_path, f"g{g}", iters, ft, hold=str(hold), parallelism=shard)
            for g in range(groups)
        ]
        procs = [_train_group(cfgs[g], tmp_path, g, groups, nproc=dp) for g in range(groups)]
        logs = [tmp_path / f"g{g}.jsonl" for g in range(groups)]
        _release_when_ready(procs, logs, hold, ranks=dp)
        _wait(procs, time.time() + 300, "the FT run", [str(log) for log in logs])
        assert [p.returncode for p in procs] == [0] * groups
        _stop(lighthouse)
    finally:
        lighthouse.kill()
    if "RUST_LOG" not in os.environ:  # else torchft's manager: six info lines a step
        for log in logs:
            assert "Finished quorum" not in log.with_suffix(".err").read_text()
    hsdp = dict(dp_replicate=groups, dp_shard=dp)
    cfg = _config(tmp_path, "plain", iters, None, parallelism=hsdp)
    plain_steps = _plain_steps(tmp_path, cfg, [str(ranks), "--master-port", str(_free_port())])
    ft_steps = {(r["iter"], r["part"]): r for log in logs for r in _steps(log)}
    assert len(plain_steps) == iters * ranks and sorted(ft_steps) == sorted(plain_steps)
    for key, rec in plain_steps.items():
        assert ft_steps[key]["parts"] == ranks
        assert ft_steps[key]["idx"] == rec["idx"], key  # the same samples, rank for rank
        assert ft_steps[key]["lr"] == rec["lr"]
    for i in range(iters):
        # each rank logs the mean over its process group's ranks: the plain run's four, a
        # replica group's two; the mean over every rank's record compares like with like
        mean = sum(ft_steps[(i, p)]["loss"] for p in range(ranks)) / ranks
        plain_mean = sum(plain_steps[(i, p)]["loss"] for p in range(ranks)) / ranks
        assert abs(mean - plain_mean) <= 1e-6, (i, mean, plain_mean)
    # each rank's shard: rank r of each group and of the plain run's first replica
    for r in range(dp):
        name = f"{r or ''}.pt"
        states = [torch.load(tmp_path / f"g{g}{name}", weights_only=True) for g in range(groups)]
        _assert_same_state(states[0], states[1])
        reference = torch.load(tmp_path / f"plain{name}", weights_only=True)
        assert reference["model"] and sorted(states[0]["model"]) == sorted(reference["model"])
        for key, value in reference["model"].items():
            torch.testing.assert_close(states[0]["model"][key], value)
    # one replica group writes the periodic checkpoint: rank 0 of the quorum
    assert sorted(p.name for p in (tmp_path / "wd0").glob("*.pth")) == ["iter_10.pth"]
    assert not list((tmp_path / "wd1").glob("*.pth"))


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_runner_kill_one_replica_group_survivor_goes_on_and_the_restart_heals(
    tmp_path, accumulate
) -> None:
    """kill -9 one of two replica groups mid-run: the other finishes every iteration in the
    same process without reading a checkpoint, reading the whole of each step's data itself;
    the killed group, restarted, heals from it and both end with bit-identical weights. With
    gradient accumulation a step is a window of iterations, redone whole when it does not
    commit (its first iterations then appear twice in the record)."""
    iters, groups, victim, k = 40, 2, 1, accumulate
    hold = tmp_path / "hold"
    hold.touch()
    lighthouse, address = _lighthouse(tmp_path, min_replicas=1)
    try:
        ft = dict(num_replica_groups=groups, min_replicas=1, lighthouse=address)
        cfgs = [
            _config(tmp_path, f"g{g}", iters, ft, sleep=0.1, hold=str(hold), accumulate=k)
            for g in range(groups)
        ]
        procs = [_train_group(cfgs[g], tmp_path, g, groups) for g in range(groups)]
        logs = [tmp_path / f"g{g}.jsonl" for g in range(groups)]

        def ready(g: int) -> bool:
            return any(r.get("ready") and r["pid"] == procs[g].pid for r in _records(logs[g]))

        def alive() -> str:
            return "\n".join(log.with_suffix(".err").read_text()[-3000:] for log in logs)

        deadline = time.time() + 400
        while not all(ready(g) for g in range(groups)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), alive()
            time.sleep(0.1)
        hold.unlink()
        while len(_steps(logs[victim])) < 8:
            assert time.time() < deadline and all(p.poll() is None for p in procs), alive()
            time.sleep(0.1)
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait()
        killed_at = max(r["iter"] for r in _steps(logs[victim]))

        # the survivor goes on alone, the same process, reading the whole step
        while not any(r["parts"] == 1 and r["iter"] >= killed_at + 3 for r in _steps(logs[0])):
            assert time.time() < deadline and procs[0].poll() is None, alive()
            time.sleep(0.1)
        hold.touch()  # the survivor waits while the killed group restarts (a slow start)
        procs[victim] = _train_group(cfgs[victim], tmp_path, victim, groups)
        while not ready(victim):
            assert time.time() < deadline and procs[victim].poll() is None, alive()
            time.sleep(0.1)
        resumed_at = max(r["iter"] for r in _steps(logs[0]))
        hold.unlink()
        _wait(procs, time.time() + 300, "the run", [str(log) for log in logs])
        assert [p.returncode for p in procs] == [0] * groups
        _stop(lighthouse)
    finally:
        lighthouse.kill()

    done = [_records(log)[-1] for log in logs]
    assert all(d.get("done") for d in done) and [d["iter"] for d in done] == [iters] * groups
    survivor = _steps(logs[0])
    assert {r["pid"] for r in survivor} == {procs[0].pid}  # never restarted
    seen = [r["iter"] for r in survivor]  # every iteration, in order; once when k == 1
    assert seen == sorted(seen) and sorted(set(seen)) == list(range(iters))
    assert len(seen) - iters <= (k - 1) * done[0]["failed_commits"]
    assert all(s < killed_at for s in done[0]["heal_steps"])  # no heal after the kill
    assert done[0]["failed_commits"] <= 2  # at most the step in progress, redone
    assert {r["parts"] for r in survivor} == {1, 2}
    assert "Continuing at" not in (tmp_path / "g0.err").read_text()  # no checkpoint read
    # the restarted group healed from the survivor past the kill, then trained in lockstep
    heal_steps = done[victim]["heal_steps"]
    assert heal_steps and heal_steps[-1] * k >= resumed_at, (heal_steps, resumed_at)
    rejoined = [r for r in _steps(logs[victim]) if r["pid"] == done[victim]["pid"]]
    assert rejoined[0]["iter"] == heal_steps[-1] * k and rejoined[-1]["iter"] == iters - 1
    assert "Continuing at" not in (tmp_path / "g1.err").read_text()
    states = [torch.load(tmp_path / f"g{g}.pt", weights_only=True) for g in range(groups)]
    _assert_same_state(states[0], states[1])
    assert states[0]["schedulers"][0]["_global_step"] == iters

    # Nothing skipped or repeated: each iteration's 8 samples were read by the groups of its
    # quorum in its committed run (the step a group died in excepted: its part was read,
    # never logged), and each whole epoch (12 iterations) read every sample once.
    last = {(g, r["iter"]): r for g in range(groups) for r in _steps(logs[g])}
    by_iter: dict[int, list[dict]] = {}
    for i in range(iters):
        by_iter[i] = [last[(0, i)]]
        if last[(0, i)]["parts"] == 2 and (victim, i) in last:
            by_iter[i].append(last[(victim, i)])
    partial = []
    for i, recs in sorted(by_iter.items()):
        parts = {r["parts"] for r in recs}
        assert len(parts) == 1
        if len(recs) < parts.pop():
            partial.append(i)
            continue
        assert sorted(x for r in recs for x in r["idx"]) == sorted(
            set().union(*[r["idx"] for r in recs])
        )
        assert sum(len(r["idx"]) for r in recs) == BATCH * groups
    assert len(partial) <= k and all(abs(i - killed_at) <= k for i in partial), partial
    epoch_length = N // (BATCH * groups)
    for epoch in range(iters // epoch_length):
        if any(epoch * epoch_length <= i < (epoch + 1) * epoch_length for i in partial):
            continue
        read = Counter(
            x
            for i in range(epoch * epoch_length, (epoch + 1) * epoch_length)
            for r in by_iter[i]
            for x in r["idx"]
        )
        assert sorted(read) == list(range(N)) and set(read.values()) == {1}, epoch
    # the periodic checkpoints, the fallback when every group dies: written by one group
    assert list((tmp_path / "wd0").glob("iter_*.pth"))
    assert not list((tmp_path / "wd1").glob("iter_*.pth"))


def _run_together(
    tmp: Path, cfgs: list[Path], hold: Path, extra: list[str] = (), until: Path | None = None
) -> None:
    """Start a replica group per config (held until all are up) and wait for them to end, or,
    with ``until``, kill -9 every group as soon as that file exists."""
    hold.touch()
    procs = []
    for g, cfg in enumerate(cfgs):
        args = ["train", str(cfg), "--replica-group", str(g), "--work-dir", str(tmp / f"wd{g}")]
        procs.append(_shardwise([*args, *extra], tmp / f"g{g}.jsonl"))
    logs = [tmp / f"g{g}.jsonl" for g in range(len(cfgs))]

    def failed() -> list[str]:
        return [log.with_suffix(".err").read_text()[-3000:] for log in logs]

    deadline = time.time() + 240
    while not all(
        any(r.get("ready") and r["pid"] == p.pid for r in _records(log))
        for p, log in zip(procs, logs, strict=True)
    ):
        assert time.time() < deadline and all(p.poll() is None for p in procs), failed()
        time.sleep(0.1)
    hold.unlink()
    if until is not None:
        while not until.exists():
            assert time.time() < deadline and all(p.poll() is None for p in procs), failed()
            time.sleep(0.05)
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        return
    _wait(procs, time.time() + 300, "the replica groups", [str(log) for log in logs])
    assert [p.returncode for p in procs] == [0] * len(cfgs)


@pytest.mark.slow
def test_every_group_lost_the_run_resumes_from_the_periodic_checkpoint(tmp_path) -> None:
    """The fallback when every replica group dies (kill -9 both once iter_20 is committed):
    restarted with --resume, the group that wrote the newest checkpoint resumes from it, the
    other (none in its work_dir) heals from it, and the iterations from 20 on give the
    losses of a run that never stopped."""
    groups, iters = 2, 30
    lighthouse, address = _lighthouse(tmp_path, min_replicas=1)
    try:
        ft = dict(num_replica_groups=groups, min_replicas=1, lighthouse=address)
        straight, stopped = tmp_path / "straight", tmp_path / "stopped"
        straight.mkdir()
        hold = straight / "hold"
        cfgs = [_config(straight, f"g{g}", iters, ft, hold=str(hold)) for g in range(groups)]
        _run_together(straight, cfgs, hold)
        stopped.mkdir()
        hold = stopped / "hold"
        cfgs = [
            _config(stopped, f"g{g}", iters, ft, sleep=0.1, hold=str(hold)) for g in range(groups)
        ]
        _run_together(stopped, cfgs, hold, until=stopped / "wd0" / "iter_20.pth")
        assert not (stopped / "wd0" / "iter_30.pth").exists()
        first = [{r["pid"] for r in _steps(stopped / f"g{g}.jsonl")} for g in range(groups)]
        _run_together(stopped, cfgs, hold, ["--resume"])
        _stop(lighthouse)
    finally:
        lighthouse.kill()
    assert "Resumed from " + str(stopped / "wd0" / "iter_20.pth") in (
        (stopped / "g0.err").read_text()
    )
    assert "no committed checkpoint: starting from scratch" in (stopped / "g1.err").read_text()
    assert _records(stopped / "g1.jsonl")[-1]["heal_steps"] == [20]
    for g in range(groups):
        again = [r for r in _steps(stopped / f"g{g}.jsonl") if r["pid"] not in first[g]]
        want = _steps(straight / f"g{g}.jsonl")[20:]
        assert [r["iter"] for r in again] == list(range(20, iters))
        for r, w in zip(again, want, strict=True):
            assert r["idx"] == w["idx"] and abs(r["loss"] - w["loss"]) <= 1e-6, (r, w)
    states = [torch.load(stopped / f"g{g}.pt", weights_only=True) for g in range(groups)]
    _assert_same_state(states[0], states[1])
    reference = torch.load(straight / "g0.pt", weights_only=True)
    for key, value in reference["model"].items():
        torch.testing.assert_close(states[0]["model"][key], value)
