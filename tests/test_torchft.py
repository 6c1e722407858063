"""Replica-level fault tolerance on torchft (strategies/fault_tolerance.py).

Each replica group is a real process (its own default process group and TCPStore, as torchrun
makes); the lighthouse is torchft's LighthouseServer in the test process, bound to 127.0.0.1.
Run as a script, this file is one replica group's (or one plain DDP rank's) training loop.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("torchft")

from shardwise.strategies import DDPStrategy, FSDPStrategy  # noqa: E402
from shardwise.strategies.fault_tolerance import check_fault_tolerance  # noqa: E402

BATCH = 12  # global batch per step, split among the live replicas
HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]


# ---------------------------------------------------------------------- the worker
def _data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 8, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def _worker(args: dict) -> None:
    """One replica group (``ft``) or one plain DDP rank (``plain``): train ``steps`` steps,
    one JSON line per step in ``log``, the final state in ``out``."""
    torch.set_num_threads(1)
    log = open(args["log"], "a", buffering=1)
    ft_cfg = args.get("ft")
    common = dict(
        work_dir=args["work_dir"],
        env_kwargs=dict(randomness=dict(seed=0)),
        log_kwargs=dict(log_level="WARNING"),
    )
    if "parallelism" in args:  # FSDP (FT-HSDP, or plain HSDP)
        strategy = FSDPStrategy(parallelism=args["parallelism"], fault_tolerance=ft_cfg, **common)
    else:
        strategy = DDPStrategy(fault_tolerance=ft_cfg, **common)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model, optim_wrapper, schedulers = strategy.prepare(
        model,
        optim_wrapper=dict(optimizer=dict(type="AdamW", lr=0.01)),
        param_scheduler=dict(type="StepLR", step_size=5, gamma=0.5, by_epoch=False),
        dispatch_kwargs=dict(max_iters=args["steps"]),
    )
    ft = strategy.fault_tolerance
    steps = args["steps"]

    def run_step(step: int, part: list[int], parts: int) -> dict:
        x, y = _data(step)
        loss = torch.nn.functional.mse_loss(model(x[part]), y[part])
        time.sleep(args.get("sleep", 0.0))  # a kill lands mid-step: the peers wait in the reduce
        optim_wrapper.update_params(loss)
        rec = dict(step=step, loss=loss.item(), parts=parts, part=part[0], pid=os.getpid())
        rec["time"] = time.time()
        return rec

    if ft is None:
        rank, world = strategy.rank, strategy.world_size
        for step in range(steps):
            rec = run_step(step, list(range(rank, BATCH, world)), world)
            for s in schedulers:
                s.step()
            log.write(json.dumps(dict(rec, committed=True)) + "\n")
    else:
        hold = Path(args["hold"]) if "hold" in args else None
        log.write(json.dumps(dict(ready=True, pid=os.getpid())) + "\n")
        while hold is not None and hold.exists():  # the harness holds the run here
            time.sleep(0.05)
        while (step := ft.start_step()) < steps:
            rec = run_step(step, ft.shard(BATCH), ft.num_replicas)
            committed = ft.current_step() > step
            if committed:
                for s in schedulers:
                    s.step()
            log.write(json.dumps(dict(rec, committed=committed)) + "\n")
            while hold is not None and hold.exists():
                time.sleep(0.05)
    if "parallelism" in args:  # each rank's own shards (plain tensors)
        local = strategy.checkpointer.local_state_dict()
        state = dict(
            model=local["state_dict"],
            optimizer=local["optimizer"],
            schedulers=local["param_schedulers"],
        )
    else:
        state = dict(
            model={k: v.clone() for k, v in strategy.model_state_dict().items()},
            optimizer=strategy.optim_state_dict(),
            schedulers=strategy.scheduler_state_dict(),
        )
    torch.save(state, args["out"])
    done = dict(done=True, pid=os.getpid())
    if ft is not None:
        done.update(heal_steps=ft.heal_steps, failed_commits=ft.failed_commits)
        ft.shutdown(wait_for_group=True)
    log.write(json.dumps(done) + "\n")
    log.close()
    os._exit(0)  # torchft's servers hold threads; the state is written


# ---------------------------------------------------------------------- the harness
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lighthouse(min_replicas: int):
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(
        bind="127.0.0.1:0",
        min_replicas=min_replicas,
        join_timeout_ms=1000,
        heartbeat_timeout_ms=2000,
    )
    port = server.address().rsplit(":", 1)[1]
    return server, f"http://127.0.0.1:{port}"


def _spawn(args: dict, *, rank: int = 0, world: int = 1, port: int | None = None):
    env = dict(
        os.environ,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port or _free_port()),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(ROOT / "src"),
    )
    env.pop("TORCHFT_LIGHTHOUSE", None)
    err = open(Path(args["log"]).with_suffix(".err"), "a")
    return subprocess.Popen(
        [sys.executable, str(HERE), json.dumps(args)], env=env, stdout=err, stderr=err
    )


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _wait(procs, deadline: float, what: str, paths=()) -> None:
    for p in procs:
        left = max(1.0, deadline - time.time())
        try:
            p.wait(timeout=left)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            errs = "\n".join(Path(x).with_suffix(".err").read_text()[-2000:] for x in paths)
            pytest.fail(f"{what} did not finish in time\n{errs}")


def _ft_args(
    tmp: Path, group: int, groups: int, lighthouse: str, steps: int, rank: int = 0, **extra
) -> dict:
    ft = dict(
        replica_group=group,
        num_replica_groups=groups,
        min_replicas=extra.pop("min_replicas", 1),
        lighthouse=lighthouse,
        timeout=10,
        quorum_timeout=extra.pop("quorum_timeout", 60),
        connect_timeout=5,
    )
    ft.update(extra.pop("ft", {}))
    return dict(
        ft=ft,
        steps=steps,
        work_dir=str(tmp / f"g{group}"),
        log=str(tmp / (f"g{group}.jsonl" if rank == 0 else f"g{group}r{rank}.jsonl")),
        out=str(tmp / (f"g{group}.pt" if rank == 0 else f"g{group}r{rank}.pt")),
        **extra,
    )


def _assert_same_state(a: dict, b: dict) -> None:
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    flat_a = torch.utils._pytree.tree_leaves(a["optimizer"])
    flat_b = torch.utils._pytree.tree_leaves(b["optimizer"])
    assert len(flat_a) == len(flat_b)
    for x, y in zip(flat_a, flat_b, strict=True):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y)
        else:
            assert x == y
    assert a["schedulers"] == b["schedulers"]


# ---------------------------------------------------------------------- config checks
@pytest.mark.parametrize(
    "cfg, match",
    [
        (dict(num_replica_groups=2, lighthouse="http://h:1"), "needs replica_group"),
        (dict(replica_group=2, num_replica_groups=2, lighthouse="http://h:1"), "out of range"),
        (
            dict(replica_group=0, num_replica_groups=2, min_replicas=3, lighthouse="http://h:1"),
            "min_replicas=3 is above num_replica_groups=2",
        ),
        (dict(replica_group=0, num_replica_groups=2), "needs a lighthouse"),
        (dict(replica_group=0, num_replica_groups=2, lighthouse="h:1"), "not an address"),
        (
            dict(replica_group=0, num_replica_groups=2, lighthouse="http://h:1", timeout=0),
            "timeout=0",
        ),
    ],
)
def test_bad_config_is_refused_before_anything_runs(cfg, match) -> None:
    with pytest.raises(ValueError, match=match):
        check_fault_tolerance(cfg, env={})
    with pytest.raises(ValueError, match=match):
        DDPStrategy.check_config(dict(type="DDPStrategy", fault_tolerance=cfg))


def test_unknown_key_and_lighthouse_from_env() -> None:
    with pytest.raises(KeyError, match="replicas"):
        check_fault_tolerance(dict(replica_group=0, num_replica_groups=1, replicas=2), env={})
    cfg = check_fault_tolerance(
        dict(replica_group=0, num_replica_groups=1), env={"TORCHFT_LIGHTHOUSE": "http://h:29510"}
    )
    assert cfg["lighthouse"] == "http://h:29510" and cfg["min_replicas"] == 1


def test_unreachable_lighthouse_fails_in_one_line_within_connect_timeout(tmp_path) -> None:
    args = _ft_args(tmp_path, 0, 1, f"http://127.0.0.1:{_free_port()}", steps=2)
    start = time.time()
    proc = _spawn(args)
    _wait([proc], time.time() + 90, "the worker", [args["log"]])
    err = Path(args["log"]).with_suffix(".err").read_text()
    assert proc.returncode != 0
    assert "could not reach the lighthouse" in err and "connect_timeout=5.0s" in err, err[-2000:]
    assert time.time() - start < 60


def test_unreachable_lighthouse_fails_on_every_rank_of_an_ft_hsdp_group(tmp_path) -> None:
    """Rank 0 of the group runs the manager server that reaches the lighthouse; rank 1, which
    waits for it, fails too, in one line naming the lighthouse and the timeout."""
    address = f"http://127.0.0.1:{_free_port()}"
    shard = dict(dp_shard=2)
    args = [_ft_args(tmp_path, 0, 2, address, 2, rank=r, parallelism=shard) for r in range(2)]
    port, start = _free_port(), time.time()
    procs = [_spawn(a, rank=r, world=2, port=port) for r, a in enumerate(args)]
    _wait(procs, time.time() + 120, "the workers", [a["log"] for a in args])
    for a, p in zip(args, procs, strict=True):
        err = Path(a["log"]).with_suffix(".err").read_text()
        assert p.returncode != 0
        assert f"could not reach the lighthouse {address} within connect_timeout=5.0s" in err, err
    assert time.time() - start < 90


def test_a_replica_group_of_two_ranks_is_refused_on_both(tmp_path) -> None:
    args = [_ft_args(tmp_path, 0, 2, "http://127.0.0.1:1", steps=2, rank=r) for r in range(2)]
    port = _free_port()
    procs = [_spawn(a, rank=r, world=2, port=port) for r, a in enumerate(args)]
    _wait(procs, time.time() + 120, "the workers", [a["log"] for a in args])
    for a, p in zip(args, procs, strict=True):
        err = Path(a["log"]).with_suffix(".err").read_text()
        assert p.returncode != 0
        assert "fault_tolerance runs one process per replica group, got a replica group of 2" in (
            err
        ), err[-2000:]


def test_no_quorum_fails_in_one_line_naming_quorum_timeout(tmp_path) -> None:
    server, address = _lighthouse(min_replicas=2)  # the other group never comes
    try:
        args = _ft_args(tmp_path, 0, 2, address, steps=2, quorum_timeout=3)
        start = time.time()
        proc = _spawn(args)
        _wait([proc], time.time() + 120, "the worker", [args["log"]])
        err = Path(args["log"]).with_suffix(".err").read_text()
        assert proc.returncode != 0
        assert "replica group 0: no quorum within quorum_timeout=3.0s" in err, err[-2000:]
        assert time.time() - start < 90
    finally:
        server.shutdown()


def test_replica_counts_that_disagree_fail_on_every_group(tmp_path) -> None:
    server, address = _lighthouse(min_replicas=2)
    try:
        a = _ft_args(tmp_path, 0, 2, address, steps=3)
        b = _ft_args(tmp_path, 1, 3, address, steps=3)
        procs = [_spawn(a), _spawn(b)]
        _wait(procs, time.time() + 120, "the workers", [a["log"], b["log"]])
        for args, p in zip((a, b), procs, strict=True):
            err = Path(args["log"]).with_suffix(".err").read_text()
            assert p.returncode != 0
            assert "start every replica group with the same fault_tolerance" in err, err[-2000:]
    finally:
        server.shutdown()


def _vote_rank(votes: list[bool], steps: list[int]) -> list:
    """Each rank of a 2-rank gloo group votes ``votes[rank]`` on ``steps[rank]``: what the
    group's commit vote (``_QuorumRecorder.should_commit`` over the process group) answers."""
    from datetime import timedelta

    import torch.distributed as tdist

    from shardwise.strategies.fault_tolerance import _QuorumRecorder

    rank = tdist.get_rank()
    recorder = _QuorumRecorder(client=None, vote_device=torch.device("cpu"))
    try:
        return [recorder.should_commit(rank, steps[rank], votes[rank], timedelta(seconds=20))]
    except RuntimeError as e:
        return [str(e)]


def test_commit_vote_over_the_group_agrees_on_every_rank() -> None:
    """One rank voting no stops both; ranks on different steps are refused on both."""
    from tests.distributed import run_distributed  # this file is also the workers' script

    for votes, want in (([True, True], True), ([True, False], False), ([False, True], False)):
        out = run_distributed(_vote_rank, 2, votes, [3, 3], init_pg=True)
        assert out == [[want], [want]], (votes, out)
    out = run_distributed(_vote_rank, 2, [True, True], [3, 4], init_pg=True)
    assert all("vote on different steps [3, 4]" in o[0] for o in out), out


def test_replica_groups_average_over_nccl_on_a_gpu_and_gloo_on_the_cpu() -> None:
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    from shardwise.strategies.fault_tolerance import replica_process_group

    assert replica_process_group("cpu") is ProcessGroupGloo
    assert replica_process_group(torch.device("cuda", 1)) is ProcessGroupNCCL


# ---------------------------------------------------------------------- training
@pytest.mark.slow
def test_without_failures_losses_equal_plain_ddp(tmp_path) -> None:
    """The same steps, data split and replica count: FT-DDP (torchft's quorum, in-group then
    cross-group averaging) gives plain DDP's losses on every rank."""
    steps, groups, group_size = 12, 3, 1
    world = groups * group_size
    server, address = _lighthouse(min_replicas=groups)
    try:
        (tmp_path / "ft").mkdir()
        ft_args, procs = [], []
        for g in range(groups):
            port = _free_port()
            for r in range(group_size):
                a = _ft_args(tmp_path / "ft", g, groups, address, steps, rank=r)
                ft_args.append(a)
                procs.append(_spawn(a, rank=r, world=group_size, port=port))
        _wait(procs, time.time() + 300, "the FT run", [a["log"] for a in ft_args])
        assert [p.returncode for p in procs] == [0] * world
    finally:
        server.shutdown()
    (tmp_path / "plain").mkdir()
    port = _free_port()
    plain = [
        dict(
            steps=steps,
            work_dir=str(tmp_path / "plain" / f"r{r}"),
            log=str(tmp_path / "plain" / f"r{r}.jsonl"),
            out=str(tmp_path / "plain" / f"r{r}.pt"),
        )
        for r in range(world)
    ]
    procs = [_spawn(a, rank=r, world=world, port=port) for r, a in enumerate(plain)]
    _wait(procs, time.time() + 240, "the plain DDP run", [a["log"] for a in plain])
    assert [p.returncode for p in procs] == [0] * world

    def losses(args_list):
        out = {}
        for a in args_list:
            for rec in _records(Path(a["log"])):
                if "step" in rec:
                    assert rec["committed"] and rec["parts"] in (groups, world)
                    out[(rec["step"], rec["part"])] = rec["loss"]
        return out

    ft_losses, plain_losses = losses(ft_args), losses(plain)
    assert len(plain_losses) == steps * world
    assert sorted(ft_losses) == sorted(plain_losses)
    for key, value in plain_losses.items():
        assert abs(ft_losses[key] - value) <= 1e-6, (key, ft_losses[key], value)
    # a full state dict is on rank 0 only: every replica group's, the plain run's rank 0
    firsts = [a for a in ft_args if "r" not in Path(a["out"]).stem]
    states = [torch.load(a["out"], weights_only=True) for a in [*firsts, plain[0]]]
    for state in states[1:-1]:
        _assert_same_state(states[0], state)  # the replicas: bit-identical
    for key in states[0]["model"]:
        torch.testing.assert_close(states[-1]["model"][key], states[0]["model"][key])


@pytest.mark.slow
def test_kill_one_replica_group_survivors_go_on_and_it_heals_from_a_peer(tmp_path) -> None:
    steps, groups, victim = 40, 3, 2
    hold = tmp_path / "hold"
    server, address = _lighthouse(min_replicas=2)
    try:
        args = [
            _ft_args(tmp_path, g, groups, address, steps, min_replicas=2, sleep=0.1, hold=str(hold))
            for g in range(groups)
        ]
        hold.touch()  # every group starts the run once all are up
        procs = [_spawn(a) for a in args]
        logs = [Path(a["log"]) for a in args]
        paths = [a["log"] for a in args]

        def ready(g: int) -> bool:
            return any(r.get("ready") and r["pid"] == procs[g].pid for r in _records(logs[g]))

        deadline = time.time() + 240
        while not all(ready(g) for g in range(groups)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), "no start"
            time.sleep(0.1)
        hold.unlink()

        def committed(g: int) -> list[dict]:
            return [r for r in _records(logs[g]) if r.get("committed")]

        while len(committed(victim)) < 8:
            assert time.time() < deadline, "the run did not start"
            assert all(p.poll() is None for p in procs), "a worker died"
            time.sleep(0.1)
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait()
        killed_at = max(r["step"] for r in committed(victim))

        # The survivors go on, same processes, the global batch split in two.
        while not all(
            any(r["parts"] == 2 and r["step"] >= killed_at + 5 for r in committed(g))
            for g in range(groups)
            if g != victim
        ):
            assert time.time() < deadline, "the survivors did not go on"
            assert all(procs[g].poll() is None for g in range(groups) if g != victim)
            time.sleep(0.1)
        hold.touch()  # the survivors wait until the restarted group is up (a slow start)
        procs[victim] = _spawn(args[victim])  # restarted: a fresh process, a new store
        while not ready(victim):
            assert time.time() < deadline and procs[victim].poll() is None, "no restart"
            time.sleep(0.1)
        resumed_at = max(r["step"] for r in committed(0))
        hold.unlink()
        _wait(procs, time.time() + 240, "the run", paths)
        assert [p.returncode for p in procs] == [0] * groups
    finally:
        server.shutdown()

    done = [_records(log)[-1] for log in logs]
    assert all(d.get("done") for d in done)
    for g in range(groups):
        if g == victim:
            continue
        recs = [r for r in _records(logs[g]) if "step" in r]
        assert {r["pid"] for r in recs} == {procs[g].pid}  # never restarted
        assert all(s < killed_at for s in done[g]["heal_steps"])  # no heal after the kill
        steps_done = [r["step"] for r in recs if r["committed"]]
        assert steps_done == list(range(steps_done[0], steps))  # every step, in order, once
        assert steps_done[0] <= 1
        # at most the step in progress is lost per failure (each failed commit is redone)
        assert done[g]["failed_commits"] <= 2
    # The restarted group healed from a live peer past the kill, then trained in lockstep.
    heal_steps = done[victim]["heal_steps"]
    assert len(heal_steps) >= 1 and heal_steps[-1] >= resumed_at, (heal_steps, resumed_at)
    rejoined = [
        r for r in _records(logs[victim]) if "step" in r and r["pid"] == done[victim]["pid"]
    ]
    assert rejoined[0]["step"] == heal_steps[-1] and rejoined[-1]["step"] == steps - 1
    assert not list(tmp_path.rglob("*.pth")) and not list(tmp_path.rglob("last_checkpoint"))
    states = [torch.load(a["out"], weights_only=True) for a in args]
    _assert_same_state(states[0], states[1])
    _assert_same_state(states[0], states[2])
    assert states[0]["schedulers"][0]["_global_step"] == steps


# ---------------------------------------------------------------------- FT-HSDP
def _ft_hsdp_run(tmp: Path, address: str, steps: int, groups: int = 2, **extra) -> list:
    """Start ``groups`` replica groups of 2 ranks, each FSDP2 over its ranks; their args
    (by group, then rank) and processes."""
    args, procs = [], []
    for g in range(groups):
        port = _free_port()
        for r in range(2):
            a = _ft_args(tmp, g, groups, address, steps, rank=r, parallelism=dict(dp_shard=2))
            a.update(extra)
            args.append(a)
            procs.append(_spawn(a, rank=r, world=2, port=port))
    return [args, procs]


def test_local_state_dict_round_trip_and_mismatch(tmp_path) -> None:
    """The heal's transport: Checkpointer.local_state_dict (RandomState: this rank's RNG
    state, no collective) loads back; different keys are refused before anything loads."""
    import logging

    from shardwise.checkpoint.checkpointer import Checkpointer
    from shardwise.checkpoint.states import RandomState

    seeds = []
    ckpt = Checkpointer(tmp_path)
    ckpt.register("randomness", RandomState(lambda: dict(seed=3), seeds.append, logging))
    ckpt.register("extra", torch.nn.Linear(2, 2))
    local = ckpt.local_state_dict()
    first = torch.rand(3)
    ckpt.load_local_state_dict(local)
    assert torch.equal(torch.rand(3), first) and seeds == []
    here = torch.get_rng_state()
    with pytest.raises(KeyError, match=r"the local state has \['randomness'\]"):
        ckpt.load_local_state_dict({"randomness": local["randomness"]})
    assert torch.equal(torch.get_rng_state(), here)  # nothing was restored


def test_ft_hsdp_refuses_a_replicate_dimension_of_its_own() -> None:
    ft = dict(replica_group=0, num_replica_groups=2, lighthouse="http://h:1")
    with pytest.raises(ValueError, match="dp_replicate=2, pp=1: the replica dimension is torchft"):
        FSDPStrategy.check_config(
            dict(
                type="FSDPStrategy",
                parallelism=dict(dp_replicate=2, dp_shard=1),
                fault_tolerance=ft,
            ),
            world_size=2,
        )


def test_ft_hsdp_unreachable_lighthouse_fails_on_both_ranks(tmp_path) -> None:
    args, procs = _ft_hsdp_run(tmp_path, f"http://127.0.0.1:{_free_port()}", steps=2, groups=1)
    start = time.time()
    _wait(procs, time.time() + 120, "the workers", [a["log"] for a in args])
    for a, p in zip(args, procs, strict=True):
        err = Path(a["log"]).with_suffix(".err").read_text()
        assert p.returncode != 0
        line = "could not reach the lighthouse"
        assert line in err and "connect_timeout=5.0s" in err, err[-2000:]
    assert time.time() - start < 90


@pytest.mark.slow
def test_ft_hsdp_without_failures_losses_equal_plain_hsdp(tmp_path) -> None:
    """2 replica groups x 2 ranks (FSDP2 inside, torchft across) against plain HSDP
    (dp_replicate=2 x dp_shard=2 on 4 ranks), the same data split: the same losses."""
    steps = 6
    server, address = _lighthouse(min_replicas=2)
    try:
        (tmp_path / "ft").mkdir()
        ft_args, procs = _ft_hsdp_run(tmp_path / "ft", address, steps)
        _wait(procs, time.time() + 300, "the FT-HSDP run", [a["log"] for a in ft_args])
        assert [p.returncode for p in procs] == [0] * 4
    finally:
        server.shutdown()
    (tmp_path / "plain").mkdir()
    port = _free_port()
    plain = [
        dict(
            steps=steps,
            parallelism=dict(dp_replicate=2, dp_shard=2),
            work_dir=str(tmp_path / "plain" / f"r{r}"),
            log=str(tmp_path / "plain" / f"r{r}.jsonl"),
            out=str(tmp_path / "plain" / f"r{r}.pt"),
        )
        for r in range(4)
    ]
    procs = [_spawn(a, rank=r, world=4, port=port) for r, a in enumerate(plain)]
    _wait(procs, time.time() + 240, "the plain HSDP run", [a["log"] for a in plain])
    assert [p.returncode for p in procs] == [0] * 4

    def losses(args_list):
        out = {}
        for a in args_list:
            for rec in _records(Path(a["log"])):
                if "step" in rec:
                    assert rec["committed"]
                    out[(rec["step"], rec["part"])] = rec["loss"]
        return out

    ft_losses, plain_losses = losses(ft_args), losses(plain)
    assert len(plain_losses) == steps * 4
    assert sorted(ft_losses) == sorted(plain_losses)
    for key, value in plain_losses.items():
        assert abs(ft_losses[key] - value) <= 1e-6, (key, ft_losses[key], value)
    # rank r of each replica group: the same shards, bit for bit
    states = [torch.load(a["out"], weights_only=True) for a in ft_args]
    _assert_same_state(states[0], states[2])
    _assert_same_state(states[1], states[3])


@pytest.mark.slow
def test_ft_hsdp_kill_one_replica_group_survivors_go_on_and_it_heals(tmp_path) -> None:
    """2 replica groups x 2 ranks, FSDP2 inside each: kill -9 both ranks of one group
    mid-step; the other goes on alone (same processes, no checkpoint); the killed group is
    restarted, heals rank by rank from the live one, and every replica ends bit-identical."""
    steps, victim = 24, 1
    hold = tmp_path / "hold"
    server, address = _lighthouse(min_replicas=1)
    try:
        hold.touch()  # every rank starts the run once all are up
        args, procs = _ft_hsdp_run(tmp_path, address, steps, sleep=0.1, hold=str(hold))
        logs = [Path(a["log"]) for a in args]
        paths = [a["log"] for a in args]
        mine = [2 * victim, 2 * victim + 1]  # the victim group's ranks
        others = [i for i in range(4) if i not in mine]

        def ready(i: int) -> bool:
            return any(r.get("ready") and r["pid"] == procs[i].pid for r in _records(logs[i]))

        def committed(i: int) -> list[dict]:
            return [r for r in _records(logs[i]) if r.get("committed")]

        deadline = time.time() + 400
        while not all(ready(i) for i in range(4)):
            assert time.time() < deadline and all(p.poll() is None for p in procs), "no start"
            time.sleep(0.1)
        hold.unlink()
        while len(committed(mine[0])) < 6:
            assert time.time() < deadline, "the run did not start"
            assert all(p.poll() is None for p in procs), "a worker died"
            time.sleep(0.1)
        for i in mine:
            os.kill(procs[i].pid, signal.SIGKILL)
        for i in mine:
            procs[i].wait()
        killed_at = max(r["step"] for i in mine for r in committed(i))

        # The survivors go on alone: same processes, the whole batch split over their ranks.
        while not all(
            any(r["parts"] == 1 and r["step"] >= killed_at + 3 for r in committed(i))
            for i in others
        ):
            assert time.time() < deadline, "the survivors did not go on"
            assert all(procs[i].poll() is None for i in others), "a survivor died"
            time.sleep(0.1)
        hold.touch()  # the survivors wait until the restarted group is up (a slow start)
        port = _free_port()
        for r, i in enumerate(mine):  # restarted: fresh processes, a new store
            procs[i] = _spawn(args[i], rank=r, world=2, port=port)
        while not all(ready(i) for i in mine):
            assert time.time() < deadline and all(procs[i].poll() is None for i in mine)
            time.sleep(0.1)
        resumed_at = max(r["step"] for r in committed(others[0]))
        hold.unlink()
        _wait(procs, time.time() + 300, "the run", paths)
        assert [p.returncode for p in procs] == [0] * 4
    finally:
        server.shutdown()

    done = [_records(log)[-1] for log in logs]
    assert all(d.get("done") for d in done)
    for i in others:
        recs = [r for r in _records(logs[i]) if "step" in r]
        assert {r["pid"] for r in recs} == {procs[i].pid}  # never restarted
        assert all(s < killed_at for s in done[i]["heal_steps"])  # no heal after the kill
        steps_done = [r["step"] for r in recs if r["committed"]]
        assert steps_done == list(range(steps_done[0], steps))  # every step, in order, once
        assert steps_done[0] <= 1
        assert done[i]["failed_commits"] <= 2  # at most the step in progress, redone
        assert any(r["parts"] == 1 for r in recs) and any(r["parts"] == 2 for r in recs)
    for i in mine:  # each rank of the restarted group healed from a live peer past the kill
        heal_steps = done[i]["heal_steps"]
        assert len(heal_steps) >= 1 and heal_steps[-1] >= resumed_at, (heal_steps, resumed_at)
        rejoined = [r for r in _records(logs[i]) if "step" in r and r["pid"] == done[i]["pid"]]
        assert rejoined[0]["step"] == heal_steps[-1] and rejoined[-1]["step"] == steps - 1
    assert not list(tmp_path.rglob("*.pth")) and not list(tmp_path.rglob("last_checkpoint"))
    states = [torch.load(a["out"], weights_only=True) for a in args]
    _assert_same_state(states[0], states[2])  # rank 0 of each group: the same shards
    _assert_same_state(states[1], states[3])
    assert states[0]["schedulers"][0]["_global_step"] == steps


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))
