"""Fault tolerance of saving: a rank killed (``kill -9``) at any point of a save, a rank raising
during its write, a full disk, a denied permission.

After each: the previous committed checkpoint still loads and auto-resume picks it; no rank
hangs (every failure surfaces within the collective timeout the test sets, as CheckpointError
on the ranks that survive); the next save cleans the leftovers.

The kill points are drawn with a seeded RNG (``TRIALS``) over synchronous and asynchronous
saves, both formats, both ranks, just before or just after each step of a save; the first
few run by default, the rest with ``-m slow``.
"""

from __future__ import annotations

import errno
import os
import queue
import random
import signal
import time
from pathlib import Path

import pytest
import torch

from shardwise.checkpoint import CheckpointError, find_last_checkpoint
from shardwise.checkpoint.manifest import verify_manifest
from shardwise.strategies import FSDPStrategy, SingleDeviceStrategy
from tests.distributed import _context, _worker, free_port, run_distributed
from tests.test_fsdp import Block, TinyTransformer, train_lm

TIMEOUT = 10  # seconds: the collective timeout of every run here
OPTIM = dict(optimizer=dict(type="AdamW", lr=1e-2))


# ----------------------------------------------------------------------------- a launcher
def run_ranks(fn, world_size, *args, deadline=3 * TIMEOUT + 30):
    """Run ``fn`` on ``world_size`` ranks and wait for *every* rank (unlike run_distributed,
    which stops at the first failure): ``{rank: (outcome, value, seconds)}`` with outcome
    ``'ok'`` (value: the result), ``'error'`` (the traceback), ``'exit'`` (the exit code of
    a process that died without a word) or ``'hung'``."""
    import pickle

    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, port, False, {}, os.getcwd(), args, {}, results),
            name=f"rank{rank}",
        )
        for rank in range(world_size)
    ]
    start = time.monotonic()
    for proc in procs:
        proc.start()
    outcomes = {}
    while len(outcomes) < world_size and time.monotonic() - start < deadline:
        try:
            rank, ok, value = results.get(timeout=0.2)
            elapsed = time.monotonic() - start
            outcomes[rank] = (
                ("ok", pickle.loads(value), elapsed) if ok else ("error", value, elapsed)
            )
        except queue.Empty:
            for rank, proc in enumerate(procs):
                if rank not in outcomes and proc.exitcode not in (None, 0):
                    time.sleep(0.1)  # a result put just before exiting
                    if results.empty():
                        outcomes[rank] = ("exit", proc.exitcode, time.monotonic() - start)
    for rank, proc in enumerate(procs):
        outcomes.setdefault(rank, ("hung", None, time.monotonic() - start))
        proc.join(timeout=0.3)  # a survivor may block in destroy_process_group: its result is in
        if proc.is_alive():
            proc.kill()
            proc.join()
    return outcomes


# ----------------------------------------------------------------------------- the trials
# where a rank can die: (module, attribute) -> who calls it
POINTS = {
    "gather the state": ("shardwise.checkpoint.states:RandomState", "state_dict"),
    "stage to host memory": ("shardwise.checkpoint.async_save:AsyncCheckpointer", "stage"),
    "prepare the staging path": ("shardwise.checkpoint.commit:CheckpointCommit", "begin"),
    "write DCP shards": ("shardwise.checkpoint.sharded:_RecordingWriter", "write_data"),
    "write meta.pt": ("shardwise.checkpoint.sharded", "save_full_checkpoint"),
    "write the full file": ("shardwise.checkpoint.formats", "save_full_checkpoint"),
    "hash the files written": ("shardwise.checkpoint.commit:CheckpointCommit", "_digests"),
    "agree": ("shardwise.checkpoint.commit:CheckpointCommit", "finish"),
    "record the manifest": ("shardwise.checkpoint.commit", "stage_manifest"),
    "rename into place": ("shardwise.checkpoint.commit", "_commit_on_rank0"),
    "update last_checkpoint": ("shardwise.checkpoint.commit", "write_last_checkpoint"),
}
RANK0_ONLY = {"write meta.pt", "write the full file", "record the manifest", "rename into place"}
RANK0_ONLY |= {"update last_checkpoint"}
ONLY_FORMAT = {"write DCP shards": "sharded", "write meta.pt": "sharded"}
ONLY_FORMAT |= {"write the full file": "full"}
COMMITTED = {("rename into place", "after"), ("update last_checkpoint", "after")}


def _trials(n: int, seed: int = 20251121) -> list[tuple[str, str, str, int, str]]:
    """``n`` kill points ``(mode, format, point, victim rank, before/after)``: synchronous
    and asynchronous saves and the two victims take turns; the format, the point among those
    the victim reaches, and before/after are drawn."""
    rng = random.Random(seed)
    trials = []
    for i in range(n):
        mode, victim = ("sync", "async")[i % 2], (i // 2) % 2
        fmt = rng.choice(["sharded", "full"])
        points = [
            p
            for p in POINTS
            if ONLY_FORMAT.get(p, fmt) == fmt
            and (victim == 0 or p not in RANK0_ONLY)
            and (mode == "async" or p != "stage to host memory")
            and not (p == "stage to host memory" and fmt == "full" and victim != 0)
        ]
        point = rng.choice(points)
        # after 'agree' every collective of the save is done: the save succeeded
        when = "before" if point == "agree" else rng.choice(["before", "after"])
        trials.append((mode, fmt, point, victim, when))
    return trials


TRIALS = _trials(24)
DEFAULT_TRIALS = 4


def _kill_at(point: str, when: str) -> None:
    import importlib

    where, attr = POINTS[point]
    module, _, cls = where.partition(":")
    owner = importlib.import_module(module)
    if cls:
        owner = getattr(owner, cls)
    original = getattr(owner, attr)

    def dying(*args, **kwargs):
        if when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        result = original(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return result

    setattr(owner, attr, dying)


def _strategy(work_dir, fmt):
    strategy = FSDPStrategy(
        work_dir=work_dir,
        state_dict_cfg=fmt,
        model_wrapper=dict(auto_wrap_policy={Block}),
        env_kwargs=dict(dist_cfg=dict(timeout=TIMEOUT), randomness=dict(seed=3)),
        log_kwargs=dict(log_level="WARNING"),
    )
    return strategy, *strategy.prepare(TinyTransformer(layers=1), optim_wrapper=OPTIM)


def _save_and_die(work_dir, mode, fmt, point, victim, when):
    """Save 'good' (committed); then save 'bad' with ``victim`` killed at ``point``."""
    strategy, model, wrapper = _strategy(work_dir, fmt)
    train_lm(strategy, model, wrapper, range(1), strategy.rank, 2)
    strategy.save_checkpoint("good.ckpt", extra_ckpt=dict(meta=dict(iter=1)))
    train_lm(strategy, model, wrapper, range(1, 2), strategy.rank, 2)
    if strategy.rank == victim:
        _kill_at(point, when)
    start = time.monotonic()
    try:
        strategy.save_checkpoint(
            "bad.ckpt", extra_ckpt=dict(meta=dict(iter=2)), async_save=mode == "async"
        )
        strategy.wait_for_checkpoint()
    except CheckpointError:
        Path(work_dir, f"failed_after_{strategy.rank}").write_text(f"{time.monotonic() - start}")
        raise
    return "saved"


def _leftovers(work_dir):
    return sorted(
        p.name for p in Path(work_dir).iterdir() if p.name.endswith((".partial", ".replaced"))
    )


def _check_recovery(work_dir, expected_iter):
    """Auto-resume picks the last committed checkpoint and loads it; the next save cleans."""
    strategy = SingleDeviceStrategy(work_dir=str(work_dir), log_kwargs=dict(log_level="WARNING"))
    strategy.prepare(TinyTransformer(layers=1), optim_wrapper=OPTIM)
    checkpoint = strategy.load_or_resume(resume=True)
    assert checkpoint is not None and checkpoint["meta"]["iter"] == expected_iter
    assert verify_manifest(find_last_checkpoint(work_dir)) == []
    strategy.save_checkpoint("next.ckpt")
    assert _leftovers(work_dir) == []
    assert find_last_checkpoint(work_dir) == str(Path(work_dir, "next.ckpt"))


def _run_trial(work_dir, mode, fmt, point, victim, when):
    outcomes = run_ranks(_save_and_die, 2, str(work_dir), mode, fmt, point, victim, when)
    survivor = 1 - victim
    assert outcomes[victim][:2] == ("exit", -signal.SIGKILL), outcomes[victim]
    kind, value, _ = outcomes[survivor]
    assert kind == "error", f"rank {survivor} did not fail: {kind} {value}"
    assert "CheckpointError" in value.strip().splitlines()[-1], value
    failed_after = float(Path(work_dir, f"failed_after_{survivor}").read_text())
    assert failed_after < 2 * TIMEOUT  # at the timeout at worst; usually at once
    committed = (point, when) in COMMITTED
    expected = Path(work_dir, "bad.ckpt" if committed else "good.ckpt")
    assert find_last_checkpoint(work_dir) == str(expected)
    _check_recovery(work_dir, 2 if committed else 1)
    return failed_after


def _trial_id(trial):
    mode, fmt, point, victim, when = trial
    return f"{mode}-{fmt}-rank{victim}-{when}-{point.replace(' ', '_')}"


@pytest.mark.parametrize("trial", TRIALS[:DEFAULT_TRIALS], ids=_trial_id)
def test_a_rank_killed_during_a_save_leaves_the_previous_checkpoint(tmp_path, trial):
    _run_trial(tmp_path, *trial)


@pytest.mark.slow
@pytest.mark.parametrize("trial", TRIALS[DEFAULT_TRIALS:], ids=_trial_id)
def test_a_rank_killed_during_a_save_leaves_the_previous_checkpoint_slow(tmp_path, trial):
    _run_trial(tmp_path, *trial)


def test_the_trials_cover_both_modes_formats_and_ranks():
    assert {t[0] for t in TRIALS} == {"sync", "async"}
    assert {t[1] for t in TRIALS} == {"sharded", "full"}
    assert {t[3] for t in TRIALS} == {0, 1}
    assert len(TRIALS) >= 20


# ----------------------------------------------------------------------------- overwriting
def _overwrite_and_die(work_dir):
    """Rank 0 dies between the two renames of an overwrite: the old checkpoint is aside."""
    strategy, model, wrapper = _strategy(work_dir, "sharded")
    train_lm(strategy, model, wrapper, range(1), strategy.rank, 2)
    strategy.save_checkpoint("latest.ckpt", extra_ckpt=dict(meta=dict(iter=1)))
    if strategy.rank == 0:
        replace = os.replace

        def dying(src, dst):
            if Path(src).name == ".latest.ckpt.partial":
                os.kill(os.getpid(), signal.SIGKILL)
            replace(src, dst)

        os.replace = dying
    strategy.save_checkpoint("latest.ckpt", extra_ckpt=dict(meta=dict(iter=2)))


@pytest.mark.slow
def test_a_crash_while_overwriting_a_checkpoint_keeps_the_old_one(tmp_path):
    outcomes = run_ranks(_overwrite_and_die, 2, str(tmp_path))
    assert outcomes[0][:2] == ("exit", -signal.SIGKILL)
    assert outcomes[1][0] == "error" and "CheckpointError" in outcomes[1][1]
    assert not (tmp_path / "latest.ckpt").exists()  # moved aside, the new one not yet in
    assert find_last_checkpoint(tmp_path) == str(tmp_path / ".latest.ckpt.replaced")
    _check_recovery(tmp_path, 1)


def test_an_overwrite_interrupted_between_its_renames_is_undone_by_the_next_save(tmp_path):
    """What the kill above leaves on disk, made by hand: the old checkpoint moved aside, the
    new one still under its staging name."""
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="WARNING"))
    strategy.prepare(torch.nn.Linear(2, 2), optim_wrapper=OPTIM)
    strategy.save_checkpoint("latest.pth", extra_ckpt=dict(meta=dict(iter=1)))
    os.replace(tmp_path / "latest.pth", tmp_path / ".latest.pth.replaced")
    (tmp_path / ".latest.pth.partial").write_bytes(b"complete, never renamed")
    assert find_last_checkpoint(tmp_path) == str(tmp_path / ".latest.pth.replaced")
    assert strategy.load_or_resume(resume=True)["meta"]["iter"] == 1
    strategy.save_checkpoint("other.pth")  # cleans up: the old one is back under its name
    assert torch.load(tmp_path / "latest.pth", weights_only=True)["meta"]["iter"] == 1
    assert _leftovers(tmp_path) == []


# ----------------------------------------------------------------------------- errors
def _fail_writes(kind, rank):
    """Make ``rank``'s writes fail as ``kind`` says. Permission: the tests run as root, whom
    a read-only folder does not stop, so the writer raises the PermissionError itself."""
    from shardwise.checkpoint import sharded

    errors = {
        "raise": RuntimeError("the writer broke"),
        "disk full": OSError(errno.ENOSPC, "No space left on device"),
        "permission": PermissionError(errno.EACCES, "Permission denied"),
    }
    original = sharded._RecordingWriter.write_data

    def failing(self, plan, planner):
        raise errors[kind]

    if int(os.environ["RANK"]) == rank:
        sharded._RecordingWriter.write_data = failing
    return lambda: setattr(sharded._RecordingWriter, "write_data", original)


def _save_with_errors(work_dir):
    out = {}
    strategy, model, wrapper = _strategy(work_dir, "sharded")
    train_lm(strategy, model, wrapper, range(1), strategy.rank, 2)
    strategy.save_checkpoint("good.ckpt", extra_ckpt=dict(meta=dict(iter=1)))
    for kind, mode in [("raise", "sync"), ("disk full", "async"), ("permission", "sync")]:
        restore = _fail_writes(kind, rank=1)
        start = time.monotonic()
        try:
            strategy.save_checkpoint(f"{kind}.ckpt", async_save=mode == "async")
            strategy.wait_for_checkpoint()
            out[kind] = None
        except CheckpointError as exc:
            out[kind] = (str(exc), time.monotonic() - start)
        restore()
        out[f"{kind} last"] = find_last_checkpoint(work_dir)
        out[f"{kind} leftovers"] = _leftovers(work_dir)
    return out


def test_a_write_that_fails_on_one_rank_fails_the_save_on_every_rank(tmp_path):
    results = run_distributed(_save_with_errors, 2, str(tmp_path), timeout=120)
    messages = {
        "raise": "the writer broke",
        "disk full": "No space left on device",
        "permission": "Permission denied",
    }
    for result in results:
        for kind, message in messages.items():
            error, seconds = result[kind]
            # every rank fails the save, naming the rank whose write failed (each rank plans
            # and writes alone: the others' writes succeed, the commit's agreement fails them)
            assert message in error and "failed on rank 1" in error
            assert seconds < TIMEOUT  # no waiting for a timeout: the ranks agree at once
            assert result[f"{kind} last"] == str(tmp_path / "good.ckpt")
            assert result[f"{kind} leftovers"] == []  # removed with the failed save
    _check_recovery(tmp_path, 1)


def test_the_next_save_removes_a_staged_manifest_and_orphaned_sidecars(tmp_path):
    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="WARNING"))
    strategy.prepare(torch.nn.Linear(2, 2))
    (tmp_path / ".a.pth.manifest.json.partial").write_text("{}")  # killed while recording
    strategy.save_checkpoint("gone.pth")
    (tmp_path / "gone.pth").unlink()  # its checkpoint was deleted: the sidecar is orphaned
    strategy.save_checkpoint("b.pth")
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == [
        "b.pth",
        "b.pth.manifest.json",
        "last_checkpoint",
    ]


def test_remove_checkpoint_deletes_the_checkpoint_and_its_manifest(tmp_path):
    from shardwise.checkpoint import remove_checkpoint

    strategy = SingleDeviceStrategy(work_dir=str(tmp_path), log_kwargs=dict(log_level="WARNING"))
    strategy.prepare(torch.nn.Linear(2, 2))
    strategy.save_checkpoint("a.pth")
    remove_checkpoint(tmp_path / "a.pth")
    remove_checkpoint(tmp_path / "never_saved.pth")  # no error
    assert not (tmp_path / "a.pth").exists()
    assert not (tmp_path / "a.pth.manifest.json").exists()
