"""The process environment: random seeds, RNG state, multiprocessing, rlimits, the garbage
collector, collect_env.

Example::

    from shardwise import env

    seed = env.set_random_seed(None, diff_rank_seed=True)  # drawn on rank 0, + rank
    state = env.capture_rng_state()  # plain data: torch.save / torch.load(weights_only=True)
    ...
    env.restore_rng_state(state)  # the same draws again
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import platform
import random
import secrets
import shutil
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as torch_dist

from shardwise import dist
from shardwise.tree import map_tensors

__all__ = [
    "capture_rng_state",
    "collect_env",
    "gc_paused",
    "restore_rng_state",
    "set_multi_processing",
    "set_random_seed",
    "set_resource_limit",
    "sync_random_seed",
]

logger = logging.getLogger(__name__)

_MAX_SEED = 2**32 - 1  # numpy's limit


# --------------------------------------------------------------------------- seeds


def sync_random_seed() -> int:
    """A fresh random seed drawn on rank 0 and shared by every rank."""
    seed = secrets.randbelow(2**31) if dist.get_rank() == 0 else None
    return int(dist.broadcast_object(seed, src=0))


def set_random_seed(
    seed: int | None = None, deterministic: bool = False, diff_rank_seed: bool = False
) -> int:
    """Seed ``random``, NumPy and torch (and every CUDA device); return the seed used.

    Args:
        seed: ``None`` draws one on rank 0 and broadcasts it, so all ranks agree.
        deterministic: also make torch use deterministic algorithms (cuDNN
            deterministic, no benchmark, ``CUBLAS_WORKSPACE_CONFIG`` set if unset).
        diff_rank_seed: add the global rank to the seed, so ranks draw differently.
    """
    if seed is None:
        seed = sync_random_seed()
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__} {seed!r}.")
    seed = int(seed)
    if diff_rank_seed:
        seed += dist.get_rank()
    if not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed must be in [0, 2**32 - 1] (with the rank added), got {seed}.")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if deterministic:
        if torch.backends.cudnn.benchmark:
            logger.warning(
                "deterministic=True turns torch.backends.cudnn.benchmark off so that cuDNN "
                "selects its algorithms deterministically."
            )
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    return seed


# --------------------------------------------------------------------------- RNG state


def capture_rng_state() -> dict[str, Any]:
    """The state of Python's, NumPy's, torch's CPU and (if available) CUDA generators.

    The result holds only dicts, lists, numbers, strings and tensors, so it can be
    saved with ``torch.save`` and read back with ``torch.load(..., weights_only=True)``.
    """
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "numpy": map_tensors(_to_list, np.random.get_state(legacy=False), kind=_NUMPY),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back generator states from :func:`capture_rng_state`; missing keys are skipped."""
    if "python" in state:
        py = state["python"]
        random.setstate((int(py["version"]), tuple(py["internal"]), py["gauss_next"]))
    if "numpy" in state:
        np.random.set_state(state["numpy"])
    if "torch" in state:
        torch.set_rng_state(state["torch"].to("cpu", torch.uint8))
    cuda_states = state.get("cuda")
    if cuda_states and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if len(cuda_states) != count:
            logger.warning(
                "RNG state holds %d CUDA generator(s), this process sees %d; restoring %d.",
                len(cuda_states),
                count,
                min(count, len(cuda_states)),
            )
        for index, cuda_state in enumerate(cuda_states[:count]):
            torch.cuda.set_rng_state(cuda_state.to("cpu", torch.uint8), device=index)


_NUMPY = (np.ndarray, np.generic)


def _to_list(value: np.ndarray | np.generic) -> Any:
    """A NumPy array or scalar as lists and Python numbers (``weights_only`` loads them)."""
    return value.tolist()


# --------------------------------------------------------------------------- processes


def set_multi_processing(
    mp_start_method: str = "fork",
    opencv_num_threads: int = 0,
    distributed: bool = False,
    omp_num_threads: int | None = None,
    mkl_num_threads: int | None = None,
) -> None:
    """Set the multiprocessing start method and thread counts, as mmengine does.

    Args:
        mp_start_method: start method for worker processes (not changed on Windows).
        opencv_num_threads: threads for OpenCV, if it is installed (0: no threading).
        distributed: when true, ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` default to
            1 unless already set, so that ranks do not oversubscribe the cores.
        omp_num_threads, mkl_num_threads: explicit values for those variables.
    """
    import torch.multiprocessing as mp

    if platform.system() != "Windows":
        if mp_start_method not in mp.get_all_start_methods():
            raise ValueError(
                f"Unknown mp_start_method {mp_start_method!r}; this platform supports "
                f"{mp.get_all_start_methods()}."
            )
        current = mp.get_start_method(allow_none=True)
        if current != mp_start_method:
            if current is not None:
                logger.warning(
                    "Multiprocessing start method was %r; setting it to %r (mp_start_method).",
                    current,
                    mp_start_method,
                )
            mp.set_start_method(mp_start_method, force=True)
    try:
        import cv2
    except ImportError:
        pass
    else:
        cv2.setNumThreads(opencv_num_threads)
    for var, value in (("OMP_NUM_THREADS", omp_num_threads), ("MKL_NUM_THREADS", mkl_num_threads)):
        if value is None and distributed and var not in os.environ:
            value = 1
            logger.info(
                "Setting %s=1 for each process so that ranks do not overload the machine; "
                "tune it for your application.",
                var,
            )
        if value is not None:
            os.environ[var] = str(value)


_gc_lock = threading.Lock()
_gc_pauses = 0  # blocks inside gc_paused, in every thread
_gc_resume = False  # whether the collector was enabled when the first of them began


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the block (reference counting still frees
    what it frees). A checkpoint save or load makes enough container objects to set off a
    full collection now and then, and in a training process that walks every object torch,
    the model and the optimizer keep: 0.12-0.17 s with the 100M GPT of bench/ (380k objects,
    2 cores), three times what an asynchronous save of it blocks training for. Blocks may
    nest and run in several threads at once; the collector runs again when the last one
    ends, if it ran before the first. Also a decorator (``@gc_paused()``).

    Example::

        with gc_paused():
            strategy.resume(path)
    """
    global _gc_pauses, _gc_resume
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_resume = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_resume:
                gc.enable()


def set_resource_limit(nofile: int = 4096) -> int | None:
    """Raise the soft limit on open files towards ``nofile``, never above the hard limit.

    Never lowers it. Returns the soft limit now in force (``None`` where the
    ``resource`` module does not exist, e.g. Windows).
    """
    try:
        import resource
    except ImportError:
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = nofile if hard == resource.RLIM_INFINITY else min(nofile, hard)
    if soft != resource.RLIM_INFINITY and target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        logger.info("Raised the open-file limit (RLIMIT_NOFILE) from %d to %d.", soft, target)
        return target
    return soft


# --------------------------------------------------------------------------- collect_env


def collect_env() -> dict[str, Any]:
    """Describe the machine and software, for logs and bug reports.

    Keys: ``sys.platform``, ``Python``, ``CUDA available``, ``GPU <ids>`` (one per
    device model), ``CUDA_HOME`` and ``NVCC`` (when found), ``GCC``, ``PyTorch``,
    ``PyTorch compiling details``, ``NumPy``, ``shardwise``, ``shardwise git hash``
    (in a git checkout), ``Distributed backends``.
    """
    import shardwise

    info: dict[str, Any] = {
        "sys.platform": sys.platform,
        "Python": sys.version.replace("\n", ""),
        "CUDA available": torch.cuda.is_available(),
    }
    if info["CUDA available"]:
        devices: dict[str, list[str]] = defaultdict(list)
        for index in range(torch.cuda.device_count()):
            devices[torch.cuda.get_device_name(index)].append(str(index))
        for name, ids in devices.items():
            info[f"GPU {','.join(ids)}"] = name
    cuda_home, nvcc = _find_nvcc()
    if cuda_home is not None:
        info["CUDA_HOME"] = cuda_home
    if nvcc is not None:
        info["NVCC"] = nvcc
    gcc = _first_line(["gcc", "--version"])
    info["GCC"] = gcc if gcc is not None else "n/a"
    info["PyTorch"] = torch.__version__
    info["PyTorch compiling details"] = torch.__config__.show()
    info["NumPy"] = np.__version__
    info["shardwise"] = shardwise.__version__
    git_hash = _git_hash(Path(shardwise.__file__).resolve().parent)
    if git_hash is not None:
        info["shardwise git hash"] = git_hash
    info["Distributed backends"] = ", ".join(_dist_backends()) or "none"
    return info


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    """stdout of ``cmd``, or ``None`` if it is missing, fails or hangs."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _first_line(cmd: list[str]) -> str | None:
    out = _run(cmd)
    return out.strip().splitlines()[0].strip() if out and out.strip() else None


def _find_nvcc() -> tuple[str | None, str | None]:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc_path = None
    if cuda_home and Path(cuda_home, "bin", "nvcc").is_file():
        nvcc_path = str(Path(cuda_home, "bin", "nvcc"))
    else:
        nvcc_path = shutil.which("nvcc")
        if nvcc_path is not None and not cuda_home:
            cuda_home = str(Path(nvcc_path).resolve().parent.parent)
    if nvcc_path is None:
        return cuda_home, None
    out = _run([nvcc_path, "-V"])
    if out is None:
        return cuda_home, "Not Available"
    release = [line for line in out.splitlines() if "release" in line]
    return cuda_home, (release[-1].strip() if release else out.strip().splitlines()[-1])


def _git_hash(package_dir: Path) -> str | None:
    """Short HEAD hash when ``package_dir`` is tracked in a git checkout."""
    if shutil.which("git") is None:
        return None
    if _run(["git", "ls-files", "--error-unmatch", "__init__.py"], cwd=package_dir) is None:
        return None
    out = _run(["git", "rev-parse", "--short", "HEAD"], cwd=package_dir)
    return out.strip() if out and out.strip() else None


def _dist_backends() -> list[str]:
    if not torch_dist.is_available():
        return []
    checks = {
        "gloo": torch_dist.is_gloo_available,
        "nccl": torch_dist.is_nccl_available,
        "mpi": torch_dist.is_mpi_available,
        "ucc": getattr(torch_dist, "is_ucc_available", lambda: False),
        "xccl": getattr(torch_dist, "is_xccl_available", lambda: False),
    }
    return [name for name, check in checks.items() if check()]
