"""shardwise.env: seeds, RNG state, multiprocessing set-up, rlimits and collect_env."""

from __future__ import annotations

import gc
import os
import random
import threading

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from shardwise import env
from tests.distributed import run_distributed


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


# --------------------------------------------------------------------------- seeds


def _seed_worker() -> dict:
    shared = env.set_random_seed(None)
    shared_draws = _draws()
    per_rank = env.set_random_seed(100, diff_rank_seed=True)
    return {"shared": shared, "shared_draws": shared_draws, "per_rank": per_rank}


@pytest.fixture(scope="module")
def two_rank_seeds() -> list[dict]:
    return run_distributed(_seed_worker, 2, init_pg=True, timeout=120)


def test_none_seed_is_drawn_once_and_shared_by_every_rank(two_rank_seeds):
    first, second = two_rank_seeds
    assert isinstance(first["shared"], int)
    assert first["shared"] == second["shared"]
    assert first["shared_draws"] == second["shared_draws"]


def test_diff_rank_seed_adds_the_rank(two_rank_seeds):
    assert [result["per_rank"] for result in two_rank_seeds] == [100, 101]


def test_same_seed_reproduces_random_numpy_and_torch_draws():
    assert env.set_random_seed(1234) == 1234
    first = _draws()
    env.set_random_seed(1234)
    assert _draws() == first


def test_none_seed_without_process_group_is_a_fresh_int():
    seed = env.set_random_seed(None)
    assert isinstance(seed, int) and 0 <= seed < 2**31


@pytest.mark.parametrize("seed, error", [("7", TypeError), (1.5, TypeError), (-1, ValueError)])
def test_bad_seed_is_rejected(seed, error):
    with pytest.raises(error, match="seed"):
        env.set_random_seed(seed)


def test_deterministic_turns_on_deterministic_algorithms(monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # so that monkeypatch restores it
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    torch.backends.cudnn.benchmark = True
    try:
        env.set_random_seed(0, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(saved[0])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[1:]


# --------------------------------------------------------------------------- RNG state


def test_restored_rng_state_reproduces_the_same_draws():
    env.set_random_seed(7)
    random.gauss(0, 1)  # leave a cached Gaussian in Python's generator
    np.random.randn()  # and in NumPy's
    state = env.capture_rng_state()
    expected = _draws(), random.gauss(0, 1), float(np.random.randn())
    _draws()
    env.restore_rng_state(state)
    assert (_draws(), random.gauss(0, 1), float(np.random.randn())) == expected


def test_rng_state_round_trips_through_weights_only_load(tmp_path):
    state = env.capture_rng_state()
    expected = _draws()
    torch.save(state, tmp_path / "rng.pt")
    loaded = torch.load(tmp_path / "rng.pt", weights_only=True)
    _draws()
    env.restore_rng_state(loaded)
    assert _draws() == expected


def test_rng_state_holds_no_numpy_objects():
    def walk(obj):
        if isinstance(obj, dict):
            for value in obj.values():
                yield from walk(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                yield from walk(value)
        else:
            yield obj

    leaves = list(walk(env.capture_rng_state()))
    assert not any(isinstance(leaf, (np.ndarray, np.generic)) for leaf in leaves)


# --------------------------------------------------------------------------- processes


@pytest.fixture
def restore_start_method():
    saved = mp.get_start_method(allow_none=True)
    yield
    mp.set_start_method(saved, force=True)


def test_multi_processing_defaults_thread_counts_when_distributed(
    monkeypatch, restore_start_method
):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # restored afterwards
    monkeypatch.setenv("MKL_NUM_THREADS", "x")
    monkeypatch.delenv("MKL_NUM_THREADS")
    env.set_multi_processing("spawn", distributed=True)
    assert mp.get_start_method() == "spawn"
    assert os.environ["OMP_NUM_THREADS"] == "3"  # an explicit setting is kept
    assert os.environ["MKL_NUM_THREADS"] == "1"


def test_multi_processing_leaves_thread_counts_alone_when_not_distributed(
    monkeypatch, restore_start_method
):
    monkeypatch.setenv("MKL_NUM_THREADS", "x")
    monkeypatch.delenv("MKL_NUM_THREADS")
    env.set_multi_processing("spawn", distributed=False)
    assert "MKL_NUM_THREADS" not in os.environ


def test_unknown_start_method_is_rejected():
    with pytest.raises(ValueError, match="'thread'"):
        env.set_multi_processing("thread")


def test_resource_limit_is_raised_but_never_above_the_hard_limit():
    resource = pytest.importorskip("resource")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert env.set_resource_limit(1) == soft  # never lowered
    if hard != resource.RLIM_INFINITY:
        assert env.set_resource_limit(hard + 1000) == hard
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)


# --------------------------------------------------------------------------- garbage collector


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_gc_paused_pauses_the_collector_until_the_outermost_block_ends(collector_on):
    with env.gc_paused():
        assert not gc.isenabled()
        with env.gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_gc_paused_leaves_a_collector_that_was_off_off(collector_on):
    gc.disable()
    with env.gc_paused():
        pass
    assert not gc.isenabled()


def test_gc_paused_blocks_in_two_threads_resume_the_collector_when_both_end(collector_on):
    entered, leave_first, first_left = (threading.Event() for _ in range(3))

    def first() -> None:
        with env.gc_paused():
            entered.set()
            leave_first.wait(10)
        first_left.set()

    thread = threading.Thread(target=first)
    thread.start()
    entered.wait(10)
    with env.gc_paused():
        leave_first.set()
        first_left.wait(10)
        assert not gc.isenabled()  # the other thread's block ended, this one has not
    thread.join()
    assert gc.isenabled()


def test_gc_paused_resumes_the_collector_when_the_block_raises(collector_on):
    with pytest.raises(KeyError), env.gc_paused():
        raise KeyError("x")
    assert gc.isenabled()


# --------------------------------------------------------------------------- collect_env


def test_collect_env_reports_platform_versions_and_backends():
    import shardwise

    info = env.collect_env()
    for key in (
        "sys.platform",
        "Python",
        "CUDA available",
        "GCC",
        "PyTorch",
        "PyTorch compiling details",
        "NumPy",
        "shardwise",
        "Distributed backends",
    ):
        assert key in info, key
    assert info["PyTorch"] == torch.__version__
    assert info["NumPy"] == np.__version__
    assert info["shardwise"] == shardwise.__version__
    assert "gloo" in info["Distributed backends"]
    assert info["CUDA available"] is torch.cuda.is_available()
    if torch.cuda.is_available():
        assert any(key.startswith("GPU ") for key in info)


def test_git_hash_is_absent_outside_a_git_checkout(tmp_path):
    (tmp_path / "__init__.py").write_text("")
    assert env._git_hash(tmp_path) is None
