import os

# Tests are CPU-only and must not oversubscribe the machine's cores across ranks.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def no_process_group_left_behind():
    """A test that starts a process group in this process (an FSDPStrategy without a
    launcher starts a 1-rank one) destroys it, so that later tests see a single process."""
    import torch.distributed as torch_dist

    before = torch_dist.is_available() and torch_dist.is_initialized()
    yield
    if not before and torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()
