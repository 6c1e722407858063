"""The multi-process harness: results come back per rank, failures surface with tracebacks."""

import os

import pytest

from tests.distributed import DistributedTestError, run_distributed


def _rank_and_sum():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return dist.get_rank(), t.item()


def _fail_on_rank_one():
    if int(os.environ["RANK"]) == 1:
        raise ValueError("rank one is unhappy")
    return "ok"


def _hang():
    import time

    time.sleep(60)


def test_results_come_back_rank_by_rank():
    assert run_distributed(_rank_and_sum, 2, init_pg=True) == [(0, 3.0), (1, 3.0)]


def test_a_rank_exception_is_reraised_with_its_traceback():
    with pytest.raises(DistributedTestError, match="rank 1 failed(.|\n)*rank one is unhappy"):
        run_distributed(_fail_on_rank_one, 2)


def test_a_hanging_run_is_killed_at_its_timeout():
    with pytest.raises(DistributedTestError, match="gave no result within 3 s"):
        run_distributed(_hang, 2, timeout=3)
