"""The kill -9 campaign (``tests/kill_campaign.py``) at full length; its figures go to
``bench/kill_campaign.json`` and section 7 of ``bench/RESULTS.md``.

    python bench/kill_campaign.py               # 56 trials, ~15 minutes on 2 cores
    python bench/kill_campaign.py --trials 8    # one of each kind

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

from tests.kill_campaign import MAX_ITERS, plan, run_trial, summary  # noqa: E402

RESULTS = BENCH / "kill_campaign.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=56)
    parser.add_argument("--seed", type=int, default=20261125)
    args = parser.parse_args()
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
    RESULTS.write_text(json.dumps(result, indent=1))
    subprocess.run([sys.executable, str(BENCH / "run_all.py"), "--render-only"], check=True)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
