"""kill -9 of every process of a real ``shardwise train`` run at a random moment, then
``--resume``: no corrupt resume, no hang (a few trials of the campaign in
``tests/kill_campaign.py``; ``bench/kill_campaign.py`` runs all of them)."""

from __future__ import annotations

import pytest

from tests.kill_campaign import plan, run_trial

pytestmark = pytest.mark.slow


# sync and async, full and sharded, 1 and 2 ranks, each twice
CI_TRIALS = [plan(8)[i] for i in (0, 3, 5, 6)]


@pytest.mark.parametrize("trial", CI_TRIALS, ids=lambda t: f"{t.mode}-{t.fmt}-{t.ranks}rank")
def test_a_run_killed_at_a_random_moment_resumes_from_a_committed_checkpoint(tmp_path, trial):
    outcome = run_trial(trial, tmp_path)
    assert outcome.status == "ok", outcome.as_dict()
    assert outcome.killed >= trial.ranks, outcome.as_dict()  # every process, by pid
    assert outcome.resumed_from is not None
