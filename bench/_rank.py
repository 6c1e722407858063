"""One rank of a bench: ``python bench/_rank.py MODULE:FUNC KWARGS_JSON OUT_JSON THREADS``.

Started by :func:`_common.run_ranks` with torchrun's environment variables; calls
``FUNC(**KWARGS)`` from ``bench/MODULE.py`` and writes what it returns as JSON.
"""

import importlib
import json
import os
import sys
from pathlib import Path


def main() -> None:
    target, kwargs, out, threads = sys.argv[1:5]
    bench = Path(__file__).resolve().parent
    for path in (str(bench.parent / "src"), str(bench)):
        if path not in sys.path:
            sys.path.insert(0, path)
    import torch

    torch.set_num_threads(int(threads))
    module_name, func_name = target.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    result = func(**json.loads(kwargs))
    Path(out).write_text(json.dumps(result, default=str))
    # The result is out: leave without tearing down the process group. gloo's teardown now
    # and then aborts a rank after its work is done ("terminate called without an active
    # exception", seen once in ~10 runs of checkpoint_engine), which would lose the result.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
