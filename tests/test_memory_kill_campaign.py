"""kill -9 of one rank, of a whole simulated node (its memory directory removed too) or of every
rank, at random points of the memory tier's snapshots and replication, then a restart with
``resume=True`` (on 4 ranks, or on the 2 ranks left after a node loss): every restart resumes
from memory, at most ``interval`` (1) step behind what every rank had reported, and goes on
bit for bit as the uninterrupted run (``tests/memory_trials.py``)."""

from __future__ import annotations

import collections
import os
import shutil

import pytest

from tests.memory_trials import outcome_dict, run_memory_trial, uninterrupted

pytestmark = pytest.mark.slow

#: the issue asked for >= 50
TRIALS = int(os.environ.get("SHARDWISE_MEMORY_KILL_TRIALS", 50))


@pytest.mark.timeout(3600)
def test_kills_at_random_points_of_snapshots_resume_from_memory_bit_for_bit(tmp_path):
    reference = uninterrupted(tmp_path / "reference", 16)
    outcomes = []
    for seed in range(TRIALS):
        outcomes.append(run_memory_trial(seed, tmp_path / "trial", reference))
        shutil.rmtree(tmp_path / "trial", ignore_errors=True)
    failed = [outcome_dict(o) for o in outcomes if o.status != "ok"]
    kinds = collections.Counter((o.kill, o.ranks) for o in outcomes)
    assert not failed, (kinds, failed[:5])
    assert {kind for kind, _ in kinds} == {"rank", "node", "all"}, kinds
    assert ("node", 2) in kinds, kinds  # a node that did not return: finished on 2 ranks
    assert {o.reported - o.resumed for o in outcomes} <= {-1, 0, 1}
