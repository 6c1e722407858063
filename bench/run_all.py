"""Run every bench and write ``bench/RESULTS.md`` and ``bench/results.json``.

    python bench/run_all.py --quick        # `make bench`: must finish within 10 minutes
    python bench/run_all.py --full         # adds the 1B-parameter sizes
    python bench/run_all.py --only overhead,scale
    python bench/run_all.py --full --only small_save --merge   # re-run one section only

Each section runs as its own subprocess (``bench/<section>.py``), so that one section's
failure or time-out is recorded in RESULTS.md and the others still run. Every figure is
written next to its baseline from the same run, and the machine it came from.

RESULTS.md is rendered from the JSON alone (``--render-only`` re-renders results.json): each
section by ``write(rep, res)`` in ``bench/render/<section>.py``, into the one report writer of
``bench/_report.py``; :func:`render` adds the machine, the misses and the failures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _common import DEADLINE_ENV, machine_info  # noqa: E402
from _report import Report  # noqa: E402
from render import WRITERS  # noqa: E402

# name -> (seconds reserved for it in --quick, time limit in seconds for --full)
SECTIONS: dict[str, tuple[int, int]] = {
    "overhead": (80, 1500),
    "peer_lightning": (40, 1200),
    "checkpoint_io": (70, 1800),
    "checkpoint_engine": (115, 1800),
    "scale": (200, 5400),
    "meta_init": (15, 900),
    "planning": (30, 600),
    "planning_sim": (35, 3600),
    "small_save": (0, 900),
    "pipeline": (60, 900),
    "fault_tolerance": (130, 1200),
    "gpu": (5, 1800),
    "cli_startup": (0, 900),
    "convert": (0, 600),
    "object_storage": (0, 1800),
    "openmmlab": (0, 1800),
    "memory_checkpoint": (0, 2400),
    "object_faults": (0, 1200),
}
#: Sections `--quick` leaves out unless named with --only: bench/cli_startup.py spawns ~50
#: fresh interpreters that import torch (about a minute on 2 cores), bench/small_save.py
#: starts 2 and 4 ranks several times (~2-3 minutes), bench/memory_checkpoint.py trains on
#: both cores for ~10 minutes, bench/object_faults.py uploads 1 GiB 6 times: too much of the
#: budget.
FULL_ONLY = (
    "cli_startup",
    "small_save",
    "convert",
    "object_storage",
    "openmmlab",
    "memory_checkpoint",
    "object_faults",
)
#: `make bench` must finish within 10 minutes on the 2-core machine. A section may run until
#: the budget's end less the time reserved for the sections after it (so a section's leftover
#: goes to the later ones), and skips, saying so, what does not fit: that happens when other
#: work shares the machine.
QUICK_BUDGET_S = 560
GRACE_S = 20


def _run(cmd: list[str], limit: float, env: dict[str, str] | None = None):
    """``subprocess.run`` in a session of its own: at ``limit`` seconds the whole process
    group (the section and the ranks it started) is killed, not just the section."""
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=BENCH.parent,
        env=env,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_section(name: str, quick: bool, limit: float, deadline: float | None) -> dict[str, Any]:
    """Run ``bench/<name>.py`` in a subprocess; ``deadline`` (epoch seconds) is when it should
    stop starting new cases, ``limit`` when it is killed."""
    if name == "meta_init":
        return run_meta_init(limit, quick)
    out = BENCH / f".{name}.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(BENCH / f"{name}.py"), "--quick" if quick else "--full"]
    cmd += ["--out", str(out)]
    env = dict(os.environ)
    if deadline is not None:
        env[DEADLINE_ENV] = str(deadline)
    start = time.perf_counter()
    try:
        proc = _run(cmd, limit, env)
    except subprocess.TimeoutExpired:
        error = f"stopped after {limit:.0f} s (the run's time budget)"
        return {"section": name, "status": "error", "error": error}
    wall = time.perf_counter() - start
    if out.exists():
        result = json.loads(out.read_text())
        out.unlink()
    else:
        result = {"status": "error", "error": f"exit {proc.returncode}\n{proc.stderr[-4000:]}"}
    result.setdefault("wall_s", round(wall, 1))
    result["section"] = name
    return result


def run_meta_init(limit: float, quick: bool) -> dict[str, Any]:
    """``bench/meta_init.py`` (written beside these benches), when it exists: its table and
    its JSON line. Quick mode skips its FSDP contender (minutes on 2 cores: it materialises
    and initialises 1B parameters on 2 ranks)."""
    script = BENCH / "meta_init.py"
    if not script.exists():
        reason = "no bench/meta_init.py"
        return {"section": "meta_init", "status": "not available", "reason": reason}
    start = time.perf_counter()
    args = ["--skip-fsdp"] if quick else []
    try:
        proc = _run([sys.executable, str(script), *args], limit)
    except subprocess.TimeoutExpired:
        error = f"stopped after {limit:.0f} s (the run's time budget)"
        return {"section": "meta_init", "status": "error", "error": error}
    lines = proc.stdout.strip().splitlines()
    record = None
    if lines and lines[-1].startswith("{"):
        try:
            record = json.loads(lines[-1])
            lines = lines[:-1]
        except json.JSONDecodeError:
            pass
    status = "ok" if proc.returncode == 0 else "error"
    return {
        "section": "meta_init",
        "status": status,
        "error": None if status == "ok" else proc.stderr[-4000:],
        "text": "\n".join(lines).strip(),
        "args": args,
        "record": record,
        "wall_s": round(time.perf_counter() - start, 1),
    }


def render(results: dict[str, Any], quick: bool, wall: float) -> str:
    campaign = BENCH / "kill_campaign.json"
    if campaign.exists():  # taken by bench/kill_campaign.py, not by this run
        results = {**results, "sections": {**results["sections"]}}
        results["sections"].setdefault("kill_campaign", json.loads(campaign.read_text()))
    rep = Report(results["sections"])
    m = results["machine"]
    rep.add(
        "# shardwise benchmarks",
        "",
        f"Generated by `{'make bench' if quick else 'python bench/run_all.py --full'}` "
        f"(`bench/run_all.py {'--quick' if quick else '--full'}`) on {m['date']}, in "
        f"{wall:.0f} s. Every figure stands next to its baseline measured in the same run, on "
        "this machine; ratios are shardwise / baseline (below 1: shardwise is faster). Raw "
        "data: `bench/results.json`.",
        "",
        "## Machine",
        "",
    )
    rep.table(
        [
            "CPU",
            "cores",
            "RAM",
            "torch",
            "Python",
            "Lightning",
            "OS",
            "bench disk",
            "load avg (start → end)",
        ],
        [
            [
                m["cpu"],
                f"{m['cores']} ({m['cores_usable']} usable)",
                f"{m['ram_gib']} GiB",
                m["torch"],
                m["python"],
                str(m.get("lightning")),
                m["os"],
                str(m.get("bench_disk")),
                f"{m['loadavg_at_start']} → {results.get('loadavg_at_end')}",
            ]
        ],
    )
    rep.add(
        "The machine is shared (other processes may run beside the benches; the load average "
        "says how busy it was), hence interleaved contenders, paired ratios and best-of-N I/O.",
        "",
    )
    sections = results["sections"]
    for name, writer in WRITERS.items():
        if name in sections:
            try:
                writer(rep, sections[name])
            except Exception as exc:  # noqa: BLE001 - a rendering bug must not lose the rest
                rep.add(f"(could not render {name}: {type(exc).__name__}: {exc})", "")
                rep.problems.append(f"{name}: rendering failed: {exc}")
    rep.add("## Figures that miss their target, and the measured reason", "")
    if rep.misses:
        rep.add(*(f"- {m}" for m in rep.misses), "")
    else:
        rep.add("None: every figure with a target meets it.", "")
    rep.add("## Not run, not available, or failed", "")
    rep.add(*(f"- {p}" for p in rep.problems) if rep.problems else ("Nothing.",), "")
    timings = ", ".join(
        f"{k} {v.get('wall_s', '?')} s" for k, v in sections.items() if k != "kill_campaign"
    )
    rep.add(f"Section wall times: {timings}.", "")
    return "\n".join(rep.lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the `make bench` sizes (default)")
    mode.add_argument("--full", action="store_true", help="adds the 1B-parameter sizes")
    parser.add_argument("--only", help="comma-separated sections (default: all)")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="rewrite RESULTS.md from the figures in results.json (no bench runs)",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --only: put the sections run into the existing results.json in place of "
        "their previous figures (the other sections, the machine and the run's wall time "
        "stay), then re-render RESULTS.md",
    )
    args = parser.parse_args()
    if args.merge and not args.only:
        parser.error("--merge needs --only SECTION[,SECTION...]: the sections to re-run")
    if args.render_only:
        results = json.loads((BENCH / "results.json").read_text())
        text = render(results, results["mode"] == "quick", results["wall_s"])
        (BENCH / "RESULTS.md").write_text(text)
        return
    quick = not args.full
    names = args.only.split(",") if args.only else list(SECTIONS)
    if quick and not args.only:
        names = [name for name in names if name not in FULL_ONLY]
    start = time.perf_counter()
    results: dict[str, Any] = {"mode": "quick" if quick else "full", "machine": machine_info()}
    results["sections"] = {}
    end = time.time() + QUICK_BUDGET_S
    for i, name in enumerate(names):
        if quick:
            deadline = end - sum(SECTIONS[n][0] for n in names[i + 1 :])
            limit = max(deadline - time.time(), 1) + GRACE_S * (name != "meta_init")
        else:
            deadline, limit = None, SECTIONS[name][1]
        print(f"[bench] {name} (limit {limit:.0f} s) ...", flush=True)
        result = run_section(name, quick, limit, deadline)
        results["sections"][name] = result
        print(f"[bench] {name}: {result.get('status')} in {result.get('wall_s')} s", flush=True)
    if args.merge:  # read again now: another section may have been merged meanwhile
        merged = json.loads((BENCH / "results.json").read_text())
        merged["sections"].update(results["sections"])
        (BENCH / "results.json").write_text(json.dumps(merged, indent=1, default=str))
        text = render(merged, merged["mode"] == "quick", merged["wall_s"])
        (BENCH / "RESULTS.md").write_text(text)
        print(f"[bench] merged {', '.join(names)} into bench/results.json", flush=True)
        return
    results["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    wall = time.perf_counter() - start
    results["wall_s"] = round(wall, 1)
    (BENCH / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (BENCH / "RESULTS.md").write_text(render(results, quick, wall))
    print(f"[bench] wrote bench/RESULTS.md and bench/results.json in {wall:.0f} s", flush=True)


if __name__ == "__main__":
    main()
