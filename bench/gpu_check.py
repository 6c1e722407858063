"""``make gpu-check``: the CUDA path proven on one GPU, in one command, into one file.

Runs (1) the test cases marked ``gpu`` (``pytest -m gpu tests/test_gpu.py``), each case's
outcome recorded as it ends, then (2) ``bench/gpu.py`` (MFU of the ~1B GPT against the raw
``fully_shard`` loop, async against sync save blocking, peak GPU memory against the raw loop's),
and writes everything to one JSON file (default ``bench/gpu_check_results.json``) with its
Markdown rendering beside it (``.md``) and pytest's output (``.pytest.log``). Exit status 0 when
every case passed and the bench produced its figures; the targets are reported, not enforced.
It installs nothing: shardwise comes from ``src/`` (``PYTHONPATH``), torch and pytest are the
machine's own. It fits in 8 minutes on one H100 (each part has its own time limit).

``SHARDWISE_GPU_CHECK_ON_CPU=1`` runs the same script on a machine without CUDA as a dry run:
the ``gpu`` cases on the CPU (gloo), the bench at a toy size, results marked ``dry_run`` (not
figures); CI runs it (``tests/test_gpu_check_dry_run.py``) so that it cannot rot.

On the device machine (no network; its ``python3`` holds CUDA torch 2.11, pytest and
pytest-timeout; see /work/.library/device/KINDS.md), the next session with a GPU runs, from the
repository root, with nothing to carry::

    run(command="PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out $OUT/gpu_check_results.json",
        timeout_s=480)

then, here, copies the three files it brings back into ``bench/``, renders them into
``bench/RESULTS.md`` and commits::

    cp <files_at>/gpu_check_results.* bench/
    .venv/bin/python bench/gpu_check.py --render-into bench/RESULTS.md \\
        --results bench/gpu_check_results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
ON_CPU = "SHARDWISE_GPU_CHECK_ON_CPU"
RECORD = "SHARDWISE_GPU_CHECK_RECORD"  # where the pytest plugin below appends each outcome
SECTION = "## 6. GPU (bench/gpu.py)"
#: Seconds each part may take (the whole check must fit in 8 minutes on one GPU).
TESTS_LIMIT_S = float(os.environ.get("SHARDWISE_GPU_CHECK_TESTS_LIMIT_S", 240))
BENCH_LIMIT_S = float(os.environ.get("SHARDWISE_GPU_CHECK_BENCH_LIMIT_S", 210))


# ----------------------------------------------------------------------------- pytest plugin
def pytest_runtest_logreport(report: Any) -> None:
    """(``-p gpu_check``) one JSON line per test phase, written as it ends: a case that hangs
    and is killed with the whole run still leaves the outcomes of those before it."""
    path = os.environ.get(RECORD)
    if not path or (report.when != "call" and report.outcome == "passed"):
        return
    reason = None
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2]
    elif report.failed:
        reason = str(report.longrepr)[-3000:]
    line = dict(
        case=report.nodeid.split("::", 1)[-1],
        when=report.when,
        outcome=report.outcome,
        seconds=round(report.duration, 2),
        reason=reason,
    )
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _cases(record: Path) -> list[dict[str, Any]]:
    """One entry per case: failed if any phase failed, skipped if skipped, else passed."""
    cases: dict[str, dict[str, Any]] = {}
    lines = record.read_text().splitlines() if record.exists() else []
    for entry in map(json.loads, lines):
        case = cases.setdefault(
            entry["case"], dict(case=entry["case"], outcome="passed", seconds=0.0, reason=None)
        )
        case["seconds"] = round(case["seconds"] + entry["seconds"], 2)
        if entry["outcome"] == "failed" or (
            entry["outcome"] == "skipped" and case["outcome"] == "passed"
        ):
            case["outcome"], case["reason"] = entry["outcome"], entry["reason"]
    return list(cases.values())


# ----------------------------------------------------------------------------- the two parts
def _env() -> dict[str, str]:
    path = [str(REPO / "src"), str(REPO), str(BENCH), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def _run(cmd: list[str], limit_s: float, **kwargs: Any) -> tuple[int | None, str]:
    """``cmd`` in a process session of its own; past ``limit_s`` the whole session (its
    ranks and subprocesses too) is killed. Returns ``(returncode or None, stderr)``."""
    proc = subprocess.Popen(
        cmd, start_new_session=True, stderr=subprocess.PIPE, text=True, **kwargs
    )
    try:
        _, err = proc.communicate(timeout=limit_s)
        return proc.returncode, err or ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, ""


def run_tests(log: Path, limit_s: float) -> dict[str, Any]:
    """``pytest -m gpu tests/test_gpu.py``: every case's outcome, the summary, the log."""
    record = Path(tempfile.mkstemp(prefix="gpu_check_cases_", suffix=".jsonl")[1])
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "tests/test_gpu.py",
        "-m",
        "gpu",
        "-p",
        "gpu_check",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rA",
        "--timeout=240",
    ]
    start = time.perf_counter()
    with open(log, "w") as out:
        returncode, _ = _run(
            cmd, limit_s, cwd=REPO, env={**_env(), RECORD: str(record)}, stdout=out
        )
    timed_out = returncode is None
    cases = _cases(record)
    record.unlink(missing_ok=True)
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    return dict(
        command=" ".join(cmd[2:]),
        returncode=returncode,
        timed_out=timed_out,
        limit_s=limit_s,
        wall_s=round(time.perf_counter() - start, 1),
        counts=counts,
        cases=cases,
        log=log.name,
        log_tail=log.read_text()[-3000:],
    )


def run_bench(limit_s: float) -> dict[str, Any]:
    """``bench/gpu.py`` (quick sizes) in a process of its own; its JSON result."""
    out = Path(tempfile.mkstemp(prefix="gpu_check_bench_", suffix=".json")[1])
    start = time.perf_counter()
    # bench/gpu.py stops its rank itself a little before the limit, and reports what it has
    env = {**_env(), "SHARDWISE_BENCH_DEADLINE": str(time.time() + limit_s - 15)}
    cmd = [sys.executable, str(BENCH / "gpu.py"), "--out", str(out)]
    returncode, err = _run(cmd, limit_s, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    text = out.read_text()
    out.unlink(missing_ok=True)
    if text.strip():
        result = json.loads(text)
    elif returncode is None:
        result = dict(status="error", error=f"bench/gpu.py ran past its {limit_s:.0f} s limit")
    else:
        result = dict(status="error", error=f"bench/gpu.py exited with {returncode}: {err[-3000:]}")
    result["check_wall_s"] = round(time.perf_counter() - start, 1)
    return result


#: The figures every bench result holds (None where the dry run cannot measure them).
FIGURES = (
    "step_s",
    "tflops",
    "step_ratio",
    "mfu",
    "peak_memory_gib",
    "peak_memory_ratio",
    "checkpoint_runs_s",
    "async_blocking_ratio",
    "met",
)
#: The figures a dry run cannot measure (no GPU memory; no peak FLOP/s for a CPU).
NOT_ON_CPU = ("mfu", "peak_memory_ratio")


def missing_figures(bench: dict[str, Any]) -> list[str]:
    """Figures the bench result lacks (measurable ones that are None count as lacking)."""
    skip = NOT_ON_CPU if bench.get("dry_run") else ()
    return [k for k in FIGURES if k not in bench or (bench[k] is None and k not in skip)]


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        cuda_available=torch.cuda.is_available(),
        cpus=os.cpu_count(),
        os=f"{platform.system()} {platform.release()}",
    )
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            device=torch.cuda.get_device_name(0),
            device_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            devices=torch.cuda.device_count(),
        )
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            info["driver"] = smi.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            info["driver"] = None
    else:
        info["device"] = "CPU (dry run)"
    return info


def check(out: Path) -> dict[str, Any]:
    """Run both parts; write ``out`` (JSON), ``out.md`` and ``out.pytest.log``; return it."""
    import torch

    dry = os.environ.get(ON_CPU) == "1"
    if not torch.cuda.is_available() and not dry:
        raise SystemExit(
            "no CUDA device here: make gpu-check needs one GPU; SHARDWISE_GPU_CHECK_ON_CPU=1 "
            "runs its CPU dry run instead"
        )
    start = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = dict(dry_run=dry, machine=machine())
    print(f"gpu-check: {result['machine']['device']}, torch {torch.__version__}", flush=True)
    result["tests"] = run_tests(out.with_suffix(".pytest.log"), TESTS_LIMIT_S)
    print(
        f"gpu-check: tests {result['tests']['counts']} in {result['tests']['wall_s']} s", flush=True
    )
    result["bench"] = run_bench(BENCH_LIMIT_S)
    print(
        f"gpu-check: bench {result['bench'].get('status')} in {result['bench']['check_wall_s']} s",
        flush=True,
    )
    tests, bench = result["tests"], result["bench"]
    result["missing_figures"] = missing_figures(bench) if bench.get("status") == "ok" else None
    result["ok"] = bool(
        tests["returncode"] == 0
        and tests["counts"]["failed"] == 0
        and tests["counts"]["passed"] > 0
        and bench.get("status") == "ok"
        and not result["missing_figures"]
    )
    result["wall_s"] = round(time.perf_counter() - start, 1)
    out.write_text(json.dumps(result, indent=2, default=str))
    out.with_suffix(".md").write_text(render(result))
    return result


# ----------------------------------------------------------------------------- rendering
def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _num(x: float | None, fmt: str = "{:.3f}") -> str:
    return "–" if x is None else fmt.format(x)


def _met(value: bool | None) -> str:
    return {True: "yes", False: "**no**", None: "–"}[value]


def render(result: dict[str, Any]) -> str:
    """The GPU section of bench/RESULTS.md (heading included)."""
    m, tests, bench = result["machine"], result["tests"], result["bench"]
    counts = tests["counts"]
    lines = [SECTION, ""]
    if result["dry_run"]:
        lines += [
            "**CPU dry run: a check of the script, not figures.**",
            "",
        ]
    device = m["device"] + (
        f" ({m['device_memory_gib']} GiB, driver {m.get('driver')})"
        if "device_memory_gib" in m
        else ""
    )
    lines += [
        f"Taken by `make gpu-check` (`bench/gpu_check.py`) on {m['date']}: {device}, torch "
        f"{m['torch']} (CUDA {m['cuda']}), Python {m['python']}, {m['cpus']} CPUs; "
        f"{result['wall_s']} s in all. Raw data: `bench/gpu_check_results.json`.",
        "",
        f"**Test cases marked `gpu`** (`{tests['command']}`, {tests['wall_s']} s): "
        f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped"
        + (" — **the run hit its time limit**" if tests["timed_out"] else "")
        + ".",
        "",
        "| case | outcome | s |",
        "|---|---|---|",
    ]
    for case in tests["cases"]:
        outcome = case["outcome"] if case["outcome"] == "passed" else f"**{case['outcome']}**"
        if case["outcome"] == "skipped" and case["reason"]:
            outcome += f" ({case['reason']})"
        lines.append(f"| `{case['case']}` | {outcome} | {case['seconds']:.1f} |")
    lines.append("")
    if bench.get("status") != "ok":
        lines += [
            f"**bench/gpu.py: {bench.get('status')}**",
            "",
            "```",
            str(bench.get("error") or bench.get("reason"))[-2000:],
            "```",
            "",
        ]
        if "step_s" not in bench:  # the MFU part's figures survive a failed checkpoint part
            return "\n".join(lines)
    size = bench["size"]
    mfu = bench.get("mfu") or {}
    peak = bench.get("peak_memory_gib") or {}
    lines += [
        f"**MFU** (`bench/gpu.py`): GPT of {bench['params'] / 1e9:.2f}B parameters "
        f"({size['n_layer']} layers, d={size['n_embd']}, {size['n_head']} heads), batch "
        f"{bench['batch']}×{size['block_size']} tokens, bf16 parameters with fp32 gradient "
        "reduction, AdamW, one GPU. shardwise: `FSDPStrategy` (`mixed_precision=dict("
        "param_dtype='bf16', reduce_dtype='fp32')`, meta-device init); raw: `fully_shard` on "
        "each block and the root with the same `MixedPrecisionPolicy`, torch's AdamW; steps "
        "interleaved (ABBA) in the same process, medians. Model FLOPs per token 6N + 12LdT "
        f"(PaLM); peak {_num(bench.get('peak_tflops'), '{:.0f}')} TFLOP/s dense bf16"
        + (f" ({bench['peak_note']})" if bench.get("peak_note") else "")
        + ". Peak memory: `torch.cuda.max_memory_allocated` while each contender is built "
        "and takes two steps, above what was allocated before it.",
        "",
        "| contender | step (s) | TFLOP/s | MFU | peak GPU memory (GiB) |",
        "|---|---|---|---|---|",
    ]
    for name in ("shardwise", "raw"):
        lines.append(
            f"| {name} | {bench['step_s'][name]:.4f} | {bench['tflops'][name]:.1f} | "
            f"{_pct(mfu.get(name))} | {_num(peak.get(name), '{:.2f}')} |"
        )
    if "checkpoint_runs_s" not in bench:
        return "\n".join([*lines, ""])
    runs = bench["checkpoint_runs_s"]
    best = {k: min(v) for k, v in runs.items()}
    met = bench.get("met") or {}
    lines += [
        "",
        f"**Checkpoint** ({bench['checkpoint_gb']:.2f} GB of weights and AdamW state, sharded "
        "format from GPU memory; best of "
        f"{len(runs['sync'])}): async save blocked {best['async blocked']:.3f} s (staging into "
        f"pinned host memory), sync save {best['sync']:.3f} s, `torch.save` of the same "
        f"tensors {best['torch.save']:.3f} s.",
        "",
        "| figure | value | target | met |",
        "|---|---|---|---|",
        f"| MFU, shardwise | {_pct(mfu.get('shardwise'))} | ≥ 40 % | {_met(met.get('mfu'))} |",
        f"| step, shardwise / raw `fully_shard` | {_num(bench['step_ratio'])} (paired "
        f"{_num(bench.get('step_ratio_paired'))}) | ≤ 1.02 | {_met(met.get('step_ratio'))} |",
        f"| async save blocking / sync save | {_num(bench['async_blocking_ratio'])} | ≤ 0.05 | "
        f"{_met(met.get('async_blocking_ratio'))} |",
        f"| peak GPU memory, shardwise / raw | {_num(bench.get('peak_memory_ratio'))} | ≤ 1.05 | "
        f"{_met(met.get('peak_memory_ratio'))} |",
        f"| sync save / `torch.save` | {_num(bench.get('sync_vs_torch_save_ratio'))} | – | – |",
        "",
    ]
    return "\n".join(lines)


def render_into(results_md: Path, results: Path, allow_dry_run: bool = False) -> None:
    """Replace the GPU section of ``results_md`` (from its heading to the next ``## ``) with
    the rendering of ``results``; a dry run's results are refused (they are not figures)."""
    result = json.loads(results.read_text())
    if result["dry_run"] and not allow_dry_run:
        raise SystemExit(f"{results} holds a CPU dry run, not figures; not rendered")
    text = results_md.read_text()
    if SECTION not in text:
        raise SystemExit(f"{results_md} has no '{SECTION}' heading to replace")
    head, rest = text.split(SECTION, 1)
    tail = rest[rest.find("\n## ") + 1 :] if "\n## " in rest else ""
    results_md.write_text(head + render(result) + ("\n" + tail if tail else ""))
    print(f"rendered {results} into {results_md}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        type=Path,
        help="the results file (default bench/gpu_check_results.json; a dry run's default is "
        "in the temporary directory)",
    )
    parser.add_argument("--render-into", type=Path, help="render --results into this file")
    parser.add_argument("--results", type=Path, default=BENCH / "gpu_check_results.json")
    parser.add_argument("--allow-dry-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.render_into:
        render_into(args.render_into, args.results, args.allow_dry_run)
        return
    default = (
        Path(tempfile.gettempdir()) / "shardwise_gpu_check_dry_run.json"
        if os.environ.get(ON_CPU) == "1"
        else BENCH / "gpu_check_results.json"
    )
    out = (args.out or default).absolute()
    result = check(out)
    print(out.with_suffix(".md").read_text())
    print(f"gpu-check: {'ok' if result['ok'] else 'FAILED'}; results in {out}")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
