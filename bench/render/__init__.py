"""One module per section of ``bench/RESULTS.md``: ``write(rep, res)`` renders the JSON that
``bench/<section>.py`` returned (``res``) into the shared :class:`_report.Report` (``rep``),
adding the figures that miss their target to ``rep.misses``.

:data:`WRITERS` is the order RESULTS.md shows them in. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from _report import Report

from . import (
    checkpoint_engine,
    checkpoint_io,
    cli_startup,
    convert,
    fault_tolerance,
    gpu,
    kill_campaign,
    memory_checkpoint,
    meta_init,
    object_faults,
    object_storage,
    openmmlab,
    overhead,
    peer_lightning,
    pipeline,
    planning,
    planning_sim,
    scale,
    small_save,
)

#: section name -> its writer, in the order of RESULTS.md
WRITERS: dict[str, Callable[[Report, dict[str, Any]], None]] = {
    "overhead": overhead.write,
    "peer_lightning": peer_lightning.write,
    "checkpoint_io": checkpoint_io.write,
    "checkpoint_engine": checkpoint_engine.write,
    "scale": scale.write,
    "meta_init": meta_init.write,
    "gpu": gpu.write,
    "kill_campaign": kill_campaign.write,
    "planning": planning.write,
    "planning_sim": planning_sim.write,
    "small_save": small_save.write,
    "cli_startup": cli_startup.write,
    "fault_tolerance": fault_tolerance.write,
    "pipeline": pipeline.write,
    "convert": convert.write,
    "object_storage": object_storage.write,
    "openmmlab": openmmlab.write,
    "memory_checkpoint": memory_checkpoint.write,
    "object_faults": object_faults.write,
}
