"""torchrun entry of tests/test_integration_mmengine.py: the FlexibleRunner scenario of
tests/mmengine_support.py on every rank.

Usage: torchrun --nproc-per-node 2 tests/mmengine_train.py CONFIG ROOT
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `tests` as a package

from tests.mmengine_support import run_scenario  # noqa: E402

if __name__ == "__main__":
    run_scenario(sys.argv[1], Path(sys.argv[2]))
