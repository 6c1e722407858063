"""Replica-level fault tolerance on torchft (issue 28): what it costs and what it saves.

    python bench/fault_tolerance.py --quick [--out FILE]

1. **Step time, FT-HSDP against plain HSDP**: 2 replica groups x 2 ranks (FSDP2 inside each,
   torchft across, a real lighthouse) against ``parallelism=dict(dp_replicate=2,
   dp_shard=2)`` on 4 ranks, the same model, data split and steps, run ABBA-ordered (plain,
   FT, FT, plain, 3 times --quick, 4 times --full: one launch's median step moves by up to
   10% between launches of the same code on this machine, so a side is the median of 6-8
   launches); the median step time of each (the first steps dropped), their ratio (target
   <= 1.05 on CPU), and where the time goes: forward + backward (FT: with the cross-group
   all-reduce, in FSDP2's all-reduce hook), the optimizer wrapper's step (FT: with the
   commit vote), the commit vote alone, the wait for the quorum in ``start_step``, the CPU
   time of a rank's process per step.
2. **Time the survivors lose per injected failure**: the same FT-HSDP run, ``min_replicas=1``;
   every process of one group is killed (SIGKILL) mid-run; the survivors' time from the last
   step committed before the kill to the 5th committed after it, less 5 median steps
   (target: under 2 steps plus the quorum timeout; in practice the lighthouse's heartbeat
   timeout, 2 s here, decides how long the first quorum without the dead group waits).
3. **Heal of a 100M state against a disk resume of the same state**: DDP replica groups of one
   process; a model of ~33.5M float32 parameters with AdamW (weights + 2 moments: 100M
   numbers, ~400 MB); group 1 joins group 0 mid-run and heals from it over torchft's HTTP
   transport (the heal: receiving the peer's state plus loading it; its whole first
   ``start_step``, which also waits for a quorum that takes it in, is ``heal_call_s``; group 0
   sleeps 0.5 s a step, so that wait is up to two of its steps); then the same process
   saves a full checkpoint and ``resume``s it (the file is in the page cache: a best case for
   the disk).

Each contender runs as its own set of processes (4 ranks + the lighthouse at most, on a
2-core machine: the step times are of an oversubscribed CPU, both sides alike).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]

SIZES = dict(
    quick=dict(
        dim=1024,
        kill_dim=256,
        steps=40,
        rounds=6,
        kill_steps=40,
        heal_dim=2048,
        heal_layers=8,
        heal_steps=12,
    ),
    full=dict(
        dim=2048,
        kill_dim=256,
        steps=60,
        rounds=8,
        kill_steps=60,
        heal_dim=2048,
        heal_layers=8,
        heal_steps=16,
    ),
)
BATCH = 16
WARMUP = 5
STEP_TARGET = 1.05
TIMEOUTS = dict(timeout=20, quorum_timeout=60, connect_timeout=10)
#: The lighthouse's: a replica group whose heartbeats stop for this long leaves the quorum.
HEARTBEAT_TIMEOUT_MS = 2000
JOIN_TIMEOUT_MS = 1000
#: The survivors' loss is measured over this many committed steps after the kill (the
#: stall may fall on the step after the one in progress: the lighthouse waits for the dead
#: group's heartbeats to time out).
AFTER_KILL = 5


# ----------------------------------------------------------------------------- a worker
def _worker(args: dict[str, Any]) -> None:
    """One rank: train ``steps`` steps; one JSON line per step (and the heal/resume times)."""
    import torch

    torch.set_num_threads(1)
    import logging

    logging.getLogger("shardwise").setLevel(logging.WARNING)
    from shardwise.strategies import DDPStrategy, FSDPStrategy

    log = open(args["log"], "a", buffering=1)
    common = dict(
        work_dir=args["work_dir"],
        env_kwargs=dict(randomness=dict(seed=0)),
        log_kwargs=dict(log_level="WARNING"),
    )
    ft_cfg = args.get("ft")
    if "parallelism" in args:
        strategy = FSDPStrategy(parallelism=args["parallelism"], fault_tolerance=ft_cfg, **common)
    else:
        strategy = DDPStrategy(fault_tolerance=ft_cfg, **common)
    torch.manual_seed(0)
    dim, layers = args["dim"], args.get("layers", 2)
    model = torch.nn.Sequential(
        *[m for _ in range(layers) for m in (torch.nn.Linear(dim, dim), torch.nn.Tanh())],
        torch.nn.Linear(dim, 1),
    )
    model, optim_wrapper = strategy.prepare(
        model, optim_wrapper=dict(optimizer=dict(type="AdamW", lr=1e-3))
    )
    ft = strategy.fault_tolerance

    phases: dict[str, float] = {}
    if ft is not None:  # the commit vote's share of the optimizer wrapper's step
        vote = ft.should_commit

        def timed_vote() -> bool:
            start = time.perf_counter()
            try:
                return vote()
            finally:
                phases["commit_s"] = time.perf_counter() - start

        ft.should_commit = timed_vote
        # a heal's own cost: receiving the peer's state (torchft's quorum thread) and loading it
        transport, load = ft.manager._checkpoint_transport, ft.load_state_dict
        recv = transport.recv_checkpoint

        def timed_recv(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return recv(*a, **k)
            finally:
                phases["heal_recv_s"] = time.perf_counter() - start

        def timed_load(state: Any) -> None:
            start = time.perf_counter()
            try:
                load(state)
            finally:
                phases["heal_load_s"] = time.perf_counter() - start

        transport.recv_checkpoint = timed_recv
        ft.manager._load_state_dict_fns["shardwise"] = timed_load

    def run_step(step: int, part: list[int]) -> float:
        g = torch.Generator().manual_seed(step)
        x = torch.randn(BATCH, dim, generator=g)
        start = time.perf_counter()
        loss = torch.nn.functional.mse_loss(model(x[part]), x[part].sum(1, keepdim=True).sin())
        optim_wrapper.backward(loss)
        phases["fwd_bwd_s"] = time.perf_counter() - start
        start = time.perf_counter()
        optim_wrapper.step()
        optim_wrapper.zero_grad()
        phases["optim_s"] = time.perf_counter() - start
        time.sleep(args.get("sleep", 0.0))
        return loss.item()

    log.write(json.dumps(dict(ready=True, pid=os.getpid(), time=time.time())) + "\n")
    steps = args["steps"]
    if ft is None:
        rank, world = strategy.rank, strategy.world_size
        for step in range(steps):
            start = time.perf_counter()
            cpu = time.process_time()
            run_step(step, list(range(rank, BATCH, world)))
            rec = dict(
                step=step,
                committed=True,
                s=time.perf_counter() - start,
                cpu_s=time.process_time() - cpu,
                time=time.time(),
                **phases,
            )
            log.write(json.dumps(rec) + "\n")
    else:
        while True:
            start = time.perf_counter()
            cpu = time.process_time()
            healed = len(ft.heal_steps)
            step = ft.start_step()
            quorum_s = time.perf_counter() - start
            if step >= steps:
                break
            run_step(step, ft.shard(BATCH))
            rec = dict(
                step=step,
                committed=ft.current_step() > step,
                s=time.perf_counter() - start,
                quorum_s=quorum_s,
                healed=len(ft.heal_steps) > healed,
                parts=ft.num_replicas,
                cpu_s=time.process_time() - cpu,
                time=time.time(),
                **phases,
            )
            log.write(json.dumps(rec) + "\n")
    if args.get("disk"):  # the disk resume of the same state, in the same process
        path = Path(args["work_dir"]) / "bench_resume.pth"
        start = time.perf_counter()
        strategy.save_checkpoint(str(path))
        saved_s = time.perf_counter() - start
        start = time.perf_counter()
        strategy.resume(str(path))
        resume_s = time.perf_counter() - start
        log.write(json.dumps(dict(save_s=saved_s, resume_s=resume_s)) + "\n")
    numbers = sum(t.numel() for t in model.parameters())
    numbers += sum(
        v.numel()
        for s in optim_wrapper.optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )
    log.write(json.dumps(dict(done=True, pid=os.getpid(), state_numbers=numbers)) + "\n")
    log.close()
    if ft is not None:
        ft.shutdown(wait_for_group=True)
    os._exit(0)


# ----------------------------------------------------------------------------- the harness
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: dict[str, Any], rank: int, world: int, port: int) -> subprocess.Popen:
    env = dict(
        os.environ,
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(REPO / "src"),
    )
    err = open(Path(args["log"]).with_suffix(".err"), "a")
    cmd = [sys.executable, str(HERE), "--worker", json.dumps(args)]
    return subprocess.Popen(cmd, env=env, stdout=err, stderr=err)


def _records(path: str) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.endswith("}")]


def _wait(procs: list[subprocess.Popen], args: list[dict[str, Any]], limit: float) -> None:
    deadline = time.time() + limit
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            errs = "\n".join(Path(a["log"]).with_suffix(".err").read_text()[-1500:] for a in args)
            raise RuntimeError(f"the ranks did not finish in {limit:.0f} s\n{errs}") from None
    bad = [p.returncode for p in procs if p.returncode != 0]
    if bad:
        errs = "\n".join(Path(a["log"]).with_suffix(".err").read_text()[-1500:] for a in args)
        raise RuntimeError(f"a rank failed (exit {bad})\n{errs}")


def _lighthouse(min_replicas: int):
    from torchft._torchft import LighthouseServer

    server = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=min_replicas, join_timeout_ms=JOIN_TIMEOUT_MS,
        heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
    )  # fmt: skip
    return server, "http://127.0.0.1:" + server.address().rsplit(":", 1)[1]


def _ft(group: int, groups: int, address: str, min_replicas: int) -> dict[str, Any]:
    return dict(
        replica_group=group,
        num_replica_groups=groups,
        min_replicas=min_replicas,
        lighthouse=address,
        **TIMEOUTS,
    )


def _hsdp_groups(tmp: Path, address: str, min_replicas: int, **extra: Any):
    """2 replica groups x 2 ranks, FSDP2 inside each: args and processes (group-major)."""
    args, procs = [], []
    for g in range(2):
        port = _free_port()
        for r in range(2):
            a = dict(
                ft=_ft(g, 2, address, min_replicas),
                parallelism=dict(dp_shard=2),
                work_dir=str(tmp / f"g{g}r{r}"),
                log=str(tmp / f"g{g}r{r}.jsonl"),
                **extra,
            )
            args.append(a)
            procs.append(_spawn(a, r, 2, port))
    return args, procs


def _median_step(recs: list[dict[str, Any]], key: str = "s") -> float:
    times = [r.get(key, 0.0) for r in recs if "step" in r and r["committed"]][WARMUP:]
    return statistics.median(times)


#: Where a step's time goes: forward + backward (FT-HSDP: with the cross-group all-reduce,
#: in FSDP's hook), the optimizer wrapper's step (FT: with the commit vote), the vote alone,
#: the wait for the quorum in start_step, and the CPU time of the rank's process (all its
#: threads: torchft's quorum and server threads included) per step.
PHASES = ("fwd_bwd_s", "optim_s", "commit_s", "quorum_s", "cpu_s")


def _plain_hsdp(tmp: Path, common: dict[str, Any]) -> list[dict[str, Any]]:
    """One run of plain HSDP (2x2 mesh, 4 ranks); its ranks' args (their logs)."""
    tmp.mkdir()
    plain = [
        dict(
            parallelism=dict(dp_replicate=2, dp_shard=2),
            work_dir=str(tmp / f"plain{r}"),
            log=str(tmp / f"plain{r}.jsonl"),
            **common,
        )
        for r in range(4)
    ]
    port = _free_port()
    procs = [_spawn(a, r, 4, port) for r, a in enumerate(plain)]
    _wait(procs, plain, 300)
    return plain


def _ft_hsdp(tmp: Path, common: dict[str, Any]) -> list[dict[str, Any]]:
    """One run of FT-HSDP (2 groups x 2 ranks, a lighthouse); its ranks' args."""
    tmp.mkdir()
    server, address = _lighthouse(2)
    try:
        ft_args, procs = _hsdp_groups(tmp, address, 2, **common)
        _wait(procs, ft_args, 300)
    finally:
        server.shutdown()
    return ft_args


def step_time(tmp: Path, size: dict[str, Any]) -> dict[str, Any]:
    """Median step time of plain HSDP (2x2 mesh, 4 ranks) and of FT-HSDP (2 groups x 2),
    run ABBA-ordered (plain, FT, FT, plain, ...: a load that drifts falls on both alike); the
    step time of each side is the median over its runs' ranks' medians."""
    common = dict(dim=size["dim"], steps=size["steps"])
    runs: dict[str, list[list[dict[str, Any]]]] = {"plain": [], "ft": []}
    order = ["plain", "ft", "ft", "plain"] * (size["rounds"] // 2)
    for i, side in enumerate(order):
        run = _plain_hsdp if side == "plain" else _ft_hsdp
        runs[side].append(run(tmp / f"{side}{i}", common))

    def median(side: str, key: str = "s") -> float:
        return statistics.median(
            _median_step(_records(a["log"]), key) for args in runs[side] for a in args
        )

    plain_s, ft_s = median("plain"), median("ft")
    per_run = {
        side: [
            statistics.median(_median_step(_records(a["log"])) for a in args) for args in runs[side]
        ]
        for side in runs
    }
    return dict(
        plain_hsdp_step_s=plain_s,
        ft_hsdp_step_s=ft_s,
        **{f"{side}_{key}": median(side, key) for side in runs for key in PHASES},
        overhead_s=ft_s - plain_s,
        ratio=ft_s / plain_s,
        target=STEP_TARGET,
        order=order,
        plain_runs_s=per_run["plain"],
        ft_runs_s=per_run["ft"],
        steps=size["steps"],
        warmup=WARMUP,
        dim=size["dim"],
    )


def failure_cost(tmp: Path, size: dict[str, Any]) -> dict[str, Any]:
    """Kill both ranks of group 1 after 10 committed steps; the survivors' lost time."""
    server, address = _lighthouse(1)
    try:
        args, procs = _hsdp_groups(
            tmp, address, 1, dim=size["kill_dim"], steps=size["kill_steps"], sleep=0.05
        )
        deadline = time.time() + 300
        while sum(bool(r.get("committed")) for r in _records(args[2]["log"])) < 10:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("the FT-HSDP run did not reach step 10")
            time.sleep(0.05)
        killed = time.time()
        for i in (2, 3):
            os.kill(procs[i].pid, signal.SIGKILL)
        for i in (2, 3):
            procs[i].wait()
        _wait(procs[:2], args[:2], 300)
    finally:
        server.shutdown()
    out = []
    for a in args[:2]:
        recs = [r for r in _records(a["log"]) if "step" in r]
        committed = [r for r in recs if r["committed"]]
        before = [r for r in committed if r["time"] <= killed]
        after = [r for r in committed if r["time"] > killed]
        median = _median_step(recs)
        gap = after[AFTER_KILL - 1]["time"] - before[-1]["time"]
        out.append(
            dict(
                median_step_s=median,
                gap_s=gap,
                lost_s=gap - AFTER_KILL * median,
                lost_steps=(gap - AFTER_KILL * median) / median,
                slowest_after_kill_s=max(r["s"] for r in after[:AFTER_KILL]),
                failed_commits=sum(not r["committed"] for r in recs),
                finished=committed[-1]["step"] == size["kill_steps"] - 1,
            )
        )
    worst = max(out, key=lambda o: o["lost_s"])
    return dict(
        ranks=out,
        lost_s=worst["lost_s"],
        lost_steps=worst["lost_steps"],
        median_step_s=worst["median_step_s"],
        after_kill_steps=AFTER_KILL,
        dim=size["kill_dim"],
        quorum_timeout_s=TIMEOUTS["quorum_timeout"],
        heartbeat_timeout_s=HEARTBEAT_TIMEOUT_MS / 1000,
        target_s=2 * worst["median_step_s"] + TIMEOUTS["quorum_timeout"],
    )


def heal_vs_disk(tmp: Path, size: dict[str, Any]) -> dict[str, Any]:
    """Group 1 joins group 0 at step ~3 and heals ~100M numbers; then saves and resumes."""
    server, address = _lighthouse(1)
    common = dict(dim=size["heal_dim"], layers=size["heal_layers"], steps=size["heal_steps"])
    try:
        a0 = dict(
            ft=_ft(0, 2, address, 1), work_dir=str(tmp / "h0"), log=str(tmp / "h0.jsonl"),
            sleep=0.5, **common,
        )  # fmt: skip
        a1 = dict(
            ft=_ft(1, 2, address, 1), work_dir=str(tmp / "h1"), log=str(tmp / "h1.jsonl"),
            disk=True, **common,
        )  # fmt: skip
        p0 = _spawn(a0, 0, 1, _free_port())
        deadline = time.time() + 300
        while sum(bool(r.get("committed")) for r in _records(a0["log"])) < 3:
            if time.time() > deadline or p0.poll() is not None:
                raise RuntimeError("group 0 did not reach step 3")
            time.sleep(0.05)
        p1 = _spawn(a1, 0, 1, _free_port())
        _wait([p0, p1], [a0, a1], 600)
    finally:
        server.shutdown()
    recs = _records(a1["log"])
    steps = [r for r in recs if "step" in r]
    heals = [r for r in steps if r["healed"]]
    if not heals:
        raise RuntimeError(f"group 1 did not heal: {steps[:3]}")
    later = [r["quorum_s"] for r in steps if not r["healed"]][1:]
    disk = next(r for r in recs if "resume_s" in r)
    done = next(r for r in recs if r.get("done"))
    heal_s = heals[0]["heal_recv_s"] + heals[0]["heal_load_s"]
    return dict(
        state_numbers=done["state_numbers"],
        state_bytes=4 * done["state_numbers"],
        heal_step=heals[0]["step"],
        heal_call_s=heals[0]["quorum_s"],
        quorum_s=statistics.median(later) if later else None,
        heal_recv_s=heals[0]["heal_recv_s"],
        heal_load_s=heals[0]["heal_load_s"],
        heal_s=heal_s,
        save_s=disk["save_s"],
        resume_s=disk["resume_s"],
        ratio=heal_s / disk["resume_s"],
    )


def run(quick: bool) -> dict[str, Any]:
    # torchft's lighthouse (here in this process, in a deployment on a host of its own) logs
    # five lines a quorum at info; the replicas log warnings only (shardwise's default)
    os.environ.setdefault("RUST_LOG", "warn")
    try:
        import torchft  # noqa: F401
    except ImportError as exc:
        return {"status": "not available", "reason": f"torchft is not installed ({exc})"}
    size = SIZES["quick" if quick else "full"]
    result: dict[str, Any] = {"sizes": size, "timeouts": TIMEOUTS}
    for name, fn in (
        ("step_time", step_time),
        ("failure", failure_cost),
        ("heal", heal_vs_disk),
    ):
        with tempfile.TemporaryDirectory(prefix="shardwise-bench-ft-") as tmp:
            try:
                result[name] = {"status": "ok", **fn(Path(tmp), size)}
            except Exception as exc:  # noqa: BLE001 - one case's failure is its result
                result[name] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[-3000:]}
    result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
    else:
        sys.path.insert(0, str(HERE.parent))
        from _common import section_main

        section_main("fault_tolerance", run)
