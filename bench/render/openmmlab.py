"""Section 14 of RESULTS.md: an OpenMMLab config, shardwise train against mmengine's
Runner (bench/openmmlab.py)."""

from __future__ import annotations

from typing import Any

from _report import Report, _r, _s


def write(rep: Report, res: dict[str, Any]) -> None:
    rep.add("## 14. An OpenMMLab config: shardwise train against mmengine's Runner", "")
    if rep.section_failed("openmmlab", res):
        return
    m, c, one = res["machine"], res["config"], res["one_process"]
    rep.add(
        f"`python bench/run_all.py{' --full' * (res.get('mode') == 'full')} --only openmmlab "
        f"--merge` (bench/openmmlab.py; "
        f"{m['date']}, load {m['loadavg_at_start'][0]} -> {res['loadavg_at_end'][0]}): the "
        f"child of the corpus's `{c['base']}` (ResNet-18, mmpretrain 1.2.0 on mmcv-lite 2.2.0) "
        f"on {c['images']} generated 32-pixel images, batch {c['batch']}, {c['num_workers']} "
        f"data workers, {c['epochs']} epochs of {c['steps_per_epoch']} steps, one intra-op "
        "thread; `shardwise train CONFIG` and mmengine's `Runner.from_cfg(cfg).train()` in "
        "fresh processes launched alternately, a step being the time between two iterations' "
        "ends as a hook sees them; the ratio is the median over side-by-side pairs of "
        f"launches ({len(one['launches'])} launches a side); both compute the same losses "
        f"({one['same_losses']}).",
        "",
    )
    rep.table(
        ["case", "shardwise step", "mmengine step", "ratio (range over pairs)", "CPU ratio"],
        [
            [
                "one process",
                _s(one["shardwise_step_s"]),
                _s(one["mmengine_step_s"]),
                f"**{_r(one['ratio'])}** ({_r(one['ratio_range'][0])}-{_r(one['ratio_range'][1])})",
                f"{_r(one['cpu_ratio'])}",
            ],
            [
                "FSDP, 2 processes",
                _s(res["fsdp2"]["shardwise_step_s"]),
                "-",
                res["fsdp2"].get("mmengine_flexible_fsdp", "-"),
                "-",
            ],
        ],
    )
    rep.add(
        "mmengine's FlexibleRunner with its own FSDPStrategy does not start on a CPU-only "
        "torch (its `init_dist` calls `torch.cuda.set_device`), so FSDP-2 has no mmengine "
        "figure here; shardwise's FSDP-2 step is given alone.",
        "",
    )
    if not one["met"]:
        rep.misses.append(
            f"openmmlab one process: shardwise train / mmengine Runner = {_r(one['ratio'])} "
            f"(target {one['target']}; CPU ratio {_r(one['cpu_ratio'])}; section 14)"
        )
