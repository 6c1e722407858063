import os

# Tests are CPU-only and must not oversubscribe the machine's cores across ranks.
os.environ.setdefault("OMP_NUM_THREADS", "1")
