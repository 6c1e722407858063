"""The kill -9 campaign (``tests/kill_campaign.py``) at full length; its figures go to
``bench/kill_campaign.json`` and section 7 of ``bench/RESULTS.md``.

    python bench/kill_campaign.py               # 56 trials, ~15 minutes on 2 cores
    python bench/kill_campaign.py --trials 8    # one of each kind
    python bench/kill_campaign.py --async-trials 200  # asynchronous sharded saves only

Not part of ``make bench`` (its 10 minutes go to the timed benches); ``run_all.py`` renders
the figures of the last campaign into every RESULTS.md, with the date they were taken.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(REPO), str(REPO / "src"), str(BENCH)]

from _common import machine_info  # noqa: E402

from tests.async_kill import async_summary, run_async_trial  # noqa: E402
from tests.kill_campaign import MAX_ITERS, plan, run_trial, summary  # noqa: E402

RESULTS = BENCH / "kill_campaign.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=56)
    parser.add_argument("--seed", type=int, default=20261125)
    parser.add_argument(
        "--async-trials",
        type=int,
        default=0,
        help="run only the campaign against asynchronous sharded saves (tests/async_kill.py) "
        "with this many trials, kept beside the last full campaign's figures",
    )
    args = parser.parse_args()
    if args.async_trials:
        run_async_campaign(args.async_trials, args.seed)
        return
    machine = machine_info()
    outcomes = []
    start = time.perf_counter()
    for i, trial in enumerate(plan(args.trials, args.seed)):
        root = Path(tempfile.mkdtemp(prefix="shardwise-kill-"))
        try:
            outcome = run_trial(trial, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        outcomes.append(outcome)
        print(
            f"[{i + 1}/{args.trials}] {trial.mode} {trial.fmt} {trial.ranks} rank(s), kill at "
            f"+{trial.delay:.2f} s: {outcome.status} (resumed from iteration "
            f"{outcome.resumed_from}, mid-save {outcome.mid_save}) {outcome.reason}",
            flush=True,
        )
    result = dict(
        status="ok",
        machine=machine,
        seed=args.seed,
        max_iters=MAX_ITERS,
        wall_s=round(time.perf_counter() - start, 1),
        summary=summary(outcomes),
        outcomes=[o.as_dict() for o in outcomes],
    )
    if RESULTS.exists() and "async" in json.loads(RESULTS.read_text()):
        result["async"] = json.loads(RESULTS.read_text())["async"]
    RESULTS.write_text(json.dumps(result, indent=1))
    subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--render-only"], check=True)
    print(json.dumps(result["summary"], indent=1))


def run_async_campaign(trials: int, seed: int) -> None:
    """``trials`` kills of a loop of asynchronous sharded saves (tests/async_kill.py), into
    the ``async`` entry of kill_campaign.json."""
    start, outcomes = time.perf_counter(), []
    machine = machine_info()
    for i in range(trials):
        root = Path(tempfile.mkdtemp(prefix="shardwise-async-kill-"))
        try:
            outcome = run_async_trial(seed + i, root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        outcomes.append(outcome)
        print(
            f"[{i + 1}/{trials}] killed {outcome.delay * 1000:.0f} ms after save {outcome.after} "
            f"was reported: {outcome.status}, last reported {outcome.reported}, resumes from "
            f"{outcome.resumed} {outcome.reason}",
            flush=True,
        )
    result = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"status": "ok"}
    result["async"] = dict(
        machine=machine,
        seed=seed,
        wall_s=round(time.perf_counter() - start, 1),
        summary=async_summary(outcomes),
        outcomes=[o.as_dict() for o in outcomes if o.status != "ok"],
    )
    RESULTS.write_text(json.dumps(result, indent=1))
    subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--render-only"], check=True)
    print(json.dumps(result["async"]["summary"], indent=1))


if __name__ == "__main__":
    main()
