"""Two Runners one after the other in this process, as a notebook or a sweep runs them: an
OpenMMLab-style one (the stand-in package ``fakemm``, its default scope, mmengine's logger,
checkpoints to an ``out_dir`` URL with ``backend_args``), its work dir then deleted, and a plain
one. Prints, as JSON, the process's globals before, after the first, inside the second (from a
hook) and after it: ``python tests/two_runners.py TMP_DIR``. The first also validates after
training (``val()`` after ``train()``: its globals set again, then put back)."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "fake_openmmlab")]

from shardwise.checkpoint.storage import storage_options  # noqa: E402
from shardwise.config import Config  # noqa: E402
from shardwise.registry import DefaultScope  # noqa: E402
from shardwise.runner import Hook, Runner  # noqa: E402
from shardwise.visualization import Visualizer  # noqa: E402

OUT_DIR = "memory://two-runners/ckpts"

FIRST = """
default_scope = 'fakemm'
model = dict(type='TinyClassifier')
train_dataloader = dict(
    batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='Blobs', n=16, pipeline=[dict(type='Jitter'), dict(type='Pack')]))
val_dataloader = dict(
    batch_size=4, num_workers=0, sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='Blobs', n=8, pipeline=[dict(type='Pack')]))
val_evaluator = dict(type='Accuracy')
val_cfg = dict()
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.1))
train_cfg = dict(by_epoch=False, max_iters=4, val_interval=2)
default_hooks = dict(checkpoint=dict(
    type='CheckpointHook', by_epoch=False, interval=2, out_dir='OUT_DIR',
    backend_args=dict(skip_instance_cache=True)))
randomness = dict(seed=0)
""".replace("OUT_DIR", OUT_DIR)

SECOND = """
custom_imports = dict(imports=['tests.test_runner_support'])
model = dict(type='DropoutRegressor')
train_dataloader = dict(dataset=dict(type='RegressionData', n=16), batch_size=4)
optim_wrapper = dict(optimizer=dict(type='AdamW', lr=0.01))
train_cfg = dict(by_epoch=False, max_iters=2)
randomness = dict(seed=0)
"""


def _files(logger: logging.Logger) -> list[str]:
    return sorted(getattr(h, "baseFilename", type(h).__name__) for h in logger.handlers)


def globals_now() -> dict:
    """What a run could leave behind in the process."""
    state = {
        "shardwise_scope": [s.scope_name for s in DefaultScope._instance_dict.values()],
        "shardwise_log_files": [
            h.baseFilename
            for h in logging.getLogger("shardwise").handlers
            if isinstance(h, logging.FileHandler)
        ],
        "root_logger": _files(logging.getLogger()),
        "storage_options": storage_options(f"{OUT_DIR}/x"),
        "visualizers": sorted(Visualizer._instances),
    }
    if "mmengine" in sys.modules:
        from mmengine.logging import MMLogger
        from mmengine.registry import DefaultScope as MMEngineScope

        current = MMLogger.get_current_instance()  # creates mmengine's own on first use
        state["mmengine_current_logger"] = [current.instance_name, *_files(current)]
        state["mmengine_scope"] = [s.scope_name for s in MMEngineScope._instance_dict.values()]
        state["mmengine_loggers"] = {
            name: _files(logger) for name, logger in MMLogger._instance_dict.items()
        }
    return state


class Observe(Hook):
    """Records the globals as the second run sees them, before its first iteration (into the
    class: ``Runner.from_cfg`` deep-copies the config and the hook with it)."""

    seen: dict = {}

    def before_train(self, runner) -> None:
        Observe.seen.update(globals_now())


def main(tmp: Path) -> None:
    import mmengine  # noqa: F401 - as in a process that uses OpenMMLab before any run

    report = {"before": globals_now()}
    first = tmp / "first.py"
    first.write_text(FIRST)
    cfg = Config.fromfile(first)
    cfg.work_dir = str(tmp / "first")
    runner = Runner.from_cfg(cfg)
    runner.train()
    report["between_stages"] = globals_now()
    report["val_after_train"] = runner.val()  # the run's scopes and logger set again
    report["first_log_dir"] = runner.log_dir
    report["after_first"] = globals_now()
    del runner
    shutil.rmtree(tmp / "first")

    second = tmp / "second.py"
    second.write_text(SECOND)
    cfg = Config.fromfile(second)
    cfg.work_dir = str(tmp / "second")
    cfg.custom_hooks = [Observe()]
    runner = Runner.from_cfg(cfg)
    runner.train()
    from mmengine.logging import MMLogger

    MMLogger.get_current_instance().warning("a message of mmengine's after both runs")
    report["inside_second"] = Observe.seen
    report["after_second"] = globals_now()
    print("REPORT " + json.dumps(report))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
